"""The tab's CPU path through the wasm SIMD kernel (web/wasm/linear.wat, py/pagedkv/backends/cpu_wasm.py) in
real headless Chromium: the kernel on Pyodide's memory against numpy, and ?backend=cpu on the tiny model
giving the numpy reference's greedy ids.

Bounds (asserted below; what Chromium gave when written in brackets):
  products, q4_1, q8_0, q4_K, q5_K and q6_K, 1 / 5 / 37 tokens: |y - y64| <= 2e-6 * (|x| @ |W|^T) per output, y64 the f64
      product of numpy's dequantized weights [<= 9.9e-8]: the weights are bit-identical (rows_exact), only
      the f32 summation order differs from einsum's
  attention, q . k over a scattered paged pool and p @ v: |y - y64| <= n * 2^-24 * sum |a_i b_i| per output,
      n = hd or ctx terms (the classic bound of an f32 sum of n products) [scores <= 7.2e-8, values <= 1.8e-7]
  greedy ids: equal to the reference's, except from a step whose reference top-1/top-2 margin is below
      NEAR_TIE (tests/llama_reference.py's rule)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import build
import cpu_wasm_cases
from browser_pages import install_modules, open_and_boot, wait_model
from gguf_models import TINY_K, tiny_gguf
from model_fixtures import cached_gguf
from test_gguf_architectures import MODELS
from llama_reference import near_tie
from pagedkv.backends.cpu_wasm import HELD_AS
from pagedkv.backends.numpy_ref import NumpyModel
from pagedkv.model.convert import convert_cached
from pagedkv.model.weights import ModelWeights, read_manifest

SCALED_BOUND = 2e-6
# 37 x 96: rows not a multiple of the kernel's anything, 3 blocks a row; the rest SmolLM2-135M's shapes. The
# K-quants (rows of 256-weight blocks; q4_K held as q4_1, q5_K as 8-bit codes with mins, q6_K with a scale per 16)
# on a small shape and the ffn_down of llama.cpp's Q4_K_M SmolLM2.
SHAPES = [(37, 96), (1, 32), (576, 576), (192, 576), (1536, 576), (576, 1536)]
CASES = [(d, r, c) for d in ("q4_1", "q8_0") for r, c in SHAPES] + [
    (d, r, c) for d in ("q4_K", "q5_K", "q6_K", "q5_0") for r, c in ((37, 256), (576, 1536))]
SPLIT = sum(r > 1 for _, r, _ in CASES)  # the cases a three-thread product splits (all but the one-row one)
TOKENS = (1, 5, 37)  # 37: two 16-token chunks and a partial one, four-token tiles and single tokens
PROMPT = [5, 77, 300, 12, 9, 41, 250, 3, 180, 64, 99, 7, 401, 20, 33, 128, 256, 17, 88]
NEW_TOKENS = 12


def test_the_kernel_matches_numpy_in_the_worker(ready_page):
    worker = install_modules(ready_page, "cpu_wasm_cases")
    calls = ", ".join(f"c.case_linear(k, {d!r}, {r}, {c}, {TOKENS})" for d, r, c in CASES)
    results = worker.py("import json, cpu_wasm_cases as c\n"
                        "from pagedkv.backends.cpu_wasm import HeapStore\n"
                        "from pagedkv.browser.interop import linear_wasm_matmul\n"
                        f"k = HeapStore(linear_wasm_matmul())\njson.dumps([{calls}])")
    check_linear_cases(results)


def check_linear_cases(results: list[dict]) -> None:
    assert [r["case"] for r in results] == [list(case) for case in CASES]
    for r, (_, rows, _) in zip(results, CASES):
        assert r["rows_exact"], r
        assert r["shapes"] == [[t, rows, "float32"] for t in TOKENS], r
        assert r["max_scaled"] <= SCALED_BOUND, r


# The kernel on three threads (two helper workers) whatever the cores, every product split (minWork 0); `before`
# the products split so far (the threads are the worker's, kept between tests).
THREE_THREADS = ("from pagedkv.browser.interop import linear_threads\n"
                 "api = await linear_threads(3)\napi.minWork, before = 0, api.stats.split\n")


def test_the_kernel_on_three_threads_matches_numpy_in_the_worker(ready_page):
    """Each chunk of rows, its out columns and the copies in and out of the shared memory."""
    worker = install_modules(ready_page, "cpu_wasm_cases")
    calls = ", ".join(f"c.case_linear(k, {d!r}, {r}, {c}, {TOKENS})" for d, r, c in CASES)
    got = worker.py("import json, gc, cpu_wasm_cases as c\nfrom pagedkv.backends.cpu_wasm import SharedStore\n"
                    f"{THREE_THREADS}k = SharedStore(api)\nresults = [{calls}]\ngc.collect()\n"
                    "json.dumps({'results': results, 'threads': k.threads, 'split': api.stats.split - before,\n"
                    "            'live': api.arena.sizes.size})")
    check_linear_cases(got["results"])
    # every product split (the 1-row shape runs alone); each weight's two regions freed with it (io area stays)
    assert (got["threads"], got["split"], got["live"]) == (3, SPLIT * len(TOKENS), 1), got


@pytest.mark.parametrize("activations", ["int16", "int8"])
def test_integer_activations_match_the_integer_twin_and_each_token_alone_on_one_thread_and_three(ready_page,
                                                                                               activations):
    """Each output is the twin's integer block sums times f32 scales: only the f32 sum over blocks, q4_1's
    minimum term and an 8-bit layout's lane sums past 2^24 (converted to f32) round, within 2^-20 of the unit sum
    |d_w d_x codes . q| (nb <= 48 terms); each token of a product bit-identical to its product alone (a reply does
    not depend on its batch). int8: the 4-bit codes through 8-bit activations (the relaxed-SIMD kernel, which
    Chromium loads), the 8-bit codes through 16-bit ones."""
    worker = install_modules(ready_page, "cpu_wasm_cases")
    calls = ", ".join(f"c.case_linear_integer(k, {d!r}, {r}, {c})" for d, r, c in CASES)
    got = worker.py("import json, cpu_wasm_cases as c\nfrom pagedkv.backends.cpu_wasm import HeapStore, SharedStore\n"
                    f"from pagedkv.browser.interop import linear_wasm_matmul, wasm_relaxed_simd\n{THREE_THREADS}"
                    f"out = []\nfor k in (HeapStore(linear_wasm_matmul(), {activations!r}), "
                    f"SharedStore(api, {activations!r})):\n"
                    f"    out.append([{calls}])\n"
                    "json.dumps({'results': out, 'split': api.stats.split - before, 'relaxed': wasm_relaxed_simd()})")
    # every case but the one-row one, on three threads: the tokens together, then each alone
    assert got["relaxed"] is True and got["split"] == SPLIT * (1 + cpu_wasm_cases.INTEGER_TOKENS)
    for results in got["results"]:
        assert [r["case"] for r in results] == [list(case) for case in CASES]
        assert [r["bits"] for r in results] == [8 if activations == "int8" and d in ("q4_1", "q4_K", "q5_K", "q5_0") else 16
                                                for d, _, _ in CASES], results
        assert max(r["max_scaled"] for r in results) <= 2.0**-20, results
        assert all(r["as_alone"] for r in results), results


# (ctx, nkv, group, hd, new tokens): one-token decode, then prefill (every token new, or the last few of a context)
ATTENTION = [(1, 3, 3, 64, 1), (16, 3, 3, 64, 1), (37, 3, 3, 64, 1), (300, 3, 3, 64, 1), (5, 2, 2, 16, 1),
             (33, 1, 4, 32, 1), (37, 3, 3, 64, 37), (300, 3, 3, 64, 21), (33, 1, 4, 32, 2)]


def test_the_attention_kernels_match_numpy_in_the_worker(ready_page):
    worker = install_modules(ready_page, "cpu_wasm_cases")
    calls = ", ".join(f"c.case_attention(k, {c}, {n}, {g}, {d}, {q})" for c, n, g, d, q in ATTENTION)
    results = worker.py("import json, cpu_wasm_cases as c\n"
                        "from pagedkv.browser.interop import wasm_attention\n"
                        f"k = wasm_attention()\njson.dumps([{calls}])")
    assert [r["case"] for r in results] == [list(a) for a in ATTENTION]
    for r in results:
        assert r["finite"] and r["unseen_untouched"], r
        ctx, _, _, hd, _ = r["case"]
        assert r["scores_rel"] <= hd * 2.0**-24 and r["values_rel"] <= ctx * 2.0**-24, r


# (ctx, nkv, group, hd, lo): a first token, block edges, SmolLM2's heads at a long context, other head shapes; a
# window's first keys masked (lo: within the first block, at its edge, Gemma 3's one kv head of 256 and 4 q heads)
DECODE = [(1, 3, 3, 64, 0), (16, 3, 3, 64, 0), (17, 3, 3, 64, 0), (37, 3, 3, 64, 0), (1000, 3, 3, 64, 0),
          (5, 2, 2, 16, 0), (33, 1, 4, 32, 0), (40, 3, 3, 64, 7), (40, 3, 3, 64, 15), (520, 1, 4, 256, 9)]
# (ctx, nkv, group, hd, nq, window): a whole prompt, a chunk after cached tokens, GQA, windows, 256-wide heads
PREFILL = [(37, 3, 3, 64, 37, 0), (300, 3, 3, 64, 21, 0), (600, 3, 3, 64, 512, 0), (33, 1, 4, 32, 2, 0),
           (90, 1, 4, 64, 40, 7), (120, 3, 3, 64, 50, 33), (70, 1, 4, 256, 30, 16)]


def test_attn_decode_rotates_writes_and_attends_in_one_call(ready_page):
    """The fused decode step (web/wasm/linear.wat attn_decode): the rotation and the KV write bit-identical to
    numpy's, the output within its bound against f64 (cpu_wasm_cases.case_attn_decode), each softmax row
    summing to 1 within f32 rounding."""
    worker = install_modules(ready_page, "cpu_wasm_cases")
    calls = ", ".join(f"c.case_attn_decode(k, {c}, {n}, {g}, {d}, {lo})" for c, n, g, d, lo in DECODE)
    results = worker.py("import json, cpu_wasm_cases as c\nfrom pagedkv.browser.interop import wasm_attention\n"
                        f"k = wasm_attention()\njson.dumps([{calls}])")
    assert [r["case"] for r in results] == [list(a) for a in DECODE]
    for r in results:
        assert r["written"] and r["finite"] and r["rel"] <= 1.0 and r["masked_zero"], r
        assert r["probs_sum"] <= (r["case"][0] + 8) * 2.0**-24, r


def test_attn_prefill_attends_every_query_in_one_call(ready_page):
    """A prompt chunk's attention in one call (web/wasm/linear.wat attn_prefill): every query's output within its
    bound against f64 over its causal keys, windows included (cpu_wasm_cases.case_attn_prefill)."""
    worker = install_modules(ready_page, "cpu_wasm_cases")
    calls = ", ".join(f"c.case_attn_prefill(k, {', '.join(map(str, case))})" for case in PREFILL)
    results = worker.py("import json, cpu_wasm_cases as c\nfrom pagedkv.browser.interop import wasm_attention\n"
                        f"k = wasm_attention()\njson.dumps([{calls}])")
    assert [r["case"] for r in results] == [list(a) for a in PREFILL]
    for r in results:
        assert r["finite"] and r["rel"] <= 1.0, r


def test_attn_prefill_on_three_kernel_threads_gives_the_one_calls_bits(ready_page):
    """A prompt chunk's attention on the kernel threads (web/linear_threads.js attn_prefill: the table's K and V
    blocks copied into their shared memory, chunks of queries, the last first, on every thread) gives every
    output the bits of the export's one call on Pyodide's memory, the inputs untouched."""
    worker = install_modules(ready_page, "cpu_wasm_cases")
    calls = ", ".join(f"c.case_attn_prefill_threads(k, api, {', '.join(map(str, case))})" for case in PREFILL)
    got = worker.py("import json, cpu_wasm_cases as c\nfrom pagedkv.browser.interop import wasm_attention\n"
                    f"{THREE_THREADS}k = wasm_attention()\nbefore = api.stats.attnCalls\nresults = [{calls}]\n"
                    "json.dumps({'results': results, 'calls': api.stats.attnCalls - before,\n"
                    "            'helper_chunks': api.stats.helperChunks})")
    assert [r["case"] for r in got["results"]] == [list(case) for case in PREFILL]
    assert all(r["finite"] and r["same_bits"] and r["inputs_kept"] for r in got["results"]), got
    assert got["calls"] == len(PREFILL) and got["helper_chunks"] > 0, got


# (ctx, nkv, group, hd, lo): SmolLM2's heads, Gemma 3's one kv head of four, groups of one and two, a window's lo
DECODE_THREADS = [(1, 3, 3, 64, 0), (37, 3, 3, 64, 0), (560, 3, 3, 64, 0), (300, 1, 4, 256, 0), (45, 2, 1, 32, 0),
                  (70, 2, 2, 16, 21), (5, 8, 2, 64, 0)]


def test_attention_over_the_kv_mirror_on_three_kernel_threads_gives_the_one_calls_bits(ready_page):
    """A decode step's attention on the kernel threads over a mirror of the pools in their memory
    (web/linear_threads.js attn_decode: rope_kv into the mirrors and the new row copied into Pyodide's pools,
    chunks of heads through attn_rows on every thread) gives the output, the pools and the mirrors the bits of the
    export's one call on Pyodide's memory; a prompt chunk's reads the blocks in the mirror, with the same bits."""
    worker = install_modules(ready_page, "cpu_wasm_cases")
    decode = ", ".join(f"c.case_attn_decode_threads(k, api, {', '.join(map(str, case))})" for case in DECODE_THREADS)
    prefill = ", ".join(f"c.case_attn_prefill_threads(k, api, {', '.join(map(str, case))}, mirrored=True)"
                        for case in PREFILL)
    got = worker.py("import json, cpu_wasm_cases as c\nfrom pagedkv.browser.interop import wasm_attention\n"
                    f"{THREE_THREADS}k = wasm_attention()\nbefore = api.stats.decodeCalls\n"
                    f"decode = [{decode}]\nprefill = [{prefill}]\n"
                    "json.dumps({'decode': decode, 'prefill': prefill, 'calls': api.stats.decodeCalls - before,\n"
                    "            'mirrors': len(api.mirrors)})")
    assert [r["case"] for r in got["decode"]] == [list(case) for case in DECODE_THREADS]
    assert all(r["finite"] and r["same_bits"] and r["pools_same"] and r["mirrors_same"] for r in got["decode"]), got
    assert all(r["finite"] and r["same_bits"] and r["inputs_kept"] for r in got["prefill"]), got
    assert got["calls"] == len(DECODE_THREADS), got
    assert got["mirrors"] == 0, got  # each dropped with its arrays (cpu_attention.mirror)


def test_the_one_token_steps_glue_matches_f64(ready_page):
    """rms_norm / add_rms_norm / silu_mul / gelu_tanh_mul (web/wasm/linear.wat, WasmAttentionModel's one-token
    step) against f64, in f32 roundings: the norm's sum of n / 4 positive squares a lane rounds at most n / 4 + 2
    times (halved by the square root), then a division and a product; silu within 8 (Cephes' e^x, the sum, the
    division), gelu too beyond its argument's rounding; rms_norm_rows as rms_norm row by row, bit for bit."""
    worker = install_modules(ready_page, "cpu_wasm_cases")
    results = worker.py("import json, cpu_wasm_cases as c\nfrom pagedkv.browser.interop import wasm_attention\n"
                        "k = wasm_attention()\njson.dumps([c.case_step_glue(k, n) for n in (64, 576, 1536)])")
    for r in results:
        bound = r["n"] / 8 + 4
        assert r["add_exact"] and r["norm_ulps"] <= bound and r["add_ulps"] <= bound and r["silu_ulps"] <= 8, r
        assert r["gelu_ulps"] <= 8 and r["rows_as_alone"] and r["acts_as_alone"], r


@pytest.fixture(scope="module")
def cpu_page(browser, base_url):
    booted = open_and_boot(browser, base_url + "?model=tiny-random&backend=cpu&threads=2")
    info = wait_model(booted)
    yield install_modules(booted, "cpu_wasm_cases"), info
    booted.page.close()


def test_the_tabs_cpu_path_runs_the_kernel_and_gives_the_reference_ids(cpu_page):
    worker, info = cpu_page
    assert (info["backend"], info["cpu_linear"]) == ("cpu", "wasm SIMD on quantized weights, 2 threads, 8-bit "
                                                          "activations (relaxed SIMD)")
    # the device panel says so (a KV mirror the threads could not get would follow: cpu_models.kernel_words)
    assert worker.page.text_content("#adapter-cpu-kernels") == info["cpu_linear"]
    got = worker.py(
        "import json, cpu_wasm_cases as c\nfrom pagedkv_app.main import state\n"
        "model = state['engine'].backend.model\n"
        "assert type(model).__name__ == 'WasmAttentionModel', type(model)\n"
        "kinds = sorted({type(w).__name__ + ':' + getattr(w, 'kind', '') for n, w in model.w.items()\n"
        "                if n.startswith('blk.') and n.endswith('_qkv.weight') or n == 'token_embd.weight'})\n"
        f"json.dumps({{'kinds': kinds, **c.greedy(model, {PROMPT}, {NEW_TOKENS})}})")
    assert got["kinds"] == ["QuantWeight:q4_1", "QuantWeight:q8_d"]  # the q8_0 head without its zero mins
    # the tiny model's products are under the threads' minWork: split every one of them, the same ids come out
    split = worker.py(
        "import json, cpu_wasm_cases as c\nfrom pagedkv_app.main import state\n"
        "model = state['engine'].backend.model\napi = model.w['token_embd.weight'].store.js\n"
        "api.minWork, before, decodes = 0, api.stats.split, api.stats.decodeCalls\n"
        f"got = c.greedy(model, {PROMPT}, {NEW_TOKENS})\napi.minWork = 1 << 16\n"
        "json.dumps({**got, 'threads': api.threads, 'split': api.stats.split - before,\n"
        "            'decodes': api.stats.decodeCalls - decodes})")
    assert split["ids"] == got["ids"], split
    # each decode step's attention on the threads over the KV mirror (greedy mirrors its pools, as CpuBackend does)
    assert split["decodes"] == 2 * NEW_TOKENS, split
    # per step: two layers of q|k|v, o, gate|up and down (the stacks: one product each), and the head
    assert (split["threads"], split["split"]) == (2, (2 * 4 + 1) * (NEW_TOKENS + 1)), split
    ref = cpu_wasm_cases.greedy(NumpyModel(ModelWeights.load(build.DIST / "models" / "tiny-random")), PROMPT,
                                NEW_TOKENS)
    first = next((i for i, (a, b) in enumerate(zip(got["ids"], ref["ids"])) if a != b), None)
    assert first is None or near_tie(ref["margins"][first]), (got, ref)
    assert len(got["ids"]) == NEW_TOKENS + 1


# Runs in the worker: the page's model decoding with its kernels' tape runner (web/linear_tape.js) and with
# Python's walk of the same tapes (the kernels without run_tape): each decode step's logits hashed, the runner's
# walks and every other kernel call made from Python counted during the decode steps.
TAPE_WALKS = """
import hashlib, json
import numpy as np
from pagedkv_app.main import state
from pagedkv.backends.numpy_ref import PagedKVCache
from pagedkv.model_runner import ForwardBatch
model = state['engine'].backend.model
kernels = model.kernels
i32 = lambda v: np.asarray(v, dtype=np.int32)

class Counted:
    def __init__(self, runner):
        self.walks, self.calls, self.runner = 0, 0, runner
    def __getattr__(self, name):
        if name == 'run_tape' and not self.runner:
            raise AttributeError(name)
        f = getattr(kernels, name)
        def call(*args):
            if name == 'run_tape':
                self.walks += 1
            else:
                self.calls += 1
            return f(*args)
        return call

def decode(runner):
    ctx = len(PROMPT) + NEW
    kv = PagedKVCache.allocate(model.config, -(-ctx // 16), 16)
    table = i32([list(range(-(-ctx // 16)))[::-1]])  # scattered: the blocks in reverse
    slots = lambda ps: i32([table[0][p // 16] * 16 + p % 16 for p in ps])
    n = len(PROMPT)
    logits = model.forward(ForwardBatch(i32(PROMPT), i32(range(n)), slots(range(n)), i32([0, n]), table,
                                        i32([n])), kv)
    counted = model.kernels = Counted(runner)
    digest, ids = hashlib.sha256(), []
    try:
        for pos in range(n, ctx):
            ids.append(int(logits[0].argmax()))
            logits = model.forward(ForwardBatch(i32([ids[-1]]), i32([pos]), slots([pos]), i32([0, 1]), table,
                                                i32([pos + 1])), kv)
            digest.update(logits.tobytes())
    finally:
        model.kernels = kernels
    return {'ids': ids, 'digest': digest.hexdigest(), 'walks': counted.walks, 'calls': counted.calls}

json.dumps({'js': decode(True), 'py': decode(False)})
"""


def test_the_one_token_step_is_one_tape_walk_giving_pythons_walk_bit_for_bit(cpu_page):
    """The tab's one-token step crosses from Python into the kernels once (run_tape, web/linear_tape.js), and
    its logits are those of Python walking the same tape call by call, bit for bit, on a scattered table."""
    worker, _ = cpu_page
    got = worker.py(TAPE_WALKS.replace("PROMPT", str(PROMPT)).replace("NEW", str(NEW_TOKENS)))
    assert (got["js"]["walks"], got["js"]["calls"]) == (NEW_TOKENS, 0), got
    # Python's walk: per step the first norm, then per layer of two attn_decode, add_rms_norm twice and silu_mul
    assert (got["py"]["walks"], got["py"]["calls"]) == (0, NEW_TOKENS * (1 + 2 * 4)), got
    assert got["js"]["digest"] == got["py"]["digest"] and got["js"]["ids"] == got["py"]["ids"], got


# Runs in the worker: each K-quant file's weights as the tab's CPU path holds them (cpu_models.cpu_weights: the
# kernel's layouts in the threads' shared memory, q|k|v and gate|up stacked where their layouts agree), every
# product split across two threads, and its greedy ids.
K_FILES = """
import json, engine_cases as ec, cpu_wasm_cases as c
from pagedkv.backends.cpu_attention import WasmAttentionModel
from pagedkv.backends.cpu_wasm import QuantWeight, SharedStore, stack_projections, tensor_loader
from pagedkv.browser.interop import linear_threads, wasm_attention
from pagedkv.model.weights import ModelWeights
api = await linear_threads(2)
api.minWork, before, out = 0, api.stats.split, {}
for name in NAMES:
    manifest, shards = await ec.model_files(name)
    weights = ModelWeights.from_shards(manifest, shards, tensor_loader(SharedStore(api)))
    stack_projections(weights.tensors, weights.config.n_layers)
    model = WasmAttentionModel(weights, wasm_attention())
    kinds = sorted({w.kind for w in model.w.values() if isinstance(w, QuantWeight)})
    out[name] = {'kinds': kinds, 'f32': sorted(n for n, w in model.w.items() if getattr(w, 'ndim', 1) == 2),
                 **c.greedy(model, PROMPT, NEW_TOKENS)}
api.minWork = 1 << 16
json.dumps({'files': out, 'split': api.stats.split - before})
"""


def test_k_quant_files_on_the_tabs_cpu_path_give_the_reference_ids(ready_page):
    """q4_K held as q4_1 blocks, q5_K as 8-bit codes with mins, q6_K as 8-bit codes with a scale per 16 weights:
    no projection left in f32, and the numpy reference's greedy ids (near-tie rule)."""
    names = sorted(TINY_K)
    for name in names:
        shutil.copytree(convert_cached(tiny_gguf(name, cached_gguf()), MODELS), build.DIST / "models" / name,
                        dirs_exist_ok=True)
    worker = install_modules(ready_page, "engine_cases", "cpu_wasm_cases")
    got = worker.py(f"NAMES = {names!r}\nPROMPT = {PROMPT}\nNEW_TOKENS = {NEW_TOKENS}\n" + K_FILES)
    assert got["split"] > 0
    layouts = set()
    for name in names:
        run = got["files"][name]
        types = {t["dtype"] for n, t in read_manifest(build.DIST / "models" / name)["tensors"].items()
                 if len(t["shape"]) == 2 and n.endswith(".weight")}
        assert (run["kinds"], run["f32"]) == (sorted({HELD_AS[t] for t in types}), []), (name, types, run)
        layouts |= set(run["kinds"])
        ref = cpu_wasm_cases.greedy(NumpyModel(ModelWeights.load(build.DIST / "models" / name)), PROMPT, NEW_TOKENS)
        first = next((i for i, (a, b) in enumerate(zip(run["ids"], ref["ids"])) if a != b), None)
        assert first is None or near_tie(ref["margins"][first]), (name, run, ref)
    assert layouts == {"q4_1", "q8_m", "q8_16"}  # q4_K, q5_K and q6_K among the files


def test_a_kernel_that_does_not_load_says_why_and_the_path_keeps_einsum(ready_page):
    got = ready_page.py(
        "import json, js\nfrom pyodide.ffi import to_js\nimport pyodide_js\n"
        "from pagedkv.browser import interop\n"
        "base = str(js.location.href).rsplit('/', 1)[0] + '/'\n"
        "entry = to_js({'file': 'linear.wasm', 'sha256': '00' * 32}, dict_converter=js.Object.fromEntries)\n"
        "tampered = await js.loadLinearWasm(base, entry, pyodide_js)\n"
        "unlisted = await js.loadLinearWasm(base, None, pyodide_js)\n"
        "loaded, js.pagedkvLinear = js.pagedkvLinear, tampered\n"
        "try:\n"
        "    interop.linear_wasm_matmul()\n"
        "    raised = None\n"
        "except interop.WasmUnavailable as exc:\n"
        "    raised = str(exc)\n"
        "finally:\n"
        "    js.pagedkvLinear = loaded\n"
        "json.dumps([tampered.matmul is None, str(tampered.error), str(unlisted.error), raised])")
    assert got[0] is True
    assert got[1].startswith("wasm/linear.wasm has sha256 ") and got[1].endswith(f"assets.json says {'00' * 32}")
    assert got[2] == "assets.json lists no wasm kernel (rebuild: python3 build.py)"
    assert got[3] == got[1]


def test_without_relaxed_simd_the_plain_kernel_loads_and_its_8_bit_functions_trap(ready_page):
    """loadLinearWasm without the relaxed entries (a browser whose WebAssembly lacks relaxed SIMD takes this path
    after the relaxed module fails to validate): relaxedSimd false, 16-bit products as the relaxed module's
    (the same text), the 8-bit kernel assembled as `unreachable` (build.without_relaxed), so it can never run there."""
    got = ready_page.py(
        "import json, js\nimport numpy as np\nimport pyodide_js\n"
        "from pagedkv.backends.cpu_wasm import ACT8, ACT16, address_of\n"
        "base = str(js.location.href).rsplit('/', 1)[0] + '/'\n"
        "assets = await (await js.fetch(base + 'assets.json')).json()\n"
        "plain = await js.loadLinearWasm(base, assets.wasm.linear, pyodide_js, assets.wasm.linear_shared)\n"
        "x = np.linspace(-1, 1, 64, dtype=np.float32)\n"
        "qs = np.arange(64, dtype=np.uint8).reshape(2, 32)\n"
        "dm = np.tile(np.array([0.5, -0.25], np.float32), (2, 2, 1))\n"
        "outs, scratch = [np.zeros(2, np.float32) for _ in range(2)], np.zeros(64, np.float32)\n"
        "for out, mm in zip(outs, (plain.matmul, js.pagedkvLinear.matmul)):\n"
        "    mm(ACT16, address_of(qs), address_of(dm), 2, 64, address_of(x), 1, address_of(out), 2, address_of(scratch))\n"
        "try:\n"
        "    plain.matmul(ACT8, address_of(qs), address_of(dm), 2, 64, address_of(x), 1, address_of(outs[0]), 2,\n"
        "                 address_of(scratch))\n"
        "    trapped = None\n"
        "except Exception as exc:\n"
        "    trapped = str(exc)\n"
        "json.dumps([plain.relaxedSimd, js.pagedkvLinear.relaxedSimd, outs[0].tolist(), outs[1].tolist(), trapped])")
    assert got[0] is False and got[1] is True
    assert got[2] == got[3] and any(got[2]), got
    assert got[4] is not None and "unreachable" in got[4], got


GOLDEN = json.loads((Path(__file__).parent.parent / "golden" / "llama_golden.json").read_text(encoding="utf-8"))
GREEDY = """
import json
from pagedkv_app.main import state
from pagedkv.sampling import SamplingParams
e, out = state["engine"], []
for prompt in PROMPTS:
    rid = e.add_request(prompt, SamplingParams(max_tokens=8, stop_token_ids=(1_000_000,)))
    ids = []
    while e.has_unfinished:
        ids += [t for o in await e.step() if o.request_id == rid for t in o.token_ids]
    out.append(ids)
json.dumps(out)
"""


def test_the_real_model_on_the_tabs_default_cpu_path_gives_llama_cpps_greedy_ids(browser, base_url):
    """SmolLM2 on the default CPU path (8-bit activations into the 4-bit layers, 16-bit into the 8-bit head, every
    core): each of
    the golden prompts' 8 greedy ids equal to llama.cpp's (tests/golden/llama_golden.json) up to a position
    where llama.cpp's own top-1 / top-2 margin is a near tie."""
    booted = open_and_boot(browser, base_url + "?backend=cpu")
    try:
        info = wait_model(booted)
        assert info["model"] == "smollm2-135m-instruct" and info["cpu_linear"].endswith(
            ", 8-bit activations (relaxed SIMD)"), info
        got = booted.py(GREEDY.replace("PROMPTS", repr([c["prompt_ids"] for c in GOLDEN["cases"]])))
    finally:
        booted.page.close()
    for case, ids in zip(GOLDEN["cases"], got):
        assert len(ids) == 8, (case["name"], ids)
        pos = next((i for i, (a, b) in enumerate(zip(ids, case["output_ids"])) if a != b), None)
        print(case["name"], "equal" if pos is None else f"first difference at {pos}, margin "
              f"{case['top1_top2_margins'][pos]:.2f}")
        assert pos is None or near_tie(case["top1_top2_margins"][pos]), (case["name"], ids, case["output_ids"][:8])
