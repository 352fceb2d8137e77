"""The synthetic GGUF generator (pagedkv.model.synthetic) at its tiny preset: the file the converter loads, its
random Q4_K blocks, a finite forward (the GPU ledger's split of it: bench/tests/test_model_ledger.py)."""
from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache, greedy_reference
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
