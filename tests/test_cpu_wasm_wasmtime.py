"""The built wasm kernels themselves (dist/wasm's bytes: build.wasm_modules) run in CPython by wasmtime
(tests/wasm_kernels.py: how each call's buffers are placed in wasmtime's memory), against the numpy twins and
f64: the cases the browser tests run in Chromium's worker (tests/browser/cpu_wasm_cases.py), with the same bounds
(tests/browser/test_cpu_wasm_page.py's docstring), the module without relaxed SIMD, the shared-memory module
on two threads at once, and the tiny model's greedy ids through every kernel.

Gemma 3 270M runs as the tab holds it on two threads (wasm_kernels.WasmThreads: linear_threads.js's split of
every product, its 262,144-row head included, on one SharedMemory) to llama.cpp's greedy ids.

Not covered here: web/linear_threads.js itself (its workers, Atomics and chunk counter: the browser tests run
it), and wasmtime's code generation is not V8's (the same module, another compiler: rounding is the module's,
so the bounds hold on both).
"""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import wasmtime
from llama_reference import near_tie
from model_fixtures import REAL_MODEL_DIR, gemma3_gguf, gemma_dir, real_weights, tiny_dir  # noqa: F401  (fixtures)
from test_cpu_linear import prefill_then_decode
from wasm_kernels import MIN_KEYS, WasmKernels, WasmThreads, engine, modules, spans

from pagedkv.backends.cpu import CpuBackend, allocate_pages, plan_pages
from pagedkv.backends.cpu_attention import PointerTwin
from pagedkv.backends.cpu_wasm import (ACT8, ACT16, KINDS, HeapStore, SharedStore, address_of, chunks, d_pad, d_rows,
                                      pointer_twin, quant_x_twin, row_steps, split_d_rows, stack_projections,
                                      tensor_loader)
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.retention import KVRetention, ShiftOp
from pagedkv.model.convert import convert_cached
from pagedkv.model.weights import ModelWeights, read_manifest
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).parent / "browser"))
import cpu_wasm_cases as cases  # noqa: E402  (the browser tests' cases, run here on wasmtime)

GOLDEN = json.loads((Path(__file__).parent / "golden" / "llama_golden.json").read_text(encoding="utf-8"))
GEMMA3_GOLDEN = json.loads((Path(__file__).parent / "golden" / "gemma3_golden.json").read_text(encoding="utf-8"))
SCALED_BOUND = 2e-6  # as the browser tests: only the f32 summation order differs from f64's product
CASES = [(d, r, c) for d in ("q4_1", "q8_0") for r, c in ((37, 96), (1, 32), (192, 576))] + [
    (d, 37, 256) for d in ("q4_K", "q5_K", "q6_K", "q5_0")]
TOKENS = (1, 5, 37)


@pytest.fixture(scope="module")
def kernels():
    return WasmKernels("linear_relaxed")


def test_the_four_modules_validate_with_only_the_proposals_they_name():
    """linear and linear_shared need neither relaxed SIMD nor, for linear, threads; the relaxed ones need it;
    the shared ones import a shared memory of at most 65536 pages (4 GiB), the others a plain one."""
    plain, full = engine(relaxed=False), engine()
    for name, data in modules().items():
        assert wasmtime.Module.validate(full, data) is None, name
        if "relaxed" in name:
            with pytest.raises(wasmtime.WasmtimeError, match="relaxed"):
                wasmtime.Module.validate(plain, data)
        else:
            assert wasmtime.Module.validate(plain, data) is None, name
        (memory,) = wasmtime.Module(full, data).imports
        limits = memory.type.limits
        assert (memory.module, memory.name, memory.type.is_shared) == ("env", "memory", name.endswith("_shared"))
        assert (limits.min, limits.max) == ((1, 65536) if name.endswith("_shared") else (1, None))
    assert sorted(modules()) == ["linear", "linear_relaxed", "linear_relaxed_shared", "linear_shared"]


def test_spans_merge_overlapping_and_touching_regions():
    assert spans([(100, 8), (104, 8), (112, 4), (200, 0), (300, 16), (50, 4)]) == [(50, 54), (100, 116), (300, 316)]


@pytest.mark.parametrize("dtype,rows,cols", CASES)
def test_the_kernel_matches_numpy(kernels, dtype, rows, cols):
    r = cases.case_linear(HeapStore(kernels.matmul), dtype, rows, cols, TOKENS)
    assert r["rows_exact"] and r["shapes"] == [[t, rows, "float32"] for t in TOKENS], r
    assert r["max_scaled"] <= SCALED_BOUND, r


@pytest.mark.parametrize("activations", ["int16", "int8"])
def test_integer_activations_match_the_integer_twin_and_each_token_alone(kernels, activations):
    """As the browser test: the twin's integer block sums times f32 scales, within 2^-20 of the unit sum; each
    token's row bit-identical to its product alone; int8 takes 4-bit codes at 8 bits (relaxed SIMD)."""
    got = [cases.case_linear_integer(HeapStore(kernels.matmul, activations), d, r, c) for d, r, c in CASES]
    assert [r["bits"] for r in got] == [8 if activations == "int8" and d in ("q4_1", "q4_K", "q5_K", "q5_0") else 16
                                        for d, _, _ in CASES], got
    assert max(r["max_scaled"] for r in got) <= 2.0**-20 and all(r["as_alone"] for r in got), got


def test_quant_x_exports_write_the_twins_blocks_bit_for_bit(kernels):
    """quant_x / quant_x8 (one scale a 32-value block, codes nearest, ties to even) as cpu_wasm.quant_x_twin."""
    x = (np.random.default_rng(4).standard_normal((3, 96)) * 3).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: d 0, codes 0
    x[1, 5] = np.float32(2.5) * (np.abs(x[1, :32]).max() / np.float32(32767))  # scaled, a tie to even
    for bits, export, size in ((16, kernels.quant_x, 3 * 3 * 72), (8, kernels.quant_x8, 3 * 3 * 40)):
        got, want = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
        export(address_of(x), 3, 3, address_of(got))
        quant_x_twin(address_of(x), 3, 3, address_of(want), bits)
        assert np.array_equal(got, want), bits


# (ctx, nkv, group, hd, new tokens) and (ctx, nkv, group, hd, lo): the browser tests' shapes, trimmed
ATTENTION = [(1, 3, 3, 64, 1), (37, 3, 3, 64, 1), (300, 3, 3, 64, 1), (5, 2, 2, 16, 1), (33, 1, 4, 32, 1),
             (37, 3, 3, 64, 37), (300, 3, 3, 64, 21), (33, 1, 4, 32, 2)]
DECODE = [(1, 3, 3, 64, 0), (17, 3, 3, 64, 0), (300, 3, 3, 64, 0), (5, 2, 2, 16, 0), (33, 1, 4, 32, 0),
          (40, 3, 3, 64, 7), (40, 3, 3, 64, 15), (520, 1, 4, 256, 9)]


def test_the_attention_kernels_match_f64(kernels):
    for case in ATTENTION:
        r = cases.case_attention(kernels, *case)
        ctx, _, _, hd, _ = case
        assert r["finite"] and r["unseen_untouched"], r
        assert r["scores_rel"] <= hd * 2.0**-24 and r["values_rel"] <= ctx * 2.0**-24, r


def test_attn_decode_rotates_writes_and_attends_in_one_call(kernels):
    for case in DECODE:
        r = cases.case_attn_decode(kernels, *case)
        assert r["written"] and r["finite"] and r["rel"] <= 1.0 and r["masked_zero"], r
        assert r["probs_sum"] <= (case[0] + 8) * 2.0**-24, r


# (ctx, nkv, group, hd, nq, window): a whole prompt, a chunk after cached tokens, GQA, windows inside and across
# blocks, Gemma 3's 256-wide heads
PREFILL = [(37, 3, 3, 64, 37, 0), (300, 3, 3, 64, 21, 0), (33, 1, 4, 32, 2, 0), (5, 2, 2, 16, 5, 0),
           (90, 1, 4, 64, 40, 7), (120, 3, 3, 64, 50, 33), (70, 1, 4, 256, 30, 16)]


def test_attn_prefill_attends_every_query_in_one_call(kernels):
    for case in PREFILL:
        r = cases.case_attn_prefill(kernels, *case)
        assert r["finite"] and r["rel"] <= 1.0, r


@pytest.mark.parametrize("n", [2, 3])
def test_attn_prefill_on_the_kernel_threads_gives_the_one_calls_bits(kernels, n):
    """A prompt chunk's attention split by queries across threads sharing one memory (WasmThreads, as
    web/linear_threads.js splits it: the table's K and V blocks copied in, the last queries first, each chunk the
    last queries of a shorter context) gives every output the bits of the export's one call; each thread ran
    chunks of the 512-query case."""
    threads = WasmThreads(n)
    for case in PREFILL + [(600, 3, 3, 64, 512, 0)]:
        r = cases.case_attn_prefill_threads(kernels, threads, *case)
        assert r["finite"] and r["same_bits"] and r["inputs_kept"], r
    assert [nq for nq, _ in threads.attention] == [c[4] for c in PREFILL] + [512]
    assert [sum(ran) for _, ran in threads.attention] == [-(-c[4] // -(-c[4] // (8 * n))) for c in PREFILL] + [
        -(-512 // -(-512 // (8 * n)))]
    assert min(threads.attention[-1][1]) > 0, threads.attention


@pytest.mark.parametrize("n", [2, 3])
def test_attn_prefill_over_the_kv_mirror_gives_the_one_calls_bits(kernels, n):
    """The same split, the threads reading the table's blocks in the pools' mirror (no copies)."""
    threads = WasmThreads(n)
    for case in PREFILL + [(600, 3, 3, 64, 512, 0)]:
        r = cases.case_attn_prefill_threads(kernels, threads, *case, mirrored=True)
        assert r["finite"] and r["same_bits"] and r["inputs_kept"], r


# (ctx, nkv, group, hd, lo): SmolLM2's heads, Gemma 3's one kv head of four, groups of one and two, a window's lo
DECODE_THREADS = [(1, 3, 3, 64, 0), (37, 3, 3, 64, 0), (560, 3, 3, 64, 0), (300, 1, 4, 256, 0), (45, 2, 1, 32, 0),
                  (70, 2, 2, 16, 21), (5, 8, 2, 64, 0)]


@pytest.mark.parametrize("n", [2, 3])
def test_attn_decode_on_the_kernel_threads_gives_the_one_calls_bits(kernels, n):
    """A decode step's attention shared by threads over the KV mirror (WasmThreads, as web/linear_threads.js:
    rope_kv into the mirrors, the new row copied into the pools, the scores of chunks of the keys' blocks on every
    thread, the softmax, the values of chunks of each head's dims on every thread) gives the output, the pools
    and the mirrors the bits of the export's one call; below MIN_KEYS keys one thread runs it all."""
    threads = WasmThreads(n)
    for case in DECODE_THREADS:
        r = cases.case_attn_decode_threads(kernels, threads, *case)
        assert r["finite"] and r["same_bits"] and r["pools_same"] and r["mirrors_same"], r
    for (ctx, keys, dims), (_, _, _, hd, _) in zip(threads.decodes, DECODE_THREADS):
        blocks, lines = -(-ctx // 16), hd // 16  # the keys' blocks, the 64-byte lines of a head's row
        if ctx < MIN_KEYS:
            assert (keys, dims) == ([1], [1]), (ctx, keys, dims)
        else:  # CHUNKS_PER_THREAD chunks of blocks a thread, one chunk of lines
            assert (len(keys), sum(keys)) == (n, -(-blocks // -(-blocks // (8 * n)))), (ctx, keys)
            assert (len(dims), sum(dims)) == (n, -(-lines // -(-lines // n))), (ctx, dims)


def test_the_one_token_steps_glue_matches_f64(kernels):
    for n in (64, 576, 1536):
        r = cases.case_step_glue(kernels, n)
        bound = n / 8 + 4
        assert r["add_exact"] and r["norm_ulps"] <= bound and r["add_ulps"] <= bound and r["silu_ulps"] <= 8, r
        assert r["gelu_ulps"] <= 8 and r["rows_as_alone"] and r["acts_as_alone"], r


def test_without_relaxed_simd_the_plain_module_gives_the_same_16_bit_products_and_its_8_bit_ones_trap(kernels):
    """An engine without relaxed SIMD (a browser without it) runs `linear` (build.without_relaxed): 16-bit
    products bit-identical to linear_relaxed's, the 8-bit kernel `unreachable`."""
    plain = WasmKernels("linear", relaxed=False)
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    qs = np.arange(64, dtype=np.uint8).reshape(2, 32)
    dm = np.tile(np.array([0.5, -0.25], np.float32), (2, 2, 1))
    outs, scratch = [np.zeros(2, np.float32) for _ in range(2)], np.zeros(64, np.float32)
    for out, k in zip(outs, (plain, kernels)):
        k.matmul(ACT16, address_of(qs), address_of(dm), 2, 64, address_of(x), 1, address_of(out), 2,
                 address_of(scratch))
    assert np.array_equal(outs[0], outs[1]) and np.all(outs[0] != 0), outs
    with pytest.raises(wasmtime.Trap, match="unreachable"):
        plain.matmul(ACT8, address_of(qs), address_of(dm), 2, 64, address_of(x), 1, address_of(outs[0]), 2,
                     address_of(scratch))


def test_the_shared_module_on_two_threads_at_once_gives_one_instances_products():
    """linear_relaxed_shared on one wasmtime SharedMemory, an instance (and store) per Python thread, each taking
    chunks of a weight's rows as web/linear_threads.js's workers do (cpu_wasm.chunks; out's rows the whole
    weight's apart): the rows bit-identical to one instance's product over all of them."""
    rows, cols, t = 192, 576, 5
    rng = np.random.default_rng(8)
    qs = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    dm = rng.standard_normal((rows, cols // 32, 2)).astype(np.float32)
    x = rng.standard_normal((t, cols)).astype(np.float32)
    want, scratch = np.zeros((t, rows), np.float32), np.zeros(cols, np.float32)
    WasmKernels("linear_relaxed").matmul(0, address_of(qs), address_of(dm), rows, cols, address_of(x), t,
                                         address_of(want), rows, address_of(scratch))

    threads = WasmThreads(threads=2, min_work=1)  # its two threads claim cpu_wasm.chunks as linear_threads.js's
    got = np.zeros((t, rows), np.float32)
    threads.matmul(0, threads.place(address_of(qs), qs.nbytes), threads.place(address_of(dm), dm.nbytes), rows, cols,
                   address_of(x), t, address_of(got))
    # Two threads shared the work and every chunk ran once. Which thread ran how many is the scheduler's choice: on
    # a loaded machine one thread can claim every chunk before the other starts.
    assert threads.products[-1][3] == 2 and sum(threads.products[-1][4]) == len(chunks(rows, 2)) > 1
    assert np.array_equal(got, want)


# f32: only summation orders differ. int8: both quantize each layer's input, which differs in its last bits between
# the two, so a code now and then lands one step apart (measured 1.1e-5; int8's own rounding is 2.7% of f32's).
@pytest.mark.parametrize("activations,most", [("f32", 2e-6), ("int8", 1e-4)])
def test_the_tiny_model_through_every_kernel_gives_the_twins_ids(tiny_dir, activations, most):  # noqa: F811
    """CpuBackend on the tiny model with every projection (stacked, as the tab holds them) through the wasm
    matmul and every attention call through the wasm kernels: prefill and six greedy steps, the one-token
    steps fused (attn_decode, the glue), logits within `most` of the numpy twins' (pointer_twin, PointerTwin)
    largest, the same ids."""
    weights = ModelWeights.load(tiny_dir)
    shards = {s["file"]: (tiny_dir / s["file"]).read_bytes() for s in weights.manifest["shards"]}
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, weights.config.vocab, 40)]
    wasm = WasmKernels("linear_relaxed")
    runs = []
    for matmul, attention in ((pointer_twin, PointerTwin()), (wasm.matmul, wasm)):
        w = ModelWeights.from_shards(weights.manifest, shards, tensor_loader(HeapStore(matmul, activations)))
        stack_projections(w.tensors, w.config.n_layers)
        runs.append(prefill_then_decode(CpuBackend(w, 4, 16, linear="wasm", attention=attention), prompt, 6))
    (want_pre, want_dec), (got_pre, got_dec) = runs
    assert 0 < float(np.abs(got_pre - want_pre).max() / np.abs(want_pre).max()) <= most
    assert np.array_equal(got_pre.argmax(axis=1), want_pre.argmax(axis=1))
    assert [int(g.argmax()) for g in got_dec] == [int(w.argmax()) for w in want_dec]
    assert wasm.calls["attn_decode"] == 6 * weights.config.n_layers and wasm.calls["add_rms_norm"] > 0, wasm.calls


@pytest.mark.parametrize("pages", [False, True])
def test_the_kv_mirror_takes_every_write_and_threads_decode_as_one_thread_does(gemma_dir, pages):  # noqa: F811
    """A tiny random Gemma 3 (KV groups, window layers) on two kernel threads with the KV mirror (SharedStore on
    WasmThreads: each decode step's attention on both threads over it, prompts read in place) against one thread
    on Pyodide-like memory (HeapStore), its own pools or shared pages: two requests at once (prompts in chunks,
    steps of two sequences through the reference's loop, one step of one through the tape) under a shifted
    window give the same ids; after them and after each of the backend's other writes (copy_blocks, swap_in,
    write_blocks, shift_keys) the mirror holds the pools' bits; a write past the backend (numpy's alone) shows."""
    weights = ModelWeights.load(gemma_dir)
    shards = {s["file"]: (gemma_dir / s["file"]).read_bytes() for s in weights.manifest["shards"]}
    retention = KVRetention(window_tokens=16, sink_tokens=4)
    wasm = WasmKernels("linear_relaxed")

    def run(store) -> tuple[list[list[int]], CpuBackend]:
        w = ModelWeights.from_shards(weights.manifest, shards, tensor_loader(store))
        stack_projections(w.tensors, w.config.n_layers)
        shared = None
        if pages:
            page, (size,) = plan_pages([w.config], 16)
            shared = allocate_pages(40, page)
            assert size == 16
        backend = CpuBackend(w, 40, 16, num_cpu_blocks=4, linear="wasm", attention=wasm, pages=shared)
        engine = LLMEngine(backend, Tokenizer.from_manifest(weights.manifest), EngineConfig(max_num_batched_tokens=32))
        reqs = [engine.request(engine.add_request(list(range(3, 3 + n)), SamplingParams(
            max_tokens=m, stop_token_ids=(10_000,)), retention=retention)) for n, m in ((40, 30), (21, 12))]
        while engine.has_unfinished:
            run_sync(engine.step())
        return [r.output_ids for r in reqs], backend

    threads = WasmThreads(2)
    want, _ = run(HeapStore(wasm.matmul, "f32"))
    got, backend = run(SharedStore(threads, "f32"))
    assert got == want and len(got[0]) == 30, (got, want)
    assert len(threads.decodes) > 0 and len(threads.attention) > 0  # both paths took the mirror
    kv = backend.kv
    pools = [*kv.k, *kv.v]
    assert threads.mirror_differs(pools) == []
    writes = [lambda: backend.copy_blocks([(1, 5)]), lambda: backend.swap_out([(2, 0)]),
              lambda: backend.swap_in([(0, 6)]), lambda: backend.write_blocks([7], run_sync(backend.read_blocks([3]))),
              lambda: backend.shift_keys([ShiftOp(1, 3, 0)])]
    for write in writes:
        before = [p.copy() for p in pools]
        run_sync(write())
        assert threads.mirror_differs(pools) == [], write
    assert any(not np.array_equal(a, b) for a, b in zip(before, pools))  # the last write moved something
    kv.k[0][9] += 1.0  # numpy alone, past the backend
    assert threads.mirror_differs(pools) == [0]


def test_threads_whose_memory_cannot_take_the_kv_mirror_keep_the_one_thread_attention(tiny_dir):  # noqa: F811
    """Where the threads' memory cannot grow by the pools' bytes (the third mirror throws, as linear_threads.js's
    does at the shared memory's maximum), the backend still builds: the mirrors made are dropped, mirror_error
    says why (and kernel_note, for the device panel), and each decode step's attention runs the export on one
    thread, giving the same ids."""
    weights = ModelWeights.load(tiny_dir)
    shards = {s["file"]: (tiny_dir / s["file"]).read_bytes() for s in weights.manifest["shards"]}
    wasm = WasmKernels("linear_relaxed")

    class Full(WasmThreads):
        def mirror(self, address: int, nbytes: int) -> int:
            if len(self.mirrors) == 2:
                raise RuntimeError("the kernel threads' shared memory cannot grow by 64 KiB past 4096 MiB")
            return super().mirror(address, nbytes)

    runs = []
    for threads in (WasmThreads(2), Full(2)):
        w = ModelWeights.from_shards(weights.manifest, shards, tensor_loader(SharedStore(threads, "f32")))
        stack_projections(w.tensors, w.config.n_layers)
        backend = CpuBackend(w, 4, 16, linear="wasm", attention=wasm)
        calls = wasm.calls.get("attn_decode", 0)
        _, steps = prefill_then_decode(backend, list(range(1, 12)), 4)
        runs.append(([int(s.argmax()) for s in steps], backend.model.mirror_error, len(threads.mirrors),
                     len(threads.decodes), wasm.calls.get("attn_decode", 0) - calls, backend.kernel_note))
    n = weights.config.n_layers
    assert runs[0][1:] == (None, 2 * n, 4 * n, 0, None), runs[0]
    assert runs[1][0] == runs[0][0] and runs[1][2:5] == (0, 0, 4 * n), runs[1]
    assert "no KV mirror" in runs[1][1] and "cannot grow" in runs[1][1], runs[1]
    # the device panel's words (app/pagedkv_app/cpu_models.kernel_words puts them after the kernels')
    assert runs[1][5] == runs[1][1] + ", so decode attention runs on one thread", runs[1]


def test_hybrid_models_shifted_window_through_the_wasm_kernels_gives_the_twins_ids(gemma_dir):  # noqa: F811
    """KVRetention on the tab's CPU path: a tiny random Gemma 3 (1 full and 5 window KV groups of 2 layers) with
    every projection and attention call through the wasm kernels, under a shifted 16-token request window (it binds
    the 32-token window layers too): a 40-token prompt's 40 greedy ids equal those of the numpy twins and of the
    plain numpy engine under the same window (tests/test_kv_retention_groups.py holds that one to the oracle; this
    prompt has no near tie there), so the pools the wasm attention reads are the ones the window's shifts rotate."""
    weights = ModelWeights.load(gemma_dir)
    shards = {s["file"]: (gemma_dir / s["file"]).read_bytes() for s in weights.manifest["shards"]}
    retention = KVRetention(window_tokens=16, sink_tokens=4)
    wasm = WasmKernels("linear_relaxed")

    def greedy(backend) -> tuple[list[int], int]:
        engine = LLMEngine(backend, Tokenizer.from_manifest(weights.manifest),
                           EngineConfig(max_num_batched_tokens=32))
        req = engine.request(engine.add_request(list(range(3, 43)), SamplingParams(max_tokens=40,
                                                stop_token_ids=(10_000,)), retention=retention))
        while engine.has_unfinished:
            run_sync(engine.step())
        return req.output_ids, engine.stats()["shifted_blocks"]

    runs = [greedy(CpuBackend(weights, 40, 16))]
    for matmul, attention in ((pointer_twin, PointerTwin()), (wasm.matmul, wasm)):
        w = ModelWeights.from_shards(weights.manifest, shards, tensor_loader(HeapStore(matmul, "f32")))
        stack_projections(w.tensors, w.config.n_layers)
        runs.append(greedy(CpuBackend(w, 40, 16, linear="wasm", attention=attention)))
    print(runs)  # pytest -s
    assert runs[0] == runs[1] == runs[2] and runs[0][1] > 0
    assert wasm.calls["attn_decode"] >= 39 * weights.config.n_layers, wasm.calls


def test_smollm2_on_the_tabs_default_kernels_gives_llama_cpps_greedy_ids(real_weights):  # noqa: F811
    """SmolLM2-135M as the tab's default CPU path holds it (8-bit activations into the 4-bit layers, 16-bit into
    the 8-bit head; q|k|v and gate|up stacked; the fused one-token step), every kernel call in wasmtime: a golden
    prompt's 8 greedy ids equal to llama.cpp's (tests/golden/llama_golden.json) up to a position where llama.cpp's
    own top-1 / top-2 margin is a near tie."""
    shards = {s["file"]: (REAL_MODEL_DIR / s["file"]).read_bytes() for s in real_weights.manifest["shards"]}
    wasm = WasmKernels("linear_relaxed")
    w = ModelWeights.from_shards(real_weights.manifest, shards, tensor_loader(HeapStore(wasm.matmul, "int8")))
    stack_projections(w.tensors, w.config.n_layers)
    case = GOLDEN["cases"][0]
    got = cases.greedy(CpuBackend(w, 4, 16, linear="wasm", attention=wasm).model, case["prompt_ids"], 7)["ids"]
    pos = next((i for i, (a, b) in enumerate(zip(got, case["output_ids"])) if a != b), None)
    assert len(got) == 8 and (pos is None or near_tie(case["top1_top2_margins"][pos])), (got, case["output_ids"][:8])
    assert wasm.calls["attn_decode"] == 7 * w.config.n_layers, wasm.calls


def test_8_bit_code_rows_take_the_general_loops_arithmetic_bit_for_bit(kernels):
    """kind 1 (q8_0) one-token rows with 16-bit activations run linear.wat's $dot_q8_x16, a loop without the
    general $dot_x16's branches and mins: the same weights as kind 17 (q8_m) with mins 0, which take $dot_x16,
    give the same bits, on both sides of a 4-token tile."""
    rows, cols = 64, 640
    rng = np.random.default_rng(11)
    qs = rng.integers(-128, 128, (rows, cols), dtype=np.int8)
    dm = np.stack([rng.random((rows, cols // 32)).astype(np.float32) * 0.02,
                   np.zeros((rows, cols // 32), np.float32)], axis=2)
    scratch = np.zeros(4 * cols, np.float32)
    for t in (1, 5):
        x = (rng.standard_normal((t, cols)) * 3).astype(np.float32)
        got, want = (np.zeros((t, rows), np.float32) for _ in range(2))
        for kind, out in ((KINDS["q8_0"], got), (KINDS["q8_m"], want)):
            kernels.matmul(kind | ACT16, address_of(qs), address_of(dm), rows, cols, address_of(x), t,
                           address_of(out), rows, address_of(scratch))
        assert np.array_equal(got.view(np.int32), want.view(np.int32)) and np.abs(want).min() > 0, t


@pytest.mark.parametrize("cols", [640, 576])  # Gemma 3's head rows and SmolLM2's
def test_d_only_rows_give_the_d_m_rows_bits(kernels, cols):
    """kind 65 (q8_d, cpu_wasm.head_blocks: q8_0 codes with one f32 d a block, each row's d then its codes in one
    array, cpu_wasm.d_rows: the output head's layout) against kind 1 with the same d as (d, 0) pairs apart: the
    same bits for one token and for five (q8_d takes them one at a time, kind 1 four in a tile), negative and zero
    d among them, and for a chunk of rows from its own row on; the twin (pointer_twin) gives kind 1's twin's
    bits; with f32 activations the kernel traps."""
    rows, nb, rng = 40, cols // 32, np.random.default_rng(cols)
    qs = rng.integers(-127, 128, (rows, cols), dtype=np.int8)
    d = (rng.random((rows, nb)) * 0.02).astype(np.float16).astype(np.float32)  # q8_0's d: f16 values
    d[0, :2], d[1, nb - 1] = [-0.01, 3e-6], 0.0
    dm = np.stack([d, np.zeros((rows, nb), np.float32)], axis=2)
    packed = d_rows(qs, d)  # q8_d's one array: each row's d, padding to 16 bytes, its codes
    # Gemma's 20 d fill 80 bytes; SmolLM2's 18 (72 bytes) are padded to 80
    assert packed.shape == (rows, d_pad(nb) + cols) and d_pad(nb) == 80
    assert all(np.array_equal(a, b) for a, b in zip(split_d_rows(packed, nb), (qs, d)))
    d_only = (address_of(packed) + d_pad(nb), address_of(packed))  # qs at row 0's codes, dm at its d
    scratch = np.zeros(4 * cols, np.float32)
    for t in (1, 5):
        x = (rng.standard_normal((t, cols)) * 3).astype(np.float32)
        outs = [np.zeros((t, rows), np.float32) for _ in range(4)]
        pairs = (address_of(qs), address_of(dm))
        for (kind, at, run), out in zip(((65, d_only, kernels.matmul), (1, pairs, kernels.matmul),
                                         (65, d_only, pointer_twin), (1, pairs, pointer_twin)), outs):
            run(kind | ACT16, *at, rows, cols, address_of(x), t, address_of(out), rows, address_of(scratch))
        assert np.array_equal(outs[0].view(np.int32), outs[1].view(np.int32)) and np.abs(outs[1]).min() > 0, t
        assert np.array_equal(outs[2].view(np.int32), outs[3].view(np.int32)), t
    # rows 7..40 alone (a thread's chunk: both pointers a whole row on, cpu_wasm.row_steps) give the same rows
    step = row_steps(65, nb)
    assert step == (d_pad(nb) + cols,) * 2
    part = np.zeros((1, rows - 7), np.float32)
    kernels.matmul(65 | ACT16, d_only[0] + 7 * step[0], d_only[1] + 7 * step[1], rows - 7, cols, address_of(x[:1]), 1,
                   address_of(part), rows - 7, address_of(scratch))
    assert np.array_equal(part.view(np.int32), outs[0][:1, 7:].view(np.int32))
    with pytest.raises(wasmtime.Trap, match="unreachable"):
        kernels.matmul(65, *d_only, rows, cols, address_of(x), 1, address_of(outs[0]), rows, address_of(scratch))


def test_gemma3_on_two_kernel_threads_gives_llama_cpps_greedy_ids(gemma3_gguf):  # noqa: F811
    """Gemma 3 270M as the tab's default CPU path holds it on two threads: every projection and the tied
    262,144-row head placed once in one SharedMemory (cpu_wasm.SharedStore on WasmThreads), each product's rows
    split between two threads, 8-bit activations into 4-bit codes and 16-bit into 8-bit ones, attention
    through the kernels, each decode step's layers through the one-token step as Gemma's declaration says, the
    head held without its zero mins (cpu_wasm.head_blocks). A golden prompt's 8 greedy ids equal llama.cpp's
    (tests/golden/gemma3_golden.json) up
    to a near tie of llama.cpp's own; every head product (prefill's last token, 7 decode steps) ran on both
    threads."""
    converted = convert_cached(gemma3_gguf, Path(__file__).resolve().parent.parent / ".cache" / "models")
    manifest = read_manifest(converted)
    shards = {s["file"]: (converted / s["file"]).read_bytes() for s in manifest["shards"]}
    threads, wasm = WasmThreads(2), WasmKernels("linear_relaxed")
    w = ModelWeights.from_shards(manifest, shards, tensor_loader(SharedStore(threads, "int8")))
    stack_projections(w.tensors, w.config.n_layers)
    case = GEMMA3_GOLDEN["cases"][0]
    got = cases.greedy(CpuBackend(w, 4, 16, linear="wasm", attention=wasm).model, case["prompt_ids"], 7)["ids"]
    pos = next((i for i, (a, b) in enumerate(zip(got, case["output_ids"])) if a != b), None)
    assert len(got) == 8 and (pos is None or near_tie(case["margins"][pos])), (got, case["output_ids"][:8])
    # each decode step's every layer through the one-token step: q / k norms, GeGLU, post norms in the kernels;
    # the prompt's GeGLU in one call a layer (gelu_tanh_mul_rows)
    n = w.config.n_layers
    assert [wasm.calls.get(e, 0) for e in ("attn_decode", "rms_norm_rows", "gelu_tanh_mul", "rms_norm", "attn_prefill",
                                           "gelu_tanh_mul_rows")] == [0, 7 * 2 * n, 7 * n, 7 * (2 * n + 1), 0, n]
    # the prompt's attention on both threads (its 6 queries a chunk each), none through the one-thread export; each
    # decode step's through the threads' attn_decode over the KV mirror (under MIN_KEYS keys: on one of them)
    assert [(nq, sum(ran)) for nq, ran in threads.attention] == [(6, 6)] * n, threads.attention
    assert [ctx for ctx, _, _ in threads.decodes] == [ctx for ctx in range(7, 14) for _ in range(n)]
    assert w.tensors["token_embd.weight"].kind == "q8_d"  # the head without its zero mins (cpu_wasm.head_blocks)
    heads = [p for p in threads.products if p[0] == w.config.vocab]
    assert [(p[2], p[3]) for p in heads] == [(1, 2)] * 8 and all(min(p[4]) > 0 for p in heads), heads
