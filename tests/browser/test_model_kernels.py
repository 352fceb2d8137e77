"""The model's WGSL kernels vs their numpy references, in real headless Chromium with real WebGPU.

Inputs are random (seeded) at SmolLM2-135M shapes (hidden 576, ffn 1536, 9 heads / 3 KV heads,
head_dim 64, vocab 49152) plus small odd shapes that exercise the edge handling (rows not a
multiple of the 8-row / 8x4 tiles, hidden smaller than a workgroup). The cases run inside the
page's worker (tests/browser/kernel_cases.py); each test batches its cases into one call. The matvec tests
run every kernel family (FAMILIES): cpu, gpu (subgroup reduction: the page's SwiftShader device has
subgroups, of size 4), gpu_tree (the gpu family's workgroup-memory tree, used where there are none) and
gpu_groups (its matvec in 4 groups of 8 rows a workgroup, ROW_GROUPS, tuned per projection for short rows);
the matmul tests cpu and gpu (tiled through workgroup memory, at prefill sizes up to 130 tokens too).

Every weight type with kernels (model_kernels.QUANTIZED) runs the linear tests; Q4_1 and Q8_0 weights are
quantized random ones, the others random GGUF blocks (all codes, all scale bits), and a K-quant's columns are
the shape's rounded up to a multiple of 256 (576 -> 768).

Error bounds (stated here, asserted below; what SwiftShader gave when written in brackets):
  matvec / matmul, Q4_1 and Q8_0: |gpu - ref| <= 2e-6 * (|x| @ |W|^T) per output,
      the scale of f32 rounding in a dot product [<= 2.5e-7], and <= 1e-5 * max|ref| [<= 1.6e-6]
  the other types: the same bounds, though their kernels sum a * (q . x) + m * sum(x) per block, whose terms
      can exceed |w| |x| [worst at 3072 x 576|768 and 576 x 1536, matvec and matmul: q4_0 3.3e-7 / 1.5e-6,
      q5_0 3.4e-7 / 2.5e-6, q5_1 3.8e-7 / 1.2e-6, q4_K 3.8e-7 / 2.1e-6, q5_K 4.2e-7 / 1.7e-6,
      q6_K 3.6e-7 / 1.9e-6]
  rmsnorm: relative error <= 1e-6 per element [2.5e-7]
  rope: <= 2e-7 * max|ref| [exact: the cos/sin table is built by the reference's own code]
  swiglu (fused into the gate|up matvec / matmul): <= 4e-6 * (first-order bound from the dot products'
      rounding + |result|) per element
  f32 / f16 / bf16 weights (converted to f32 exactly): the Q4_1 / Q8_0 linear and swiglu bounds
  embedding and argmax: exact (argmax ties -> lowest index, as numpy)
  f16 matvec (devices with shader-f16: lavapipe here): <= 2e-3 * (|x| @ |W|^T) per output and
      <= 4e-3 * max|ref| [<= 6.5e-4 and 1.6e-3]
"""
from __future__ import annotations

import pytest

from browser_pages import install_modules
from pagedkv.backends.webgpu.model_kernels import FLOATS, GPU_MATMUL_TYPES  # GPU_MATMUL_TYPES: gpu tiled matmuls

LINEAR_SCALED_BOUND = 2e-6
LINEAR_REL_BOUND = 1e-5
DTYPES = ["q4_1", "q8_0", "q4_0", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"]
RMSNORM_REL_BOUND = 1e-6
ROPE_REL_BOUND = 2e-7
SWIGLU_REL_BOUND = 4e-6
# f16 matvec (lavapipe): x and the codes rounded to f16 (2^-11 relative), f16 dot products of 4 [<= 6.5e-4, 1.6e-3]
F16_SCALED_BOUND = 2e-3
F16_REL_BOUND = 4e-3


@pytest.fixture(scope="module")
def worker(ready_page):
    """The page with kernel_calls.py and kernel_cases.py loaded as modules in its worker."""
    return install_modules(ready_page, "kernel_calls", "kernel_cases")


def run(worker, calls: list[str]) -> list[dict]:
    """Await each `kernel_cases.<call>` in the worker (one crossing for all of them)."""
    body = ", ".join(f"await kc.{c}" for c in calls)
    return worker.py(f"import json, kernel_cases as kc\njson.dumps([{body}])")


def assert_linear(results: list[dict]) -> None:
    for r in results:
        assert r["max_scaled"] <= LINEAR_SCALED_BOUND, r
        assert r["max_rel"] <= LINEAR_REL_BOUND, r


def fit(dtype: str, shapes: list[tuple]) -> list[tuple]:
    """(rows, cols, ...) shapes with cols rounded up to a multiple of the type's block (256 for K-quants)."""
    block = 256 if dtype.endswith("_K") else 32
    return [(r, -(-c // block) * block, *rest) for r, c, *rest in shapes]


SMOLLM2_LINEAR = [(576, 576), (192, 576), (1536, 576), (576, 1536)]
FAMILIES = ["cpu", "gpu", "gpu_tree", "gpu_groups"]
# (kernel, family): the gpu family's matmul has no reduction, so no tree variant
LINEAR_KERNELS = [("matvec", "cpu"), ("matmul", "cpu"), ("matvec", "gpu"), ("matvec", "gpu_tree"),
                  ("matvec", "gpu_groups"), ("matmul", "gpu")]
GPU_MATMUL_TOKENS = (1, 7, 64, 130)  # 130: a partial 32-token tile of matmul_gpu
# (kernel, family, dtype) of every linear kernel that exists
LINEAR_CASES = [(k, f, d) for k, f in LINEAR_KERNELS for d in DTYPES
                if (k, f) != ("matmul", "gpu") or d in GPU_MATMUL_TYPES]
# The fused variants (ACCUMULATE, NORM, SWIGLU) share each type's weight decoding with the plain kernels, which
# Chromium compiles and checks for every type; in Chromium they run for these types, the whole matrix natively
# (tests/native: lavapipe), where the suite's time allows it.
BROWSER_VARIANT_TYPES = ("q4_1", "q8_0", "q4_K", "q6_K")


def variant_cases(cases: list[tuple]) -> list:
    """`cases` (their dtype last) with the types outside BROWSER_VARIANT_TYPES marked native_matrix
    (tests/browser/conftest.py deselects those in Chromium)."""
    return [pytest.param(*c, marks=() if c[-1] in BROWSER_VARIANT_TYPES else pytest.mark.native_matrix)
            for c in cases]


# The grouped matvec (ROW_GROUPS) and the one whose lanes take whole blocks (WHOLE_BLOCKS) share the body and
# every type's decoding with "gpu": in Chromium they run for BROWSER_VARIANT_TYPES, the whole matrix natively.
@pytest.mark.parametrize("dtype,family", [
    pytest.param(d, f, marks=pytest.mark.native_matrix if f in ("gpu_groups", "gpu_whole")
                 and d not in BROWSER_VARIANT_TYPES else ())
    for d in DTYPES for f in [*FAMILIES, "gpu_whole"]])
def test_matvec_matches_reference(worker, dtype, family):
    shapes = [(r, c, t) for r, c in SMOLLM2_LINEAR for t in (1, 5)] + [(37, 96, 3)]  # 37 rows: a partial 8-row tile
    if family != "cpu":  # 960 x 576: q|k|v; 8 x 64: fewer words per row than lanes; 40 x 4000: strided lanes
        shapes += [(960, 576, 1), (8, 64, 2), (40, 4000, 1)]
    if family == "gpu_whole":  # whole blocks on 64 lanes where they add no trip: K = 2,048 (one block a lane),
        shapes += [(24, 2048, 2), (16, 8192, 1)]  # 8,192 (four)
    shapes = fit(dtype, shapes)
    results = run(worker, [f"case_linear('matvec', '{dtype}', {r}, {c}, {t}, seed=3, family='{family}')"
                           for r, c, t in shapes] + ["case_features()"])
    assert "subgroups" in results.pop()  # so family "gpu" ran matvec_gpu_sg_*
    assert [(r["kernel"], r["family"], r["shape"]) for r in results] == (
        [(f"matvec_{dtype}", family, [t, r]) for r, _, t in shapes])
    assert_linear(results)


def test_dispatches_are_timed_with_gpu_timestamps_where_the_device_has_them(worker):
    """SwiftShader and lavapipe both have timestamp-query: the times are the GPU's, and 16x the bytes take
    longer; a time is never above the wall time around it (submits and a wait for the queue included)."""
    r = run(worker, ["case_timed_stream_reads()"])[0]
    assert r["timestamps"], r
    small, large = r["rows"]
    assert {small["timer"], large["timer"]} <= {"gpu timestamps", "gpu timestamps (one pass)"}, r
    assert 0 < small["min_ms"] < large["min_ms"], r
    assert large["min_ms"] <= large["wall_ms"] * 1.05, r


@pytest.mark.parametrize("kernel,family,dtype", variant_cases(LINEAR_CASES))
def test_linear_accumulate_adds_into_y(worker, kernel, family, dtype):
    """The ACCUMULATE variant (residual add fused into the output projections) returns y0 + x @ W.T."""
    shapes = fit(dtype, [(576, 576, 1), (576, 1536, 5), (37, 96, 3)])
    if (kernel, family) == ("matmul", "gpu"):  # the down projection at prefill sizes
        shapes += fit(dtype, [(576, 1536, t) for t in GPU_MATMUL_TOKENS[2:]])
    results = run(worker, [f"case_linear('{kernel}', '{dtype}', {r}, {c}, {t}, seed=12, accumulate=True, "
                           f"family='{family}')" for r, c, t in shapes])
    assert [(r["accumulate"], r["family"], r["shape"]) for r in results] == [(True, family, [t, r])
                                                                             for r, _, t in shapes]
    assert_linear(results)


@pytest.mark.parametrize("dtype,family", variant_cases([(d, f) for d in DTYPES for f in FAMILIES]))
def test_matvec_norm_fuses_the_rmsnorm(worker, dtype, family):
    """The NORM variant (RMSNorm fused into the q|k|v and gate|up matvecs) returns rms_norm(x, g) @ W.T."""
    shapes = fit(dtype, [(960, 576, 1), (3072, 576, 2), (37, 96, 3)])
    results = run(worker, [f"case_linear('matvec', '{dtype}', {r}, {c}, {t}, seed=13, norm=True, family='{family}')"
                           for r, c, t in shapes])
    assert [(r["norm"], r["family"], r["shape"]) for r in results] == [(True, family, [t, r]) for r, _, t in shapes]
    assert_linear(results)


@pytest.mark.parametrize("family,dtype", [(f, d) for k, f, d in LINEAR_CASES if k == "matmul"])
def test_matmul_matches_reference(worker, dtype, family):
    # Tokens not a multiple of 4; 37 and 36 rows end in a partial 8-row tile (36: its upper half is empty).
    shapes = [(1536, 576, 37), (576, 1536, 16), (192, 576, 1), (37, 96, 7), (36, 64, 6)]
    if family == "gpu":  # q|k|v at prefill sizes; 200 rows x 33 tokens: partial 64-row and 32-token tiles
        shapes += [(960, 576, t) for t in GPU_MATMUL_TOKENS] + [(200, 32, 33)]
    shapes = fit(dtype, shapes)
    results = run(worker, [f"case_linear('matmul', '{dtype}', {r}, {c}, {t}, seed=5, family='{family}')"
                           for r, c, t in shapes])
    assert [(r["kernel"], r["family"], r["shape"]) for r in results] == (
        [(f"matmul_{dtype}", family, [t, r]) for r, _, t in shapes])
    assert_linear(results)


@pytest.mark.parametrize("shape", [(64, 8, 2), (64, 8, 1), (128, 16, 1)])
def test_gpu_matmul_with_fewer_tokens_a_thread(worker, shape):
    """The gpu family's tiled matmul with 2 or 1 token a thread (THREAD_TOKENS, a first-boot tuning candidate):
    plain, ACCUMULATE and SWIGLU against numpy, with partial row and token tiles, a 4-bit, an 8-bit and a
    K-quant type."""
    cases = [("q4_1", 960, 576, 130), ("q8_0", 200, 32, 33), ("q4_K", 576, 256, 7), ("q4_1", 36, 64, 1)]
    plain = run(worker, [f"case_linear('matmul', '{d}', {r}, {c}, {t}, seed=5, family='gpu', matmul_shape={shape})"
                         for d, r, c, t in cases])
    added = run(worker, [f"case_linear('matmul', '{d}', {r}, {c}, {t}, seed=12, accumulate=True, family='gpu', "
                         f"matmul_shape={shape})" for d, r, c, t in cases[:2]])
    assert [(r["family"], r["shape"]) for r in plain + added] == [("gpu", [t, r]) for _, r, _, t in cases + cases[:2]]
    assert_linear(plain + added)
    gated = run(worker, [f"case_linear_swiglu('matmul', 'q4_1', 3072, 576, {t}, seed=15, family='gpu', "
                         f"matmul_shape={shape})" for t in (5, 130)])
    assert [r["shape"] for r in gated] == [[5, 1536], [130, 1536]]
    for r in gated:
        assert r["max_scaled"] <= SWIGLU_REL_BOUND and r["max_rel"] <= LINEAR_REL_BOUND, r


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_weights_every_linear_variant_and_the_embedding(worker, dtype):
    """f32 / f16 / bf16 matrices: matvec in every family and the cpu family's matmul (the gpu family prefills
    float models on it), plain, ACCUMULATE, NORM and SWIGLU, partial tiles and a 576-wide row; one call."""
    lin = [("matvec", f, 96, 64, 1) for f in FAMILIES] + [("matvec", f, 40, 576, 2) for f in FAMILIES]
    lin += [("matmul", "cpu", 37, 96, 7), ("matmul", "cpu", 40, 576, 6)]
    calls = [f"case_linear('{k}', '{dtype}', {r}, {c}, {t}, seed=3, family='{f}')" for k, f, r, c, t in lin]
    acc = [("matvec", f) for f in FAMILIES] + [("matmul", "cpu")]
    calls += [f"case_linear('{k}', '{dtype}', 37, 96, 3, seed=12, accumulate=True, family='{f}')" for k, f in acc]
    calls += [f"case_linear('matvec', '{dtype}', 96, 576, 2, seed=13, norm=True, family='{f}')" for f in FAMILIES]
    swiglu = [f"case_linear_swiglu('matvec', '{dtype}', 40, 96, 3, seed=15, norm=True, family='{f}')"
              for f in FAMILIES] + [f"case_linear_swiglu('matmul', '{dtype}', 40, 96, 7, seed=14)"]
    embedding = f"case_embedding(300, 576, [0, 299, 17, 17, 150], seed=8, dtype='{dtype}')"
    *results, emb = run(worker, calls + swiglu + [embedding])
    linear, fused = results[: len(calls)], results[len(calls):]
    assert [(r["kernel"], r["family"], r["shape"], r["accumulate"], r["norm"]) for r in linear] == (
        [(f"{k}_{dtype}", f, [t, r], False, False) for k, f, r, _, t in lin]
        + [(f"{k}_{dtype}", f, [3, 37], True, False) for k, f in acc]
        + [(f"matvec_{dtype}", f, [2, 96], False, True) for f in FAMILIES])
    assert_linear(linear)
    assert [(r["kernel"], r["family"], r["shape"]) for r in fused] == (
        [(f"matvec_{dtype}", f, [3, 20]) for f in FAMILIES] + [(f"matmul_{dtype}", "cpu", [7, 20])])
    for r in fused:
        assert r["max_scaled"] <= SWIGLU_REL_BOUND and r["max_rel"] <= LINEAR_REL_BOUND, r
    assert (emb["dtype"], emb["shape"], emb["equal"], emb["max_abs"]) == (dtype, [5, 576], True, 0.0), emb


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0"])
def test_f16_matvec_matches_reference_where_the_device_has_shader_f16(worker, dtype):
    """The f16 variants (plain, NORM, ACCUMULATE, SWIGLU) on lavapipe; SwiftShader has no shader-f16, where
    the engine keeps the f32 kernels (test_webgpu_engine) and an f16 kernel does not even compile."""
    if "shader-f16" not in run(worker, ["case_features()"])[0]:
        with pytest.raises(Exception, match="f16"):
            run(worker, [f"case_linear('matvec', '{dtype}', 8, 64, 1, seed=3, family='gpu_f16')"])
        return
    shapes = [(960, 576, 1), (576, 1536, 5), (37, 96, 3), (8, 64, 2), (40, 4000, 1), (49152, 576, 3)]
    calls = [f"case_linear('matvec', '{dtype}', {r}, {c}, {t}, seed=3, family='gpu_f16')" for r, c, t in shapes]
    calls += [f"case_linear('matvec', '{dtype}', 960, 576, 2, seed=13, norm=True, family='gpu_f16')",
              f"case_linear('matvec', '{dtype}', 576, 1536, 2, seed=12, accumulate=True, family='gpu_f16')",
              f"case_linear_swiglu('matvec', '{dtype}', 3072, 576, 2, seed=15, norm=True, family='gpu_f16')"]
    # a residual row with outliers of 20,000 and 60,000 under a gain of 1.5: raw x * g overflows f16, so NORM
    # scales by 1 / rms (f32) before the cast; one token per workgroup, then 4 row groups of 16 lanes
    outliers = (20000.0, -20000.0, 60000.0, -60000.0)
    calls += [f"case_linear('matvec', '{dtype}', 960, 576, 2, seed=16, norm=True, family='{f}', outliers={outliers})"
              for f in ("gpu_f16", "gpu_f16_groups")]
    results = run(worker, calls)
    assert [r["family"] for r in results] == ["gpu_f16"] * 10 + ["gpu_f16_groups"]
    assert [r["shape"] for r in results] == [[t, r] for r, _, t in shapes] + [[2, 960], [2, 576], [2, 1536]] + [
        [2, 960]] * 2
    assert [r["raw_max"] for r in results[-2:]] == [90000.0, 90000.0]  # past f16's 65,504 before normalising
    for r in results[:-2]:
        assert r["max_scaled"] <= F16_SCALED_BOUND and r["max_rel"] <= F16_REL_BOUND, r
    for r in results[-2:]:  # q4_1's error against the scale of its two terms (d q and m), which an outlier inflates
        scaled = r.get("max_term_scaled", r["max_scaled"])
        assert r["finite"] and scaled <= F16_SCALED_BOUND and r["max_rel"] <= F16_REL_BOUND, r


@pytest.mark.parametrize("family", ["gpu", "gpu_tree", pytest.param("gpu_groups", marks=pytest.mark.native_matrix)])
def test_gpu_family_lm_head(worker, family):
    results = run(worker, [f"case_linear('matvec', 'q8_0', 49152, 576, 3, seed=7, family='{family}')"])
    assert [(r["family"], r["shape"]) for r in results] == [(family, [3, 49152])]
    assert_linear(results)


def test_lm_head_and_embedding_share_the_q8_0_table(worker):
    ids = [0, 49151, 17, 17, 30000, 5]
    results = run(worker, [
        "case_linear('matvec', 'q8_0', 49152, 576, 3, seed=7)",
        f"case_embedding(49152, 576, {ids}, seed=7)",
        "case_embedding(49152, 576, [123], seed=7)",
        "case_embedding(100, 64, [99, 0, 50], seed=8)",
    ])
    head, *embeddings = results  # the Q8_0 table's embedding is exact
    assert head["shape"] == [3, 49152]
    assert_linear([head])
    assert [e["shape"] for e in embeddings] == [[6, 576], [1, 576], [3, 64]]
    for e in embeddings:
        assert e["equal"] and e["max_abs"] == 0.0, e


@pytest.mark.parametrize("dtype", ["q4_1", *DTYPES[2:]])
def test_embedding_of_every_nibble_type(worker, dtype):
    """embedding_<type> (embedding_nibble.wgsl): a * q + m per weight; exact where that is gguf's own order of
    operations (q4_0, q5_0: d * q and its offset are exact products; q4_1: d * q + m), within 2 ulp elsewhere
    (the high bits and the K-quants' (d * sc) * q - dmin * m are rounded in two steps)."""
    hidden = 768 if dtype.endswith("_K") else 576
    results = run(worker, [f"case_embedding(300, {hidden}, [0, 299, 17, 17, 150], seed=8, dtype='{dtype}')"])
    assert [(r["dtype"], r["shape"]) for r in results] == [(dtype, [5, hidden])]
    assert results[0]["equal"] or (dtype not in ("q4_0", "q5_0") and results[0]["max_ulp"] <= 2), results


def test_rmsnorm_matches_reference(worker):
    results = run(worker, ["case_rmsnorm(576, 1, seed=1)", "case_rmsnorm(576, 7, seed=2)",
                           "case_rmsnorm(40, 3, seed=3)"])
    assert [r["shape"] for r in results] == [[1, 576], [7, 576], [3, 40]]
    for r in results:
        assert r["max_scaled"] <= RMSNORM_REL_BOUND, r


def test_rope_matches_reference(worker):
    results = run(worker, [
        "case_rope([8191], 9, 3, 64, seed=4)",
        "case_rope([0, 1, 2, 700, 8190, 5, 3000], 9, 3, 64, seed=5)",  # several sequences, not monotonic
        "case_rope([3, 255, 17], 4, 2, 16, seed=6, max_positions=256)",
        "case_rope([0, 9, 4], 4, 2, 16, seed=7, max_positions=256, bias=True)",  # qwen2's q / k / v bias
    ])
    assert [(r["q"]["shape"], r["k"]["shape"]) for r in results] == [
        ([1, 576], [1, 192]), ([7, 576], [7, 192]), ([3, 64], [3, 32]), ([3, 64], [3, 32])]
    for r in results:
        assert r["q"]["max_rel"] <= ROPE_REL_BOUND and r["k"]["max_rel"] <= ROPE_REL_BOUND, r
        assert r["v_equal"], r  # v is only split off the stacked q | k | v rows


@pytest.mark.parametrize("kernel,family,dtype", variant_cases(LINEAR_CASES))
def test_swiglu_fused_into_the_gate_up_projection(worker, kernel, family, dtype):
    """SWIGLU variant over gate / up rows interleaved by fours -> silu(gate) * up, (T, rows / 2)."""
    shapes = fit(dtype, [(3072, 576, 1), (3072, 576, 7), (40, 96, 3)])
    calls = [f"case_linear_swiglu('{kernel}', '{dtype}', {r}, {c}, {t}, seed=14, family='{family}')"
             for r, c, t in shapes]
    if kernel == "matvec":
        (r, c, t), = fit(dtype, [(3072, 576, 2)])
        calls.append(f"case_linear_swiglu('matvec', '{dtype}', {r}, {c}, {t}, seed=15, norm=True, family='{family}')")
        shapes.append((r, c, t))
    if (kernel, family) == ("matmul", "gpu"):  # gate|up at prefill sizes
        prefill = fit(dtype, [(3072, 576, 64), (3072, 576, 130)])
        calls += [f"case_linear_swiglu('matmul', '{dtype}', {r}, {c}, {t}, seed=15, family='gpu')" for r, c, t in prefill]
        shapes += prefill
    results = run(worker, calls)
    assert [(r["family"], r["shape"]) for r in results] == [(family, [t, r // 2]) for r, _, t in shapes]
    for r in results:
        assert r["max_scaled"] <= SWIGLU_REL_BOUND and r["max_rel"] <= LINEAR_REL_BOUND, r


@pytest.mark.parametrize("family", ["cpu", "gpu"])
def test_argmax_is_exact_with_ties_to_the_lowest_index(worker, family):
    planted = [[49151], [40000, 7, 12345], [0, 49151], [30001, 30000]]
    results = run(worker, [f"case_argmax(4, 49152, {planted}, seed=9, family='{family}')",
                           f"case_argmax(1, 49152, [[24576]], seed=10, family='{family}')",
                           f"case_argmax(3, 1000, [[999], [5, 4], [500]], seed=11, family='{family}')",
                           f"case_argmax(2, 100, [[99], [3, 2, 1]], seed=12, family='{family}')"])  # vocab < threads
    assert [r["gpu"] for r in results] == [[49151, 7, 0, 30000], [24576], [999, 4, 500], [99, 1]]
    assert [r["numpy"] for r in results] == [r["gpu"] for r in results]


def test_benchmark_probes_compute_what_they_claim(worker):
    r = run(worker, ["case_probes(seed=3)"])[0]
    assert r["stream_read_sum_ok"] and r["stream_read_grid_sum_ok"], r
    assert r["max_rel"] <= 1e-5, r  # the same 100 multiply-adds per chain; only FMA contraction may differ
