"""The gpu-family matvec's fused io variants vs numpy, in headless Chromium (SwiftShader) and natively
(tests/native: lavapipe). A decode step of the gpu family runs 5 dispatches a layer (plan.layer_program): the
q | k | v projection writes rotated q and the new K / V straight into the cache (matvec_io_rope_kv.wgsl), and
the output projection merges the attention partitions on the way in (matvec_io_merge.wgsl), and where the cache
is f32 / f16 the q | k | v projection runs inside the attention (paged_attention_gpu_fold.wgsl); a greedy step's LM
head writes each workgroup's best row instead of logits (matvec_io_argmax.wgsl), which argmax_gpu then scans.

Bounds (asserted below):
  q, k and v rows, f32: |gpu - ref| <= 2e-6 * the dot products' rounding scale (|h| @ |W|^T + |bias|, a rotated
      pair's two scales summed) and <= 1e-5 * max|ref|, the matvec bounds of test_model_kernels.py
  f16 cache: at most one f16 ulp from numpy's f32 result rounded to f16
  every cache word outside the written slots keeps its contents
  merge: the matvec bounds, the scale taken over the merged activations
  attention with its own q | k | v: the merged output within 1e-5 * max|ref|; its new cache rows as the rope_kv
      epilogue's (f16 one ulp, f32 1e-5 * max|ref|)
  argmax from the winners: the very ids of the logits' argmax (GPU and numpy), ties to the lowest row
"""
from __future__ import annotations

import pytest

from browser_pages import install_modules

SCALED_BOUND, REL_BOUND = 2e-6, 1e-5


@pytest.fixture(scope="module")
def worker(ready_page):
    return install_modules(ready_page, "fused_cases")


def run(worker, calls: list[str]) -> list[dict]:
    body = ", ".join(f"await fc.{c}" for c in calls)
    return worker.py(f"import json, fused_cases as fc\njson.dumps([{body}])")


def assert_close(r: dict) -> None:
    assert r["max_scaled"] <= SCALED_BOUND and r["max_rel"] <= REL_BOUND, r


@pytest.mark.parametrize("tree", [False, True], ids=["subgroups", "tree"])
def test_rope_kv_epilogue_writes_q_and_the_cache_slots(worker, tree):
    results = run(worker, [
        # one decode token, a slot in the middle of block 5; two tokens of different sequences, out of order
        f"case_rope_kv('f16', [700], [87], seed=1, tree={tree})",
        f"case_rope_kv('f16', [9, 3000], [120, 17], seed=2, tree={tree})",
        f"case_rope_kv('f32', [0, 255], [3, 64], seed=3, bias=True, tree={tree})",  # qwen2's bias
        f"case_rope_kv('rows', [41, 5], [0, 0], seed=4, tree={tree})",  # quantized KV: rows for kv_write_quant
        # pages several models share: blocks 3000 u32s apart; odd small heads (4 x 16 / 2 x 16)
        f"case_rope_kv('f16', [77, 1], [33, 2], seed=5, block_u32=3000, tree={tree})",
        f"case_rope_kv('f16', [6, 250], [9, 30], seed=6, n_heads=4, n_kv=2, head_dim=16, bias=True, tree={tree})",
        f"case_rope_kv('f32', [12], [31], seed=7, n_heads=4, n_kv=2, head_dim=16, block_tokens=8, tree={tree})",
        # the blocks token-major (the layout before head-major blocks; the kernels' benchmark row ":token")
        f"case_rope_kv('f16', [5, 40], [17, 90], seed=8, head_major=False, tree={tree})",
        # x read with the previous layer's 3 fused-FFN partials (SPLIT_PARTS)
        f"case_rope_kv('f16', [9, 300], [120, 17], seed=9, split_parts=3, tree={tree})",
    ])
    for r in results:
        assert_close(r["q"])
        for name in ("k", "v"):
            if "max_ulps" in r[name]:
                assert r[name]["max_ulps"] <= 1.0, r
            else:
                assert_close(r[name])
            assert r[name].get("others_kept", True), r


@pytest.mark.parametrize("tree", [False, True], ids=["subgroups", "tree"])
def test_merge_prologue_merges_the_partitions(worker, tree):
    results = run(worker, [
        f"case_merge([1000], seed=1, block_size=16, partition_blocks=8, tree={tree})",  # 8 partitions, SmolLM2
        f"case_merge([30, 200], seed=2, tree={tree})",  # one partition (x read as is), then 7
        f"case_merge([65, 16, 333], seed=3, block_size=8, partition_blocks=3, n_heads=4, head_dim=16, tree={tree})",
        f"case_merge([30, 200], seed=4, split_parts=5, tree={tree})",  # the residual with 5 FFN partials
    ])
    assert [r["parts"] for r in results] == [[8], [1, 7], [3, 1, 14], [1, 7]]
    for r in results:
        assert_close(r)


@pytest.mark.parametrize("tree", [False, True], ids=["subgroups", "tree"])
def test_attention_with_its_own_qkv_matches_numpy_and_writes_the_new_rows(worker, tree):
    """paged_attention_gpu_fold.wgsl: q | k | v computed in each attention workgroup (the matvec's rows8, RoPE),
    the new K / V used from workgroup memory (their cache slots hold NaN until the kernel writes them: a read
    would poison the output) and written once per kv head. f16 and f32 caches; a context of 5 partitions with
    the new token in the last (SmolLM2's heads); two sequences, one of a single partition; GQA groups of 4 in tiles of 2 (two
    workgroups compute a kv head's k / v, one writes them) with 3 pending FFN partials and blocks of 8."""
    results = run(worker, [
        f"case_fold('f16', [520], [700], seed=1, partition_blocks=8, tree={tree})",
        f"case_fold('f32', [40, 150], [3, 250], seed=2, tree={tree})",
        f"case_fold('f16', [90, 251], [89, 300], seed=4, n_heads=8, n_kv=2, head_dim=16, head_tile=2, block_size=8, "
        f"partition_blocks=3, split_parts=3, tree={tree})",
    ])
    assert [r["parts"] for r in results] == [[5], [2, 5], [4, 11]]
    for r in results:
        assert r["max_rel"] <= REL_BOUND, r
        for name in ("k", "v"):
            assert r[name].get("max_ulps", 0.0) <= 1.0 and r[name].get("max_rel", 0.0) <= REL_BOUND, r
            assert r[name]["others_kept"], r


@pytest.mark.parametrize("tree", [False, True], ids=["subgroups", "tree"])
def test_one_dispatch_ffn_partials_add_up_to_down_of_the_swiglu_activations(worker, tree):
    """ffn_gpu_main.wgsl: the activations the SWIGLU matvec computes (same rows8, same bits), times the
    matching columns of down, one partial per workgroup: their sum is down @ act on the matvec bounds; a
    second decoder of another type (q6_K down beside q4_K gate | up: the `down_` instance), a last slice
    past ffn (ffn 544 = 17 blocks in slices of 1), GeGLU."""
    results = run(worker, [
        f"case_ffn('q4_1', 'q4_1', 1, seed=1, hidden=576, ffn=1536, tree={tree})",  # SmolLM2: 48 blocks, 2 a slice
        f"case_ffn('q8_0', 'q8_0', 2, seed=2, hidden=64, ffn=544, gelu=True, tree={tree})",
        f"case_ffn('q4_K', 'q6_K', 2, seed=3, tree={tree})",
    ])
    assert [(r["shader"].split("_", 2)[-1], r["parts"]) for r in results] == [
        (("sg_" if not tree else "") + "q4_1_q4_1", 24), (("sg_" if not tree else "") + "q8_0_q8_0", 17),
        (("sg_" if not tree else "") + "q4_K_q6_K", 16)]
    for r in results:
        assert_close(r)
        assert r["argmax"][0] == r["argmax"][1] and r["x_kept"], r


@pytest.mark.parametrize("tree", [False, True], ids=["subgroups", "tree"])
def test_lm_head_winners_give_the_argmax_of_the_logits(worker, tree):
    """A greedy step's LM head writes each workgroup's best row, not logits (matvec_io_argmax.wgsl), the final
    norm's gain bound at 8: the ids are those of the plain NORM matvec's logits (argmax on the GPU, numpy's) and
    numpy's of the float reference, ties to the lowest row, a partial last workgroup."""
    results = run(worker, [
        f"case_argmax(1003, 2, seed=1, tree={tree})",  # 126 workgroups, the last with 3 rows
        f"case_argmax(1003, 2, seed=2, ties=(1001, 17, 16, 600), tree={tree})",  # across and inside workgroups
        f"case_argmax(49152, 1, seed=3, hidden=576, ties=(40000, 9), tree={tree})",  # SmolLM2's LM head
    ])
    for r in results:
        assert r["_argmax"] == r["plain"] == r["numpy"] == r["near"], r
    assert results[1]["_argmax"][0] == 16 and results[2]["_argmax"][0] == 9
