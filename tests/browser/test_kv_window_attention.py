"""Window layers' attention kernels on WebGPU (SwiftShader here; tests/native/test_window_attention_native.py on
lavapipe) against ref_attention's window references: both kernel families, decode and prefill, f32 and packed-f16
caches, heads 64 and 256 wide (the cpu family's paged_attention_narrow and _wide variants, the gpu family's 8-row
prefill).
Keys with p_q - p_k >= window are masked, and every block wholly before a sequence's window is a NaN block in the
GPU's table (kv_cases.poisoned: a released block's placeholder), which no kernel may read. Decode contexts span
several 32-token partitions, some wholly before the window; prefill chunks start within and past their windows.
"""
from __future__ import annotations

import pytest
from test_kv_kernels import DECODE_MAX_ABS, DECODE_REL, PREFILL_MAX_ABS, PREFILL_REL, page, run  # noqa: F401

FAMILY = pytest.mark.parametrize("family", ["cpu", "gpu"])
DTYPE = pytest.mark.parametrize("dtype", ["f32", "f16"])



@FAMILY
@DTYPE
def test_window_decode_matches_the_reference_and_reads_no_block_before_the_window(page, family, dtype):
    calls = [f"decode_case(5, [100, 37, 5, 160], 16, {dtype!r}, 8, 2, 64, partition_tokens=32, family={family!r},"
             " window=32)",
             f"decode_case(6, [300, 49], 16, {dtype!r}, 4, 1, 256, partition_tokens=32, family={family!r}, window=48)"]
    for call, r in zip(calls, run(page, calls)):
        assert r["partitions"] > 1 and r["dispatches"] == 2, (call, r)
        assert r["max_abs"] <= DECODE_MAX_ABS and r["rel"] <= DECODE_REL, (call, r)


@FAMILY
@DTYPE
def test_window_prefill_matches_the_reference_and_reads_no_block_before_the_window(page, family, dtype):
    calls = [f"prefill_case(7, [(60, 40), (0, 50), (17, 3)], 16, {dtype!r}, 8, 2, 64, family={family!r}, window=24)",
             f"prefill_case(8, [(90, 21)], 16, {dtype!r}, 4, 1, 256, family={family!r}, window=40)"]
    for call, r in zip(calls, run(page, calls)):
        assert r["max_abs"] <= PREFILL_MAX_ABS and r["rel"] <= PREFILL_REL, (call, r)
