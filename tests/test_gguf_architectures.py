"""llama / qwen2 GGUFs made at test time (tests/gguf_models.py): conversion, and greedy ids equal to llama.cpp's
on the CPU (numpy) backend under the near-tie rule; refused architectures, rope types and tensors are named."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_models import TINY, llama3_factors, requantized_smollm2, tiny_gguf
from llama_reference import agreement, llama_cpp_greedy, near_tie
from model_fixtures import ROOT, gguf_path  # noqa: F401  (pytest fixture)

from pagedkv.backends.numpy_ref import NumpyModel
from pagedkv.chat import ChatTemplate, Conversation
from pagedkv.kernels.ref_ops import model_inv_freq, rope_adjacent, rope_inv_freq
from pagedkv.model.convert import _adjacent_pair_rows, convert_cached, convert_gguf
from pagedkv.model.weights import ModelWeights
from pagedkv.tokenizer import Tokenizer

MODELS = ROOT / ".cache" / "models"
NUM_TOKENS = 16
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def prompt_ids(weights: ModelWeights) -> list[int]:
    tok = Tokenizer.from_manifest(weights.manifest)
    return Conversation(tok, ChatTemplate.from_manifest(weights.manifest, tok), MESSAGES).prompt_ids()


def check_against_llama_cpp(path: Path) -> dict:
    weights = ModelWeights.load(convert_cached(path, MODELS))
    prompt = prompt_ids(weights)
    ref = llama_cpp_greedy(path, prompt, NUM_TOKENS)
    result = agreement(NumpyModel(weights), prompt, ref)
    print(path.name, result)  # the per-file agreement the closing note reports (pytest -s)
    greedy = result["greedy"]
    assert greedy["equal"] or near_tie(greedy["margin"]), (path.name, greedy)
    assert all(near_tie(m["margin"]) for m in result["teacher_forced_mismatches"]), (path.name, result)
    return result


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_model_greedy_ids_match_llama_cpp(gguf_path, name):  # noqa: F811
    check_against_llama_cpp(tiny_gguf(name, gguf_path))


def test_smollm2_requantized_to_q8_0_matches_llama_cpp(gguf_path):  # noqa: F811
    path = requantized_smollm2(gguf_path, "Q8_0")
    manifest = convert_gguf(path, MODELS / "smollm2-135m-q8_0")
    assert {t["dtype"] for t in manifest["tensors"].values()} == {"q8_0", "f32"}
    check_against_llama_cpp(path)


def test_configs_honour_the_metadata(gguf_path):  # noqa: F811
    configs = {name: ModelWeights.load(convert_cached(tiny_gguf(name, gguf_path), MODELS)).config for name in TINY}
    qwen = configs["tiny-qwen2"]
    assert (qwen.architecture, qwen.attention_bias, qwen.n_kv_heads, qwen.head_dim, qwen.tied_embeddings,
            qwen.rope_base, qwen.rms_eps, qwen.context_length) == ("qwen2", True, 1, 64, False, 1e6,
                                                                 float(np.float32(1e-6)), 2048)
    assert configs["tiny-llama"].tied_embeddings and not configs["tiny-llama"].attention_bias
    llama3 = configs["tiny-llama3-rope"]
    want = llama3_factors(64, 500000.0, **TINY["tiny-llama3-rope"]["llama3"])
    assert llama3.rope_freq_factors == tuple(float(f) for f in want) and llama3.rope_freq_factors[-1] == 8.0
    assert configs["tiny-llama-linear"].rope_freq_scale == 0.25
    np.testing.assert_array_equal(model_inv_freq(configs["tiny-llama-linear"]), rope_inv_freq(64, 1e4, 0.25))


def test_neox_rows_permuted_to_adjacent_pairs_give_the_same_scores():
    """qwen2's rope rotates (i, i + d/2); the converter's row order makes it adjacent pairs with equal q . k."""
    rng = np.random.default_rng(0)
    heads, hd, pos = 2, 8, np.array([0, 5, 17], np.int32)
    q, k = rng.standard_normal((2, 3, heads, hd)).astype(np.float32)  # (T, heads, head_dim) each
    inv = rope_inv_freq(hd, 10000.0)
    angles = pos[:, None, None] * np.concatenate([inv, inv])[None, None, :]  # (T, 1, head_dim)

    def neox(x):  # llama.cpp's NEOX rope: rotate the halves
        half = np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], axis=-1)
        return x * np.cos(angles) + half * np.sin(angles)

    rows = _adjacent_pair_rows(heads, hd)
    assert rows.tolist()[:8] == [0, 4, 1, 5, 2, 6, 3, 7] and rows.tolist()[8:10] == [8, 12]
    permuted = lambda x: x.reshape(3, -1)[:, rows].reshape(x.shape)  # noqa: E731
    want = np.einsum("thd,shd->hts", neox(q), neox(k))
    got = np.einsum("thd,shd->hts", rope_adjacent(permuted(q), pos, inv), rope_adjacent(permuted(k), pos, inv))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def _edit(src: Path, dst: Path, *, arch: str | None = None, drop=(), add_kv=(), add_tensors=()) -> Path:
    """A copy of the GGUF src with its architecture renamed, keys dropped / added, tensors added."""
    reader = gguf.GGUFReader(src)
    old = reader.fields["general.architecture"].contents()
    arch = arch or old
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key.replace(f"{old}.", f"{arch}.", 1), field.contents(), vtype, sub_type=sub)
    for key, value, vtype in add_kv:
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, data in add_tensors:
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.mark.parametrize("edit,message", [
    ({"arch": "phi3"}, r"x.gguf: unsupported architecture 'phi3'; supported: \['gemma3', 'llama', 'qwen2', 'qwen3', 'smollm3'\]"),
    ({"add_kv": [("llama.rope.scaling.type", "yarn", gguf.GGUFValueType.STRING)]},
     r"x.gguf: unsupported rope scaling type 'yarn'; supported: none, linear, and Llama 3's frequency factors"),
    ({"drop": ["llama.rope.dimension_count"], "add_kv": [("llama.rope.dimension_count", 32, gguf.GGUFValueType.UINT32)]},
     r"x.gguf: llama.rope.dimension_count is 32, but the head size is 64; only full-width heads"),
    ({"add_tensors": [("blk.0.attn_output.bias", np.zeros(256, np.float32))]},
     r"x.gguf: llama model has tensors this loader does not know: \['blk.0.attn_output.bias'\]"),
])
def test_unsupported_gguf_features_are_named(gguf_path, tmp_path, edit, message):  # noqa: F811
    bad = _edit(tiny_gguf("tiny-llama", gguf_path), tmp_path / "x.gguf", **edit)
    with pytest.raises(ValueError, match=message):
        convert_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_truncated_and_foreign_files_are_named(gguf_path, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match=f"GGUF file {tmp_path / 'none.gguf'} does not exist"):
        convert_cached(tmp_path / "none.gguf", tmp_path / "cache")
    (tmp_path / "notes.gguf").write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(ValueError, match=r"notes.gguf is not a GGUF file: it starts with b'PK\\x03\\x04', not b'GGUF'"):
        convert_cached(tmp_path / "notes.gguf", tmp_path / "cache")
    (tmp_path / "cut.gguf").write_bytes(tiny_gguf("tiny-llama", gguf_path).read_bytes()[:100_000])
    with pytest.raises(ValueError, match=r"cut.gguf: the length of 'tokenizer.ggml.tokens' at offset \d+ is 49,152, but the [\d,]+ bytes left"):
        convert_cached(tmp_path / "cut.gguf", tmp_path / "cache")
    assert not any((tmp_path / "cache").glob("*/model.json"))
