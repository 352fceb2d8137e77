"""Kernel timings in headless Chromium with WebGPU (SwiftShader on this machine): the model's kernels, or (--kv)
the KV-cache kernels.

    python3 -m bench.model_kernels [--runs 7] [--repeats 10]     (results/model_kernels.json)
    python3 -m bench.model_kernels --kv [--quick]                  (results/kv_kernels.json)

Prints JSON (`python3 -m bench` files it). Figures only; nothing here passes or fails on time.

The model's kernels: the adapter's streaming-read bandwidth, the fused-dequant matvec (decode) and tiled matmul
(prefill) at SmolLM2-135M shapes, and the small kernels.
`measure_in_worker` runs inside the page's Pyodide worker and times each kernel with
tests/browser/kernel_calls.time_call (wall clock around back-to-back dispatches, then a read
back that drains the queue). Every figure includes the fixed cost of one dispatch + submit,
reported on its own as `empty_dispatch`. Medians and minima over runs are both kept: other
jobs share this machine's two cores, and the minimum is the least disturbed sample.

--kv: decode and prefill attention times with a scattered (paged) block table vs an identity (contiguous) one on
the same cache at 512 and 4,096 context tokens, timed alternately, and their ratio; kv_write times; ablations
(head tile, partition size, workgroup size; not with --quick). Other jobs on the machine make single figures
noisy: compare the alternated pairs.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time

from bench import emit
from bench.harness import install_bench, session
from harness.chromium import find_chromium

LAYERS = 30  # SmolLM2-135M
MATVEC_SHAPES = [("q4_1", 576, 576), ("q4_1", 192, 576), ("q4_1", 1536, 576), ("q4_1", 576, 1536),
                 ("q8_0", 49152, 576)]  # q / o, k / v, gate / up, down, tied LM head
PER_LAYER = {(576, 576): 2, (192, 576): 2, (1536, 576): 2, (576, 1536): 1}  # matvecs of each shape per layer
# Every weight type's one-token matvec at the stacked gate|up shape, 576 -> 3072 (768 -> 3072 for the K-quants,
# whose rows are 256-weight super-blocks): random GGUF blocks, random normal f32 / f16 / bf16 weights (the timing
# does not depend on the values).
TYPE_SHAPE = (3072, 576)


async def measure_in_worker(runs: int, repeats: int, prefill_tokens: int, stream_mib: int) -> dict:
    """Runs in the worker: every figure of this benchmark as a dict (uses pagedkv, numpy and kernel_calls)."""
    import kernel_calls as calls
    import numpy as np

    from pagedkv.backends.webgpu import model_kernels as ops
    from pagedkv.browser.interop import GpuContext
    from pagedkv.kernels.ref_ops import rope_cos_sin
    from pagedkv.model.layout import pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0

    ctx = await GpuContext.create()
    rng = np.random.default_rng(0)

    async def timed(call, buffers, reps=repeats):
        return await calls.time_call(ctx, call, buffers, reps, runs)

    def rate(nbytes, t):
        return {"gb_s_median": nbytes / t["median_ms"] / 1e6, "gb_s_best": nbytes / t["min_ms"] / 1e6}

    result = {"adapter": ctx.info.name, "runs": runs, "repeats": repeats}
    nbytes = stream_mib * 2**20
    data = calls.upload(ctx, rng.integers(0, 2**32, nbytes // 4, dtype=np.uint32), "stream")
    out = ctx.buffer(256 * 64 * 4, "stream.out")
    t = await timed(ops.stream_read_call(nbytes), [data, out], reps=3)
    result["stream_read"] = {"bytes": nbytes, **t, **rate(nbytes, t)}
    data.destroy()

    tiny, ids = calls.upload(ctx, np.zeros(64, np.float32), "tiny"), ctx.buffer(16, "ids")
    result["empty_dispatch"] = await timed(ops.argmax_call(64, 1, workgroup_size=64), [tiny, ids])

    result["matvec"], result["matmul"] = [], []
    for dtype, rows, cols in MATVEC_SHAPES:
        w = rng.standard_normal((rows, cols), dtype=np.float32) * 0.05  # (rows, cols)
        parts = pack_q4_1(*quantize_q4_1(w)) if dtype == "q4_1" else pack_q8_0(*quantize_q8_0(w))
        scales = parts["dm" if dtype == "q4_1" else "d"]
        weights = [calls.upload(ctx, parts["qs"], "qs"), calls.upload(ctx, scales, "s")]
        weight_bytes = sum(len(v) for v in parts.values())
        # A batch of 4 decode tokens goes through matvec (8 rows x 1 token per thread) or matmul (4 x 4).
        for tokens, name, build_call in ((1, "matvec", ops.matvec_call), (4, "matvec", ops.matvec_call),
                                         (4, "matmul", ops.matmul_call)):
            x = calls.upload(ctx, rng.standard_normal((tokens, cols), dtype=np.float32), "x")
            y = ctx.buffer(tokens * rows * 4, "y")
            big = rows * cols * tokens > 2**24  # the LM head: a few repeats already take a second
            t = await timed(build_call(dtype, rows, cols, tokens), [*weights, x, y], reps=3 if big else repeats)
            moved = weight_bytes + tokens * (rows + cols) * 4
            result["matvec"].append({"kernel": f"{name}_{dtype}", "dtype": dtype, "rows": rows, "cols": cols,
                                     "tokens": tokens, "bytes": moved, **t, **rate(moved, t)})
        if (rows, cols) == (1536, 576):
            x = calls.upload(ctx, rng.standard_normal((prefill_tokens, cols), dtype=np.float32), "x")
            y = ctx.buffer(prefill_tokens * rows * 4, "y")
            for name, build_call in (("matmul", ops.matmul_call), ("matvec", ops.matvec_call)):
                t = await timed(build_call(dtype, rows, cols, prefill_tokens), [*weights, x, y], reps=1)
                flops = 2 * rows * cols * prefill_tokens
                result["matmul"].append({"kernel": f"{name}_{dtype}", "rows": rows, "cols": cols,
                                         "tokens": prefill_tokens, **t,
                                         "gflop_s_median": flops / t["median_ms"] / 1e6,
                                         "gflop_s_best": flops / t["min_ms"] / 1e6})

    from pagedkv.model.quantize import random_gguf
    from pagedkv.model.quants import WEIGHT_TYPES, pack_gguf

    def random_parts(dtype, rows, cols):
        if dtype in ops.QUANTIZED:
            return pack_gguf(dtype, random_gguf(dtype, rows, cols, seed=1), (rows, cols))
        w = np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32) * 0.05  # (rows, cols)
        raw = {"f32": w, "f16": w.astype("<f2"), "bf16": (w.view("<u4") >> 16).astype("<u2")}[dtype]
        return pack_gguf(dtype, raw, (rows, cols))  # normal floats: random bits would hold NaNs and infinities

    result["matvec_types"] = []
    for dtype in ops.LINEAR_TYPES:
        rows, cols = TYPE_SHAPE[0], -(-TYPE_SHAPE[1] // WEIGHT_TYPES[dtype].block) * WEIGHT_TYPES[dtype].block
        parts = random_parts(dtype, rows, cols)
        weights = [calls.upload(ctx, parts[p], p) for p in WEIGHT_TYPES[dtype].parts]
        x = calls.upload(ctx, rng.standard_normal((1, cols), dtype=np.float32), "x")
        t = await timed(ops.matvec_call(dtype, rows, cols, 1), [*weights, x, ctx.buffer(rows * 4, "y")])
        moved = sum(len(v) for v in parts.values()) + (rows + cols) * 4
        result["matvec_types"].append({"kernel": f"matvec_{dtype}", "dtype": dtype, "rows": rows, "cols": cols,
                                       "bits_per_weight": 8 * sum(len(v) for v in parts.values()) / (rows * cols),
                                       "bytes": moved, **t, **rate(moved, t)})

    small = {}
    x = calls.upload(ctx, rng.standard_normal(576, dtype=np.float32), "x")
    small["rmsnorm_576"] = await timed(ops.rmsnorm_call(576, 1, 1e-5), [x, x, ctx.buffer(576 * 4, "out")])
    qkv, q = calls.upload(ctx, np.zeros(960, np.float32), "qkv"), ctx.buffer(576 * 4, "q")
    k, v = ctx.buffer(192 * 4, "k"), ctx.buffer(192 * 4, "v")
    pos = calls.upload(ctx, np.array([8000], np.int32), "pos")
    table = calls.upload(ctx, rope_cos_sin(64, 1e5, 8192), "cs")
    small["rope_9q_3k"] = await timed(ops.rope_call(1, 9, 3, 64), [qkv, q, k, v, pos, table, qkv])  # zero bias
    logits = calls.upload(ctx, rng.standard_normal((1, 49152), dtype=np.float32), "logits")
    small["argmax_49152"] = await timed(ops.argmax_call(49152, 1), [logits, ctx.buffer(16, "ids")])
    result["small_kernels"] = small
    return result


def summarize(result: dict) -> dict:
    """Decode-step figures derived from the single-token matvec timings (weights streamed once per step)."""
    one = {(m["rows"], m["cols"]): m for m in result["matvec"] if m["tokens"] == 1 and m["kernel"].startswith("matvec")}
    out = {}
    for stat in ("median_ms", "min_ms"):
        ms = LAYERS * sum(n * one[s][stat] for s, n in PER_LAYER.items()) + one[(49152, 576)][stat]
        out[stat] = ms
    nbytes = LAYERS * sum(n * one[s]["bytes"] for s, n in PER_LAYER.items()) + one[(49152, 576)]["bytes"]
    dispatches = LAYERS * sum(PER_LAYER.values()) + 1
    return {"layers": LAYERS, "matvec_dispatches": dispatches, "bytes": nbytes, **out,
            "gb_s_median": nbytes / out["median_ms"] / 1e6, "gb_s_best": nbytes / out["min_ms"] / 1e6,
            "tok_s_bound_median": 1000.0 / out["median_ms"], "tok_s_bound_best": 1000.0 / out["min_ms"],
            "empty_dispatch_ms_included": dispatches * result["empty_dispatch"]["min_ms"],
            "min_ms_net_of_dispatch_cost": out["min_ms"] - dispatches * result["empty_dispatch"]["min_ms"]}


def measure(runs: int, repeats: int, prefill_tokens: int = 128, stream_mib: int = 64) -> dict:
    code = (f"MATVEC_SHAPES = {MATVEC_SHAPES!r}\nTYPE_SHAPE = {TYPE_SHAPE!r}\n" + inspect.getsource(measure_in_worker)
            + "\nimport json\n"
            f"json.dumps(await measure_in_worker({runs}, {repeats}, {prefill_tokens}, {stream_mib}))")
    with session() as page:
        page.install_test_modules("kernel_calls")
        result = page.py(code)
    result["decode_step_matvecs"] = summarize(result)
    result.update({"benchmark": "model_kernels", "chromium": find_chromium(),
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return result


def kv_runs(quick: bool) -> list[str]:
    calls = []
    for context in (512, 4096):
        for dtype in ("f32", "f16"):
            calls.append(f"bench_paged_vs_contiguous('decode', {context}, dtype={dtype!r})")
    calls.append("bench_paged_vs_contiguous('decode', 4096, batch=4)")
    # A 512-token prompt: 512 new query tokens over 512 keys.
    calls.append("bench_paged_vs_contiguous('prefill', 512, rounds=5, inner=1)")
    calls += ["bench_kv_write(1)", "bench_kv_write(512)", "bench_kv_write(512, dtype='f16')",
              "bench_kv_write(1, dtype='int8')", "bench_kv_write(512, dtype='int8')",
              "bench_kv_write(512, dtype='int4-asym')"]
    if not quick:  # the ablations behind the defaults
        for tile in (3, 1):
            calls.append(f"bench_attention('decode', 4096, head_tile={tile})")
        for tile in (4, 1):
            calls.append(f"bench_attention('prefill', 512, reps=3, inner=1, query_tile={tile})")
        for context in (512, 4096):
            for partition in (64, 128, 256, 512, 4096):
                calls.append(f"bench_attention('decode', {context}, partition_tokens={partition})")
        for wg in (4, 16, 64):
            calls.append(f"bench_attention('decode', 4096, workgroup_size={wg})")
    return calls


def measure_kv(quick: bool) -> dict:
    """The KV-cache kernels' timings, one call of bench/page/kv_kernels.py each."""
    with session() as page:
        install_bench(page, "page/kv_kernels.py")
        page.py("from bench.page.kv_kernels import *\nNone")
        results = []
        for call in kv_runs(quick):
            results.append(page.py(f"import json\njson.dumps(await {call})"))
            print(json.dumps(results[-1]), file=sys.stderr)
        adapter = json.loads(page.dataset()["adapter"])
    report = {"benchmark": "kv_kernels", "adapter": adapter["name"], "results": results}
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=10, help="dispatches per sample for the small kernels")
    parser.add_argument("--kv", action="store_true", help="the KV-cache kernels instead")
    parser.add_argument("--quick", action="store_true", help="--runs 3 --repeats 5; with --kv: skip the partition / "
                                                             "workgroup-size sweep")
    args = parser.parse_args(argv)
    if args.kv:
        emit(measure_kv(args.quick))
        return
    if args.quick:
        args.runs, args.repeats = 3, 5
    result = measure(args.runs, args.repeats)
    emit(result, indent=2)


if __name__ == "__main__":
    main()
