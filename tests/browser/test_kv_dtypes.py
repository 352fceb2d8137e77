"""Quantized KV caches (int8, fp8-e4m3, int4, int4-asym) on real WebGPU (SwiftShader here) against pagedkv.kv.dtypes.

kv_write's quantizer must equal numpy's bit for bit (every u32 of every written token: codes, scales and
padding), including rows of zeros, denormal rows, exact .5 ties and outlier channels (kvq_cases.hard_rows).
Attention reads the packed cache and dequantizes in registers; the float64 reference reads the same words
through numpy's dequantizer, so the bounds below measure only the kernels' f32 arithmetic, as for f32/f16.
Cases run in the page's worker (tests/browser/kvq_cases.py, on top of kv_cases.py's helpers).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from browser_pages import open_app

HERE = Path(__file__).parent
QUANTIZED = ("int8", "fp8-e4m3", "int4", "int4-asym")
# Same bounds as the f32 / f16 kernels (test_kv_kernels.py): the math after dequantization is unchanged.
DECODE_MAX_ABS, DECODE_REL = 3e-6, 1e-5
PREFILL_MAX_ABS, PREFILL_REL = 5e-6, 5e-6
SMOLLM2 = (9, 3, 64)  # n_heads, n_kv_heads, head_dim (int8 / int4: two 32-channel scale groups per row)
SMALL = (4, 2, 16)  # head_dim 16: one scale per row for every dtype
# Chromium runs SmolLM2's heads; the small heads' cases run under tests/native only (wgpu-py; the same kernels
# through a second WGSL compiler), which keeps the browser suite inside its time.
HEADS = [SMOLLM2, pytest.param(SMALL, marks=pytest.mark.native_matrix)]


@pytest.fixture(scope="module")
def page(ready_page):
    engine_cases = (HERE / "engine_cases.py").read_text()
    ready_page.py(
        "import json, sys, types\n"
        "_mod = types.ModuleType('engine_cases')\n"
        f"exec(compile({json.dumps(engine_cases)}, 'engine_cases.py', 'exec'), _mod.__dict__)\n"
        "sys.modules['engine_cases'] = _mod\n"
        + (HERE / "kv_cases.py").read_text() + "\n" + (HERE / "kvq_cases.py").read_text() + "\nNone")
    return ready_page


def run(page, calls: list[str]) -> list:
    return page.py("import json\njson.dumps([" + ", ".join(f"await {c}" for c in calls) + "])")


def test_kv_write_quantizes_bit_for_bit_like_numpy(page):
    calls = [f"kvq_write_case({seed}, [4, {bs + 5}, {2 * bs - 1}], {bs}, {dtype!r}, {n_kv}, {d})"
             for seed, bs in enumerate((8, 16, 32)) for dtype in QUANTIZED for _, n_kv, d in (SMOLLM2, SMALL)]
    results = run(page, calls)
    for call, r in zip(calls, results):
        assert (r["k_mismatch"], r["v_mismatch"], r["untouched_equal"]) == (0, 0, True), (call, r)
    # u32s per token: int8 3 x 16 + 6 scales -> 56 | fp8 3 x 16 + 3 -> 52 | int4 / int4-asym 3 x 8 + 6 -> 32;
    # head_dim 16, 2 kv heads: int8 2 x 4 + 2 -> 12 | fp8 12 | int4 / int4-asym 2 x 2 + 2 -> 8.
    assert [r["words_per_token"] for r in results[:8]] == [56, 12, 52, 12, 32, 8, 32, 8]
    assert [r["tokens"] for r in results[:8]] == [4 + 13 + 15] * 8


@pytest.mark.parametrize("family", ["cpu", "gpu", "gpu-sg"])  # kv_cases.FAMILIES: whose decode attention
@pytest.mark.parametrize("heads", HEADS, ids=["gqa9-3-d64", "gqa4-2-d16"])
def test_paged_decode_over_quantized_cache_matches_reference(page, heads, family):
    n_heads, n_kv, d = heads
    calls = [f"kvq_decode_case({seed}, [1, {bs - 1}, {3 * bs + 5}, 200, 97], {bs}, {dtype!r}, {n_heads}, {n_kv}, {d},"
             f" partition_tokens=512, family={family!r})" for seed, bs in enumerate((8, 16, 32)) for dtype in QUANTIZED]
    # 32-token partitions: the split + merge pass over a quantized cache too.
    calls += [f"kvq_decode_case({10 + i}, [300, 17, 129, 64], 16, {dtype!r}, {n_heads}, {n_kv}, {d},"
              f" partition_tokens=32, family={family!r})" for i, dtype in enumerate(QUANTIZED)]
    for call, r in zip(calls, run(page, calls)):
        assert r["max_abs"] <= DECODE_MAX_ABS and r["rel"] <= DECODE_REL, (call, r)
        assert r["ref_consistent"] is True, call
        assert r["shape"] == [5 if "200" in call else 4, n_heads, d], call


@pytest.mark.parametrize("family", ["cpu", "gpu"])  # whose prefill attention
@pytest.mark.parametrize("heads", HEADS, ids=["gqa9-3-d64", "gqa4-2-d16"])
def test_paged_prefill_over_quantized_cache_matches_reference(page, heads, family):
    n_heads, n_kv, d = heads
    chunks = "[(37, 11), (0, 21), (50, 1), (9, 40)]"
    calls = [f"kvq_prefill_case({seed}, {chunks}, {bs}, {dtype!r}, {n_heads}, {n_kv}, {d}, family={family!r})"
             for seed, bs in enumerate((8, 16, 32)) for dtype in QUANTIZED]
    for call, r in zip(calls, run(page, calls)):
        assert r["max_abs"] <= PREFILL_MAX_ABS and r["rel"] <= PREFILL_REL, (call, r)
        assert r["shape"] == [11 + 21 + 1 + 40, n_heads, d], call


def test_copy_blocks_and_swaps_move_quantized_blocks_with_their_scales(page):
    calls = [f"kvq_copy_swap_case({seed}, {dtype!r}, {bs}, [[7, 2], [0, 9], [11, 4]], [5, 2, 9, 11], [0, 7, 3, 2])"
             for seed, (dtype, bs) in enumerate([("int8", 8), ("fp8-e4m3", 16), ("int4", 32), ("int4-asym", 16)])]
    results = run(page, calls)
    for call, r in zip(calls, results):
        assert (r["copy_equal"], r["swap_out_equal"], r["swap_in_equal"]) == (True, True, True), call
    assert [r["out_shape"] for r in results] == [[4, 8, 56], [4, 16, 52], [4, 32, 32], [4, 16, 32]]
    assert {r["out_dtype"] for r in results} == {"uint32"}


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
def test_tiny_greedy_with_quantized_kv_equals_cpu_engine(page, kv_dtype):
    r = page.py(f"import json\njson.dumps(await kvq_tiny_greedy(16, {kv_dtype!r}))")
    assert r["gpu"] == r["cpu"], r
    assert [len(o) for o in r["gpu"]] == [10, 10, 10, 10]
    assert r["engine_kv_dtype"] == kv_dtype
    # tiny model: 2 layers, 2 kv heads of 16 -> per token and layer int8 / fp8 48 B, int4(-asym) 32 B, K and V
    per_token = {"int8": 2 * 2 * 48, "fp8-e4m3": 2 * 2 * 48, "int4": 2 * 2 * 32, "int4-asym": 2 * 2 * 32}[kv_dtype]
    assert r["backend"]["kv_dtype"] == kv_dtype and r["backend"]["bytes_per_token"] == per_token


def test_app_boots_with_int4_asym_from_the_url_and_shows_its_bytes(browser, base_url):
    booted, info = open_app(browser, base_url + "?model=tiny-random&backend=webgpu&budget_mib=64&kv_dtype=int4-asym",
                            120_000)
    try:
        assert (info["backend"], info["kv_dtype"], info["bytes_per_token"]) == ("webgpu", "int4-asym", 2 * 2 * 32)
        assert booted.page.locator("#mem-kv-dtype").input_value() == "int4-asym"
        assert "128 B (int4-asym)" in booted.page.locator("#memory-facts").inner_text()
    finally:
        booted.page.close()
