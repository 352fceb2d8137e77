"""Stacking q/k/v and gate/up weights by rows (backends/webgpu/fused.py) is lossless and refuses mismatches."""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv.backends.webgpu.fused import fused_member, stack_rows, stacked_nbytes
from pagedkv.model.layout import dequantize, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0
from pagedkv.model.quants import pack_gguf


def gain(cols: int) -> tuple[str, tuple[int], dict]:
    """The f32 RMSNorm weight that follows the stacked codes."""
    return "f32", (cols,), {"data": np.arange(cols, dtype="<f4").tobytes()}


def member(dtype: str, rows: int, cols: int, seed: int) -> tuple[str, tuple[int, int], dict]:
    w = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)  # (rows, cols)
    if dtype in ("f32", "f16", "bf16"):  # bf16: the high halves of w
        raw = {"f32": w, "f16": w.astype("<f2"), "bf16": (w.view("<u4") >> 16).astype("<u2")}[dtype]
        return dtype, (rows, cols), pack_gguf(dtype, raw, (rows, cols))
    parts = pack_q4_1(*quantize_q4_1(w)) if dtype == "q4_1" else pack_q8_0(*quantize_q8_0(w))
    return dtype, (rows, cols), parts


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0"])
def test_stacked_rows_dequantize_to_the_members_rows(dtype):
    # 3 and 5 rows of one block: q8_0 scales are 6 and 10 bytes, padded to 8 and 12 in each member.
    members = [member(dtype, 3, 32, 1), member(dtype, 5, 32, 2), member(dtype, 8, 32, 3)]
    got_dtype, shape, parts = stack_rows("blk.0.attn_qkv.weight", members + [gain(32)])
    assert (got_dtype, shape) == (dtype, (16, 32))
    codes = 16 * 16 if dtype == "q4_1" else 16 * 32
    assert {k: len(v) for k, v in parts.items()} == (
        {"qs": codes + 32 * 4, "dm": 16 * 4} if dtype == "q4_1" else {"qs": codes + 32 * 4, "d": 16 * 2})
    want = np.vstack([dequantize(dtype, s, p) for _, s, p in members])  # (16, 32)
    assert np.array_equal(dequantize(dtype, shape, parts), want)
    assert np.array_equal(np.frombuffer(parts["qs"][codes:], "<f4"), np.arange(32))  # the norm weight
    assert stacked_nbytes([(d, s) for d, s, _ in members + [gain(32)]]) == {k: len(v) for k, v in parts.items()}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_float_projections_stack_with_the_norm_weight_after_their_weights(dtype):
    members = [member(dtype, 3, 32, 1), member(dtype, 5, 32, 2), member(dtype, 8, 32, 3)]
    got_dtype, shape, parts = stack_rows("blk.0.attn_qkv.weight", members + [gain(32)])
    size = (4 if dtype == "f32" else 2) * 16 * 32
    assert (got_dtype, shape, {k: len(v) for k, v in parts.items()}) == (dtype, (16, 32), {"data": size + 32 * 4})
    assert np.array_equal(dequantize(dtype, shape, parts), np.vstack([dequantize(dtype, s, p) for _, s, p in members]))
    assert np.array_equal(np.frombuffer(parts["data"][size:], "<f4"), np.arange(32))  # the norm weight
    assert stacked_nbytes([(d, s) for d, s, _ in members + [gain(32)]]) == {"data": size + 32 * 4}


def test_q8_0_scales_stay_padded_to_four_bytes():
    _, shape, parts = stack_rows("s", [member("q8_0", 1, 32, 4), member("q8_0", 2, 32, 5), gain(32)])
    assert shape == (3, 32) and len(parts["d"]) == 8  # 3 f16 scales + 2 bytes of padding
    assert stacked_nbytes([("q8_0", (1, 32)), ("q8_0", (2, 32)), ("f32", (32,))]) == {"qs": 3 * 32 + 128, "d": 8}


def test_members_must_share_dtype_and_cols():
    with pytest.raises(ValueError, match="one dtype and one column count"):
        stack_rows("blk.0.ffn_gate_up.weight", [member("q4_1", 8, 32, 1), member("q8_0", 8, 32, 2), gain(32)])
    with pytest.raises(ValueError, match="one dtype and one column count"):
        stack_rows("blk.0.ffn_gate_up.weight", [member("q4_1", 8, 32, 1), member("q4_1", 8, 64, 2), gain(32)])
    with pytest.raises(ValueError, match=r"norm weight must be f32 \(32,\)"):
        stack_rows("blk.0.ffn_gate_up.weight", [member("q4_1", 8, 32, 1), member("q4_1", 8, 32, 2), gain(64)])
    with pytest.raises(ValueError, match="one dtype and one column count"):  # floats are never promoted
        stack_rows("blk.0.attn_qkv.weight", [member("f16", 2, 32, 1), member("f32", 2, 32, 2), gain(32)])


def test_member_names_map_to_their_stacked_tensor():
    names = ("attn_q", "attn_k", "attn_v", "attn_norm", "ffn_gate", "ffn_up", "ffn_norm")
    assert [fused_member(f"blk.7.{n}.weight") for n in names] == [
        ("blk.7.attn_qkv.weight", 0, 4), ("blk.7.attn_qkv.weight", 1, 4), ("blk.7.attn_qkv.weight", 2, 4),
        ("blk.7.attn_qkv.weight", 3, 4), ("blk.7.ffn_gate_up.weight", 0, 3), ("blk.7.ffn_gate_up.weight", 1, 3),
        ("blk.7.ffn_gate_up.weight", 2, 3)]
    assert [fused_member(n) for n in ("blk.7.attn_output.weight", "blk.7.ffn_down.weight", "token_embd.weight",
                                      "output_norm.weight")] == [None] * 4


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0", "bf16"])
def test_gate_and_up_rows_alternate_in_runs_of_four(dtype):
    gate, up = member(dtype, 8, 64, 6), member(dtype, 8, 64, 7)
    _, shape, parts = stack_rows("blk.2.ffn_gate_up.weight", [gate, up, gain(64)])
    g, u = (dequantize(dtype, m[1], m[2]).reshape(2, 4, 64) for m in (gate, up))  # (runs, 4, cols)
    assert shape == (16, 64)
    assert np.array_equal(dequantize(dtype, shape, parts), np.concatenate([g, u], axis=1).reshape(16, 64))
    with pytest.raises(ValueError, match="one row count, a multiple of 4"):
        stack_rows("blk.2.ffn_gate_up.weight", [member(dtype, 6, 64, 6), member(dtype, 6, 64, 7), gain(64)])

