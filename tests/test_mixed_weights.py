"""A model mixing weight types per tensor (tiny.MIXED_DTYPES): it loads bit-identically to gguf's dequantization
of the same blocks, and the numpy reference (f32) agrees with a float64 forward over those weights."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache, greedy_reference
from pagedkv.model.quants import WEIGHT_TYPES, to_gguf, unpack
from pagedkv.model.tiny import MIXED_DTYPES, mixed_config, write_tiny_model
from pagedkv.model.weights import ModelWeights, expected_shapes, tensor_parts
from pagedkv.model_runner import ForwardBatch

PROMPTS = [[5, 9, 200, 31, 7], list(range(40, 63))]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed") / "tiny-mixed"
    write_tiny_model(out, seed=0, dtypes=MIXED_DTYPES, config=mixed_config())
    return ModelWeights.load(out), out


def test_mixed_model_has_every_quantized_type_and_loads_like_gguf(mixed):
    weights, out = mixed
    tensors = weights.manifest["tensors"]
    assert {name: tensors[name]["dtype"] for name in MIXED_DTYPES} == MIXED_DTYPES
    assert {t["dtype"] for t in tensors.values()} == {name for name, t in WEIGHT_TYPES.items() if t.quantized} | {"f32"}
    shards = {s["file"]: (out / s["file"]).read_bytes() for s in weights.manifest["shards"]}
    for name, shape in expected_shapes(weights.config).items():
        entry = tensors[name]
        if entry["dtype"] == "f32":
            continue
        parts = tensor_parts(entry, shards[entry["file"]])
        raw = to_gguf(entry["dtype"], unpack(entry["dtype"], shape, parts))  # the GGUF blocks the parts hold
        want = gguf_dequantize(raw, gguf.GGMLQuantizationType[WEIGHT_TYPES[entry["dtype"]].gguf]).reshape(shape)
        assert np.array_equal(weights.tensors[name].view(np.uint32), want.view(np.uint32)), name


def test_numpy_reference_equals_a_float64_forward_on_mixed_weights(mixed):
    """Same greedy ids; logits within 1e-4 of max |logit| (f32 vs f64 rounding over 2 layers) [measured ~1e-6]."""
    weights, _ = mixed
    f64 = replace(weights, tensors={k: v.astype(np.float64) for k, v in weights.tensors.items()})
    ref, wide = NumpyModel(weights), NumpyModel(f64)
    for prompt in PROMPTS:
        assert greedy_reference(ref, prompt, 8) == greedy_reference(wide, prompt, 8)
    ids = np.asarray(PROMPTS[1], np.int32)
    a, b = (greedy_logits(m, ids) for m in (ref, wide))
    assert a.dtype == np.float32 and b.dtype == np.float64
    assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()
    assert len(set(np.argmax(a, axis=1).tolist())) > 1  # the model is not degenerate: different tokens win


def greedy_logits(model: NumpyModel, ids: np.ndarray) -> np.ndarray:
    """(T, vocab) logits of every position of one prefill."""
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    kv = PagedKVCache.allocate(model.config, 4, 16)
    n = len(ids)
    batch = ForwardBatch(i32(ids), i32(range(n)), i32(range(n)), i32([0, n]), i32([[0, 1, 2, 3]]), i32([n]))
    return model.forward(batch, kv, all_logits=True)
