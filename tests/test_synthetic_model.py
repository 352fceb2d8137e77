"""The synthetic GGUF generator (pagedkv.model.synthetic) at its tiny preset: the file the converter loads, its
random Q4_K blocks, the GPU ledger's split (bench/model_ledger.py) and the page's refusal, a finite forward."""
from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from bench.model_ledger import model_ledger
from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache, greedy_reference
from pagedkv.gpu_budget import MIB
from pagedkv.model.convert import convert_cached, open_gguf
from pagedkv.model.config import ModelConfig
from pagedkv.model.synthetic import F16_MIN_NORMAL, PRESETS, random_q4_k, write_synthetic_gguf
from pagedkv.model.weights import ModelWeights, read_manifest
from pagedkv.model_runner import ForwardBatch

TINY = PRESETS["tiny"]  # 2 layers, hidden 256, 4 heads of 64 over 2 KV heads, ffn 512, vocab 512


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("synthetic") / "tiny.gguf"
    write_synthetic_gguf(path, "tiny", seed=0)
    return path


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_and_every_matrix_q4_k(tiny_gguf, tmp_path):
    again, other = tmp_path / "again.gguf", tmp_path / "other.gguf"
    write_synthetic_gguf(again, "tiny", seed=0)
    write_synthetic_gguf(other, "tiny", seed=1)
    assert sha(again) == sha(tiny_gguf) != sha(other)
    types = {t.name: t.tensor_type.name for t in open_gguf(tiny_gguf).tensors}
    assert len(types) == 2 * 9 + 2
    assert {n for n, t in types.items() if t == "F32"} == {
        "output_norm.weight", *(f"blk.{i}.{k}_norm.weight" for i in range(2) for k in ("attn", "ffn"))}
    assert set(types.values()) == {"F32", "Q4_K"}
    config = ModelConfig.from_json(read_manifest(convert_cached(tiny_gguf, tmp_path / "models"))["config"])
    assert config == replace(TINY, rms_eps=float(np.float32(TINY.rms_eps)))  # GGUF stores the eps in f32


def test_random_q4_k_scales_are_normal_f16_around_the_fan_in_scale():
    blocks = random_q4_k(np.random.default_rng(3), 64, 8192).reshape(-1, 144)  # (blocks, 144)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)
    dmin = blocks[:, 2:4].copy().view(np.float16)[:, 0]
    assert d.min() >= F16_MIN_NORMAL and d.max() <= 1.5 * F16_MIN_NORMAL  # 1 / (257 sqrt(8192)) < 2^-14
    assert np.array_equal(dmin, (7.5 * d).astype(np.float16))
    with pytest.raises(ValueError, match="multiple of 256, got 576"):
        random_q4_k(np.random.default_rng(0), 4, 576)


def test_ledger_weights_are_the_file_bytes_plus_the_stacked_norms(tiny_gguf, tmp_path):
    ledger = model_ledger(tiny_gguf, budget_bytes=16 * MIB, cache=tmp_path, refusal_mib=(4,))
    # q4_K's web parts (qs 128 + sc 16 bytes a block) are the GGUF block's 144; attn_norm / ffn_norm are also
    # uploaded after the stacked q|k|v and gate|up codes (their matvec fuses the norm)
    assert ledger["gguf_tensor_bytes"] == 742_400
    assert ledger["weights_bytes"] == 742_400 + 2 * 2 * 256 * 4 == 746_496
    assert (ledger["scratch_bytes"], ledger["staging_bytes"]) == (2_635_024, 561_152)
    assert ledger["bytes_per_token"] == 2 * 2 * 2 * 64 * 2  # K and V, 2 layers, 2 KV heads of 64, f16
    assert (ledger["num_blocks"], ledger["kv_bytes"]) == (783, 783 * 16 * 1024)
    assert ledger["fixed_bytes"] + ledger["kv_bytes"] + ledger["unused_bytes"] == 16 * MIB
    assert 0 <= ledger["unused_bytes"] < ledger["block_bytes"]
    assert ledger["refusals"] == {"4 MiB": (
        "tiny.gguf does not fit the GPU budget: needs 5 MiB, budget 4 MiB (weights, scratch and staging 3.8 MiB "
        "+ a KV pool of 256 tokens in f16 0.2 MiB); raise the budget in Memory settings or pick a smaller model")}


def test_numpy_forward_of_the_tiny_file_is_finite(tiny_gguf, tmp_path):
    model = NumpyModel(ModelWeights.load(convert_cached(tiny_gguf, tmp_path)))
    ids = greedy_reference(model, [1, 40, 41, 42], 4)
    assert len(ids) == 4 and all(0 <= i < TINY.vocab for i in ids)
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    prompt = list(range(3, 35))
    batch = ForwardBatch(i32(prompt), i32(range(32)), i32(range(32)), i32([0, 32]), i32([[0, 1]]), i32([32]))
    logits = model.forward(batch, PagedKVCache.allocate(TINY, 2, 16), all_logits=True)  # (32, vocab)
    assert np.isfinite(logits).all()
    # not collapsed, not exploding: the fan-in scale keeps logits near unit spread
    assert 0.3 < float(logits.std(axis=1).min()) and float(logits.std(axis=1).max()) < 5.0
