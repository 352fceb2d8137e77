# Runs inside the page's worker (Pyodide): the adapter's streaming-read bandwidth and the real model's decode
# step at several context lengths, on one backend. See bench/roofline.py.
import statistics
import time

import numpy as np

import kernel_calls as calls
from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.model_runner import ForwardBatch


async def stream_read_gb_s(ctx, mib=64, runs=5):
    """Bytes / time of the stream_read kernel over a `mib` MiB buffer (the local memory roofline)."""
    nbytes = mib << 20
    data = calls.upload(ctx, np.random.default_rng(0).integers(0, 2**32, nbytes // 4, dtype=np.uint32), "stream")
    out = ctx.buffer(256 * 64 * 4, "stream.out")
    t = await calls.time_call(ctx, ops.stream_read_call(nbytes), [data, out], 3, runs)
    data.destroy()
    out.destroy()
    return {"bytes": nbytes, **t, "gb_s_median": nbytes / t["median_ms"] / 1e6, "gb_s_best": nbytes / t["min_ms"] / 1e6}


async def alu_peak_gflops(ctx, iterations=1000, workgroups=64, runs=5):
    """Flops / time of the alu_peak kernel (register-only f32 multiply-adds): the local compute limit."""
    call = ops.alu_peak_call(iterations, workgroups)
    out = ctx.buffer(workgroups * 32 * 4, "alu.out")
    t = await calls.time_call(ctx, call, [out], 1, runs)
    out.destroy()
    flops = workgroups * 32 * iterations * ops.ALU_PEAK_FLOPS_PER_ITERATION
    return {"flops": flops, **t, "gflops_median": flops / t["median_ms"] / 1e6, "gflops_best": flops / t["min_ms"] / 1e6}


async def decode_step(b, context, reps=5):
    """One greedy decode step of one sequence at `context` tokens (KV slots hold whatever the pool holds:
    the step's cost does not depend on the values). Median wall ms, replay / Python split, crossings."""
    bs = b.block_size
    n_blocks = -(-context // bs)
    table = np.zeros((1, b.max_blocks_per_seq), np.int32)  # (1, max_blocks_per_seq)
    table[0, :n_blocks] = np.random.default_rng(context).permutation(b.num_blocks)[:n_blocks]  # scattered
    pos = context - 1
    batch = ForwardBatch(np.array([17], np.int32), np.array([pos], np.int32),
                         np.array([table[0, pos // bs] * bs + pos % bs], np.int32), np.array([0, 1], np.int32),
                         table, np.array([context], np.int32))
    await b.forward(batch, greedy=True)  # records (first time) and validates the plan
    walls, replays, pys, crossings = [], [], [], []
    for _ in range(reps):
        c0 = b.ctx.js_crossings
        t0 = time.perf_counter()
        await b.forward(batch, greedy=True)
        walls.append((time.perf_counter() - t0) * 1e3)
        replays.append(b.last_step_ms["replay"])
        pys.append(b.last_step_ms["python"])
        crossings.append(b.ctx.js_crossings - c0)
    return {"context": context, "step_ms": statistics.median(walls), "step_ms_min": min(walls),
            "replay_ms": statistics.median(replays), "backend_python_ms": statistics.median(pys),
            "js_crossings": sorted(set(crossings)), "samples_ms": [round(w, 2) for w in walls]}
