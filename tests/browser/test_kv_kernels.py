"""KV-cache kernels on real WebGPU (SwiftShader here) against their numpy references.

Every case runs in the page's worker (tests/browser/kv_cases.py): random caches, scattered non-monotonic
block tables, several sequences of different lengths (not multiples of the block size) in one batch,
block sizes 8/16/32 (64 and 128 in one test), f32 and packed-f16 KV, SmolLM2's GQA (9 query heads / 3 kv heads,
head_dim 64) and small configs (4 / 2 and 8 / 2 heads, head_dim 16; 4 / 4 heads, head_dim 32), so every head tile
1..4 runs.
Decode attention runs in each kernel family (FAMILY): the cpu family's, the gpu family's with its
workgroup-tree reduction and with subgroups (SwiftShader's subgroups have 4 lanes, lavapipe's 8).
The references run in float64 on the very cache values the GPU holds, so the bounds below measure only
the kernels' f32 arithmetic.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("kv_cases.py")

# Error bounds: max |gpu - reference| and that divided by max |reference|. Measured here (SwiftShader) over
# every case of this module: decode <= 4.5e-7 abs / 3.8e-7 rel (34 batches, contexts up to 4,100 tokens);
# prefill <= 6.5e-7 abs / 2.7e-7 rel (24 batches, 4-token tiles). kv_write, copy_blocks and swaps are bit-exact.
DECODE_MAX_ABS, DECODE_REL = 3e-6, 1e-5
PREFILL_MAX_ABS, PREFILL_REL = 5e-6, 5e-6

SMOLLM2 = (9, 3, 64)  # n_heads, n_kv_heads, head_dim; decode runs 3 heads per invocation (SLOTS)
SMALL = (4, 2, 16)  # 2 heads per decode invocation
MHA = (4, 4, 32)  # no GQA: 1 head per decode invocation
GROUP4 = (8, 2, 16)  # 4 heads per decode invocation
CONFIGS = pytest.mark.parametrize("heads", [SMOLLM2, SMALL, MHA, GROUP4],
                                  ids=["gqa9-3-d64", "gqa4-2-d16", "mha4-d32", "gqa8-2-d16"])
FAMILY = pytest.mark.parametrize("family", ["cpu", "gpu", "gpu-sg"])  # kv_cases.FAMILIES
DECODE_KERNELS = {"cpu": ["paged_attention_narrow", "paged_attention_reduce"],  # CONFIGS: heads up to 64
                  "gpu": ["paged_attention_gpu", "paged_attention_reduce_gpu"],
                  "gpu-sg": ["paged_attention_gpu_sg", "paged_attention_reduce_gpu"]}


@pytest.fixture(scope="module")
def page(ready_page):
    ready_page.py(CASES.read_text() + "\nNone")
    return ready_page


def run(page, calls: list[str]) -> list:
    """Await each call in the worker, in one crossing into the page."""
    return page.py("import json\njson.dumps([" + ", ".join(f"await {c}" for c in calls) + "])")


def test_kv_write_stores_every_row_in_its_slot_bit_exact(page):
    calls = [f"kv_write_case({seed}, [3, {bs + 5}, {2 * bs - 1}], {bs}, {dtype!r}, {n_kv}, {d})"
             for seed, bs in enumerate((8, 16, 32)) for dtype in ("f32", "f16") for _, n_kv, d in (SMOLLM2, SMALL)]
    results = run(page, calls)
    for call, r in zip(calls, results):
        # f32 is copied; f16 is rounded by pack2x16float exactly as numpy's astype(float16) rounds.
        assert (r["k_mismatch"], r["v_mismatch"], r["k_max_abs"]) == (0, 0, 0.0), call
        assert r["untouched_equal"] is True, call
    assert [r["tokens"] for r in results[:4]] == [3 + 13 + 15] * 4


def test_copy_blocks_copies_exactly_the_listed_blocks(page):
    pairs = [[7, 2], [0, 9], [11, 4], [5, 6]]  # out of order, forward and backward
    calls = [f"copy_blocks_case({seed}, 12, {bs}, {dtype!r}, 3, 64, {pairs})"
             for seed, (bs, dtype) in enumerate([(8, "f32"), (16, "f16"), (32, "f32"), (32, "f16")])]
    for call, r in zip(calls, run(page, calls)):
        assert r == {"k_equal": True, "v_equal": True, "blocks_changed": 4}, call


def test_swap_out_and_in_round_trips_blocks_bit_exact(page):
    calls = [f"swap_case({seed}, 12, {bs}, {dtype!r}, 3, 64, [5, 2, 9, 11], [0, 7, 3, 2])"
             for seed, (bs, dtype) in enumerate([(8, "f32"), (16, "f16"), (32, "f16")])]
    results = run(page, calls)
    for call, r, bs in zip(calls, results, (8, 16, 32)):
        assert r["swap_out_equal"] and r["swap_in_equal"], call
        assert r["out_shape"] == [4, bs, 3, 64] and r["blocks_changed"] == 4, call
    assert [r["out_dtype"] for r in results] == ["float32", "float16", "float16"]


@FAMILY
@CONFIGS
def test_paged_decode_attention_matches_reference(page, heads, family):
    n_heads, n_kv, d = heads
    # One partition of 512 tokens: every sequence is finished by pass 1.
    calls = [f"decode_case({seed}, [1, {bs - 1}, {3 * bs + 5}, 200, 97], {bs}, {dtype!r}, {n_heads}, {n_kv}, {d},"
             f" partition_tokens=512, family={family!r})"
             for seed, bs in enumerate((8, 16, 32)) for dtype in ("f32", "f16")]
    # Small partitions so these short contexts already go through the split + merge pass.
    calls += [f"decode_case({10 + i}, [300, 17, 129, 64], 16, {dtype!r}, {n_heads}, {n_kv}, {d}, partition_tokens=32,"
              f" family={family!r})" for i, dtype in enumerate(("f32", "f16"))]
    results = run(page, calls)
    for call, r in zip(calls, results):
        assert r["max_abs"] <= DECODE_MAX_ABS and r["rel"] <= DECODE_REL, (call, r)
        assert r["shape"] == [5 if "200" in call else 4, n_heads, d]
    assert [r["dispatches"] for r in results] == [1] * 6 + [2, 2]
    assert results[-1]["kernels"] == DECODE_KERNELS[family]


@FAMILY
def test_paged_decode_long_contexts_split_and_merge(page, family):
    n_heads, n_kv, d = SMOLLM2
    calls = [f"decode_case(20, [3001, 17, 4100, 513], 16, 'f32', {n_heads}, {n_kv}, {d}, family={family!r})",
             f"decode_case(21, [4096, 1000], 32, 'f16', {n_heads}, {n_kv}, {d}, family={family!r})"]
    results = run(page, calls)
    for call, r in zip(calls, results):
        assert r["max_abs"] <= DECODE_MAX_ABS and r["rel"] <= DECODE_REL, (call, r)
        assert r["dispatches"] == 2, call  # default 128-token partitions: pass 1 + the merge pass
    assert results[0]["partitions"] == 33 and results[1]["partitions"] == 32


@FAMILY
@pytest.mark.parametrize("heads", [SMOLLM2, MHA], ids=["gqa9-3-d64", "mha4-d32"])
def test_paged_decode_ragged_lengths_at_block_and_tile_edges(page, heads, family):
    # Lengths around a block (8/16/32) and around the gpu family's 128-key tile, with 256-token partitions:
    # tiles cut short inside a partition, partitions cut short inside a sequence, one-token sequences.
    n_heads, n_kv, d = heads
    lengths = [1, 15, 16, 17, 127, 128, 129, 300, 1000]
    calls = [f"decode_case({30 + bs}, {lengths}, {bs}, {dtype!r}, {n_heads}, {n_kv}, {d}, partition_tokens=256,"
             f" family={family!r})" for bs, dtype in ((8, "f16"), (16, "f32"), (32, "f16"))]
    for call, r in zip(calls, run(page, calls)):
        assert r["max_abs"] <= DECODE_MAX_ABS and r["rel"] <= DECODE_REL, (call, r)
        assert (r["shape"], r["partitions"], r["dispatches"]) == ([9, n_heads, d], 4, 2), call


@pytest.mark.parametrize("family", ["cpu", "gpu"])
def test_paged_decode_reads_token_major_blocks_too(page, family):
    # head_major=False: blocks token after token on the device (the benchmark's ":token" rows, the layout
    # before head-major blocks), through the same upload and kernels.
    calls = [f"decode_case(40, [1, 17, 300], 16, {dtype!r}, 9, 3, 64, family={family!r}, head_major=False)"
             for dtype in ("f16", "f32")]
    for call, r in zip(calls, run(page, calls)):
        assert r["max_abs"] <= DECODE_MAX_ABS and r["rel"] <= DECODE_REL, (call, r)


@pytest.mark.parametrize("family", ["cpu", "gpu"])  # the gpu family's prefill has no subgroup variant
@CONFIGS
def test_paged_prefill_attention_with_cached_prefixes_matches_reference(page, heads, family):
    n_heads, n_kv, d = heads
    # (tokens already cached, new tokens): a prefix hit, a fresh prompt, a one-token chunk, a long tail.
    chunks = [(37, 11), (0, 21), (50, 1), (9, 40)]
    cases = [(f"prefill_case({seed}, {chunks}, {bs}, {dtype!r}, {n_heads}, {n_kv}, {d}, family={family!r})", chunks)
             for seed, bs in enumerate((8, 16, 32)) for dtype in ("f32", "f16")]
    if family == "cpu":
        # 4 new tokens per invocation by default (tails of 3, 1, 1 and 0 here); 3 and 1 per invocation too.
        cases += [(f"prefill_case({6 + tile}, {chunks}, 16, 'f32', {n_heads}, {n_kv}, {d}, query_tile={tile})", chunks)
                  for tile in (3, 1)]
    else:
        # Many key tiles (16 keys at head_dim 64, 32 below) behind long cached prefixes, chunks of many tiles.
        long = [(300, 33), (17, 64), (0, 100)]
        cases += [(f"prefill_case(8, {long}, {bs}, 'f16', {n_heads}, {n_kv}, {d}, family='gpu')", long)
                  for bs in (8, 32)]
    for (call, want_chunks), r in zip(cases, run(page, [c for c, _ in cases])):
        assert r["max_abs"] <= PREFILL_MAX_ABS and r["rel"] <= PREFILL_REL, (call, r)
        assert r["shape"] == [sum(n for _, n in want_chunks), n_heads, d], call


def test_cpu_prefill_walks_long_prefixes_in_passes_of_512_keys(page):
    # Contexts of 1,109 (3 passes of 32 blocks), 513 (2) and 30 keys in one batch, Gemma 3's heads (4 x 256 over
    # one kv head, the _wide variant) and SmolLM2's, the 512-key window too: each pass resumes the state the one
    # before left, and tiles that finish early wait out the rest (paged_prefill_attention_main.wgsl).
    chunks = [(1100, 9), (500, 13), (0, 30)]
    calls = [f"prefill_case({50 + i}, {chunks}, 16, {dtype!r}, {h}, {kv}, {d}, window={window})"
             for i, (h, kv, d, dtype, window) in enumerate([(4, 1, 256, "f16", 0), (4, 1, 256, "f32", 512),
                                                             (*SMOLLM2, "f32", 0)])]
    for call, r in zip(calls, run(page, calls)):
        assert r["max_abs"] <= PREFILL_MAX_ABS and r["rel"] <= PREFILL_REL, (call, r)
        assert r["passes"] == 3 and r["shape"][0] == 52, call


def test_gpu_prefill_walks_long_prefixes_in_passes_of_1024_keys(page):
    # The gpu family's walk (a workgroup per tile) in passes of 1,024 keys, several sequences in one batch: Gemma 3's
    # heads (4 x 256 over one kv head) in f16 over contexts of 3,602 (4 passes), 1,025 (2) and 30 keys; with its
    # 512-key window in f32 (its walks end in the first pass, the second returns at once) and SmolLM2's heads over
    # 1,109 and 30. In one walk, past 3,588 keys at head_dim 256, llvmpipe's loop cap cut the keys short on
    # lavapipe (rel error 1.0 at 4,000 keys; this case's 3,602 failed).
    long, short = [(3600, 2), (1020, 5), (0, 30)], [(1100, 9), (0, 30)]
    cases = [(long, 4, 1, 256, "f16", 0, 4), (short, 4, 1, 256, "f32", 512, 2), (short, *SMOLLM2, "f32", 0, 2)]
    calls = [f"prefill_case({60 + i}, {chunks}, 16, {dtype!r}, {h}, {kv}, {d}, window={window}, family='gpu')"
             for i, (chunks, h, kv, d, dtype, window, _) in enumerate(cases)]
    for call, case, r in zip(calls, cases, run(page, calls)):
        assert r["max_abs"] <= PREFILL_MAX_ABS and r["rel"] <= PREFILL_REL, (call, r)
        assert r["passes"] == case[-1] and r["shape"][0] == sum(n for _, n in case[0]), call


@FAMILY
def test_blocks_of_64_and_128_keys_give_the_bits_of_32_key_blocks(page, family):
    # Blocks longer than the cpu family's 32-key score chunk: paged_attention_common.wgsl walks them 32 keys at a
    # time, so the same keys in blocks of 32, 64 or 128 (scattered tables) must give the same output bits, and the
    # gpu family walks keys in tiles whatever the block. Decode: lengths at chunk and block edges over two 128-token
    # partitions (against numpy). Decode and prefill at the three sizes: SmolLM2's heads with a cached prefix, a
    # fresh 70-token chunk and a one-token chunk after 300; Gemma 3's heads in a 100-key window, a 609-key walk in
    # two prefill passes of 512 keys (cpu family: 16 / 8 / 4 blocks a pass).
    calls = [f"decode_case(60, [1, 33, 64, 65, 200], 64, 'f16', 9, 3, 64, family={family!r})",
             f"same_bits_case(64, [(37, 11), (0, 70), (300, 1)], [32, 64, 128], 9, 3, 64, family={family!r})",
             f"same_bits_case(65, [(600, 9), (0, 30)], [32, 64, 128], 4, 1, 256, window=100, family={family!r})"]
    decode, *same = run(page, calls)
    assert decode["max_abs"] <= DECODE_MAX_ABS and decode["rel"] <= DECODE_REL, decode
    assert (decode["shape"], decode["partitions"], decode["dispatches"]) == ([5, 9, 64], 2, 2)
    for call, r in zip(calls[1:], same):
        assert r["decode"]["max_abs"] <= DECODE_MAX_ABS and r["decode"]["rel"] <= DECODE_REL, (call, r)
        assert r["prefill"]["max_abs"] <= PREFILL_MAX_ABS and r["prefill"]["rel"] <= PREFILL_REL, (call, r)
        assert r["decode_same_bits"] and r["prefill_same_bits"], (call, r)
    assert [(r["decode"]["shape"], r["prefill"]["shape"]) for r in same] == [([3, 9, 64], [82, 9, 64]),
                                                                             ([2, 4, 256], [39, 4, 256])]
    assert same[1]["passes"] == ([2, 2, 2] if family == "cpu" else [1, 1, 1])


def test_bad_block_table_is_refused_before_the_gpu_runs(page):
    with pytest.raises(Exception, match=r"block ids must lie in \[0, 8\)"):
        page.py("await decode_bad_table()")
