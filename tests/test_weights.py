"""Web weight layout (pack / dequantize) and the verifying loader."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from model_fixtures import tiny_dir  # noqa: F401  (pytest fixture)

from pagedkv.model.config import ModelConfig
from pagedkv.model.layout import (
    dequantize,
    pack_q4_1,
    pack_q8_0,
    q4_1_codes_from_gguf,
    q8_0_codes_from_gguf,
    quantize_q4_1,
    quantize_q8_0,
)
from pagedkv.model.weights import ModelWeights, WeightsError, check_manifest, expected_shapes, read_manifest


def test_q4_1_packing_is_the_documented_bit_layout():
    codes = np.arange(64, dtype=np.uint8).reshape(2, 32) % 16  # (2, 32)
    d = np.array([[1.0], [0.5]], np.float16)
    m = np.array([[-2.0], [3.0]], np.float16)
    parts = pack_q4_1(codes, d, m)
    words = np.frombuffer(parts["qs"], "<u4").tolist()
    assert words == [0x76543210, 0xFEDCBA98] * 4  # weight k at nibble k % 8 of word k // 8
    assert np.frombuffer(parts["dm"], "<u4").tolist() == [0xC0003C00, 0x42003800]  # low f16 d, high f16 m
    w = dequantize("q4_1", (2, 32), parts)
    assert w[0, :4].tolist() == [-2.0, -1.0, 0.0, 1.0]
    assert w[1, 15] == 3.0 + 0.5 * 15


def test_q8_0_packing_is_the_documented_bit_layout():
    codes = np.arange(-16, 16, dtype=np.int8).reshape(1, 32)
    d = np.array([[0.25]], np.float16)
    parts = pack_q8_0(codes, d)
    assert len(parts["qs"]) == 32 and parts["qs"][:2] == bytes([0xF0, 0xF1])
    assert parts["d"] == bytes([0x00, 0x34, 0, 0])  # f16 0.25, zero-padded to 4 bytes
    assert dequantize("q8_0", (1, 32), parts)[0, :3].tolist() == [-4.0, -3.75, -3.5]


@pytest.mark.parametrize(
    "qtype,split,pack,dtype",
    [
        (GGMLQuantizationType.Q4_1, q4_1_codes_from_gguf, pack_q4_1, "q4_1"),
        (GGMLQuantizationType.Q8_0, q8_0_codes_from_gguf, pack_q8_0, "q8_0"),
    ],
)
def test_repacked_gguf_blocks_dequantize_exactly_like_gguf(qtype, split, pack, dtype):
    w = np.random.default_rng(3).standard_normal((6, 96)).astype(np.float32)
    blocks = gguf_quantize(w, qtype)  # (6, bytes per row) GGUF blocks
    ours = dequantize(dtype, (6, 96), pack(*split(blocks, (6, 96))))
    assert np.array_equal(ours, gguf_dequantize(blocks, qtype).reshape(6, 96))


def test_our_quantizers_are_within_half_a_step():
    w = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    codes, d, m = quantize_q4_1(w)
    err = np.abs(dequantize("q4_1", w.shape, pack_q4_1(codes, d, m)) - w).reshape(4, 2, 32)
    assert np.all(err <= d.astype(np.float32)[:, :, None] * 0.5 + 1e-2)
    codes8, d8 = quantize_q8_0(w)
    err8 = np.abs(dequantize("q8_0", w.shape, pack_q8_0(codes8, d8)) - w).reshape(4, 2, 32)
    assert np.all(err8 <= d8.astype(np.float32)[:, :, None] * 0.5 + 1e-3)


def test_unknown_dtype_and_bad_shape_are_rejected():
    with pytest.raises(ValueError, match="unsupported tensor dtype 'q3_K'"):
        dequantize("q3_K", (1, 256), {"qs": b""})
    with pytest.raises(ValueError, match="cols a multiple of 32"):
        dequantize("q4_1", (1, 30), {"qs": b"", "dm": b""})


def test_tiny_model_loads_and_is_verified(tiny_dir):  # noqa: F811
    weights = ModelWeights.load(tiny_dir)
    assert weights.config.n_layers == 2 and weights.config.vocab == 512
    assert weights.tensors["token_embd.weight"].shape == (512, 64)
    assert weights.tensors["blk.1.ffn_down.weight"].shape == (64, 128)
    manifest = read_manifest(tiny_dir)
    for entry in manifest["tensors"].values():
        assert all(loc["offset"] % 256 == 0 for loc in entry["parts"].values())
    assert {e["dtype"] for e in manifest["tensors"].values()} == {"q8_0", "q4_1", "f32"}


def _copy(tiny_dir, tmp_path):  # noqa: F811
    target = tmp_path / "model"
    shutil.copytree(tiny_dir, target)
    return target


def test_tampered_shard_names_the_shard_and_both_hashes(tiny_dir, tmp_path):  # noqa: F811
    model = _copy(tiny_dir, tmp_path)
    shard = model / "shard-000.bin"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF
    shard.write_bytes(bytes(data))
    expected = read_manifest(model)["shards"][0]["sha256"]
    with pytest.raises(WeightsError, match=f"shard shard-000.bin sha256 mismatch: got [0-9a-f]{{64}}, manifest says {expected}"):
        ModelWeights.load(model)


def test_truncated_and_missing_shards_are_reported(tiny_dir, tmp_path):  # noqa: F811
    model = _copy(tiny_dir, tmp_path)
    shard = model / "shard-000.bin"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(WeightsError, match=f"truncated or padded: {size - 10} bytes, manifest says {size}"):
        ModelWeights.load(model)
    shard.unlink()
    with pytest.raises(WeightsError, match="shard-000.bin is missing"):
        ModelWeights.load(model)
    with pytest.raises(WeightsError, match="no model manifest"):
        ModelWeights.load(tmp_path / "nowhere")


def test_manifest_problems_are_named(tiny_dir):  # noqa: F811
    manifest = read_manifest(tiny_dir)
    bad = json.loads(json.dumps(manifest))
    bad["format_version"] = 99
    with pytest.raises(WeightsError, match="format_version 99 is not supported"):
        check_manifest(bad)
    bad = json.loads(json.dumps(manifest))
    bad["config"]["architecture"] = "mamba"
    with pytest.raises(WeightsError, match="unsupported architecture 'mamba'"):
        check_manifest(bad)
    bad = json.loads(json.dumps(manifest))
    bad["tensors"]["blk.0.attn_q.weight"]["dtype"] = "q3_K"
    with pytest.raises(WeightsError, match="blk.0.attn_q.weight: unsupported dtype 'q3_K'"):
        check_manifest(bad)
    bad = json.loads(json.dumps(manifest))
    bad["tensors"]["blk.0.attn_k.weight"]["shape"] = [64, 64]
    with pytest.raises(WeightsError, match=r"blk.0.attn_k.weight: shape \[64, 64\] does not match config \(expected \[32, 64\]\)"):
        check_manifest(bad)
    bad = json.loads(json.dumps(manifest))
    del bad["tensors"]["blk.1.ffn_up.weight"]
    with pytest.raises(WeightsError, match=r"missing tensors \['blk.1.ffn_up.weight'\]"):
        check_manifest(bad)


def test_model_config_validation():
    good = dict(
        architecture="llama", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128, vocab=512,
        rope_base=1e4, rope_convention="adjacent_pairs", rms_eps=1e-5, context_length=256, tied_embeddings=True,
    )  # fmt: skip
    assert ModelConfig(**good).q_per_kv == 2
    with pytest.raises(ValueError, match="n_heads .4. must be a multiple of n_kv_heads .3."):
        ModelConfig(**{**good, "n_kv_heads": 3})
    with pytest.raises(ValueError, match="unsupported rope convention 'halves'"):
        ModelConfig(**{**good, "rope_convention": "halves"})
    with pytest.raises(ValueError, match="n_layers must be a positive int"):
        ModelConfig(**{**good, "n_layers": 0})
    narrow = ModelConfig(**{**good, "head_dim": 8})  # heads need not tile hidden (Qwen3, Gemma 3)
    assert (narrow.q_dim, narrow.hidden, narrow.family.ops(narrow)) == (32, 64, {"q_width"})
    assert expected_shapes(narrow)["blk.0.attn_q.weight"] == (32, 64)
    assert expected_shapes(narrow)["blk.0.attn_output.weight"] == (64, 32)
    with pytest.raises(ValueError, match="llama has no sliding-window layers, but sliding_window is set"):
        ModelConfig(**{**good, "sliding_window": 512})
    with pytest.raises(ValueError, match="qwen3 has no q / k / v biases, but attention_bias is set"):
        ModelConfig(**{**good, "architecture": "qwen3", "attention_bias": True})
    with pytest.raises(ValueError, match="sliding_window must be a positive int, got 0"):
        ModelConfig(**{**good, "architecture": "gemma3", "sliding_window": 0})


def test_tiny_model_is_deterministic_and_self_consistent(tiny_dir, tmp_path):  # noqa: F811
    from pagedkv.chat import ChatTemplate, Conversation
    from pagedkv.model.tiny import write_tiny_model
    from pagedkv.tokenizer import Tokenizer

    manifest = read_manifest(tiny_dir)
    again = write_tiny_model(tmp_path / "same", seed=0)
    other = write_tiny_model(tmp_path / "other", seed=1)
    assert again["shards"] == manifest["shards"]
    assert other["shards"][0]["sha256"] != manifest["shards"][0]["sha256"]
    spec = manifest["tokenizer"]
    assert (len(spec["tokens"]), len(spec["merges"])) == (512, 253)
    assert spec["tokens"][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert all(m.replace(" ", "") in spec["tokens"] for m in spec["merges"])
    tok = Tokenizer.from_manifest(manifest)
    text = "The cache stores blocks. Ça va? Привет 12345 😀\n\tdef f(x): return x"
    assert tok.decode(tok.encode(text)) == text
    ids = Conversation(tok, ChatTemplate.from_manifest(manifest, tok), [{"role": "user", "content": "hi"}]).prompt_ids()
    assert tok.decode(ids) == (
        "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
