"""Worker side of bench/kv_kernels.py: times the KV-cache kernels on the page's WebGPU device.

Installed into the Pyodide worker as bench.page.kv_kernels. Each figure is the median over `reps` submits of the wall time
from submit to onSubmittedWorkDone, divided by `inner` (the kernel's dispatches repeated `inner` times in
one submit, so the per-submit overhead is amortised). Never asserts on time.
"""
import statistics

import numpy as np

from pagedkv.browser import interop as webgpu
from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout, KVCacheBuffers
from pagedkv.kernels import ref_attention as ref
from pagedkv.kv.spec import KVSpec

_BENCH = {}


async def bench_context():
    if "ctx" not in _BENCH:
        _BENCH["ctx"] = await webgpu.GpuContext.create()
    return _BENCH["ctx"]


def tables_for(lengths, block_size, num_blocks, paged, rng):
    """Identity tables (block i of the batch is physical block i) or a random permutation of the pool."""
    order = rng.permutation(num_blocks) if paged else np.arange(num_blocks)
    needed = [-(-n // block_size) for n in lengths]
    tables = np.zeros((len(lengths), max(needed)), dtype=np.int64)
    at = 0
    for s, n in enumerate(needed):
        tables[s, :n] = order[at:at + n]
        at += n
    return tables


async def time_prepared(ctx, prepared, reps, inner):
    ctx.submit(prepared.dispatches * inner)  # warm-up
    await ctx.done()
    times = []
    for _ in range(reps):
        t0 = ctx.now_ms()
        ctx.submit(prepared.dispatches * inner)
        await ctx.done()
        times.append((ctx.now_ms() - t0) / inner)
    return statistics.median(times)


async def _attention_setup(kind, context, batch, block_size, dtype, n_heads, n_kv, head_dim, partition_tokens,
                           workgroup_size, head_tile, q_len, layouts, query_tile=4):
    """Kernels, a random cache (pool twice the batch's blocks) and one Prepared per table layout."""
    ctx = await bench_context()
    rng = np.random.default_rng(0)
    lengths = [context] * batch
    num_blocks = sum(-(-n // block_size) for n in lengths) * 2
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), num_blocks)
    kk = await KVKernels(ctx, layout, n_heads, partition_tokens=partition_tokens,
                         workgroup_size=workgroup_size, head_tile=head_tile, query_tile=query_tile).compile()
    cache = KVCacheBuffers(ctx, layout)
    cache.upload(*(rng.standard_normal(layout.shape).astype(layout.np_dtype) for _ in range(2)))
    prepared = []
    for paged in layouts:
        tables = tables_for(lengths, block_size, num_blocks, paged, rng)
        if kind == "decode":
            query = rng.standard_normal((batch, n_heads, head_dim)).astype(np.float32)
            prepared.append(kk.prepare_paged_attention(cache, query, tables, np.array(lengths)))
        else:
            query = rng.standard_normal((batch * q_len, n_heads, head_dim)).astype(np.float32)
            starts = np.arange(batch + 1) * q_len
            prepared.append(kk.prepare_prefill_attention(cache, query, starts, tables, np.array(lengths)))
    return kk, cache, layout, prepared


async def bench_attention(kind, context, batch=1, block_size=16, dtype="f32", n_heads=9, n_kv=3, head_dim=64,
                          paged=True, partition_tokens=128, workgroup_size=16, reps=11, inner=4, q_len=512,
                          head_tile=None, query_tile=4):
    """Median ms of one decode (`kind`="decode") or prefill (`kind`="prefill", q_len new tokens) dispatch."""
    kk, cache, layout, (prepared,) = await _attention_setup(
        kind, context, batch, block_size, dtype, n_heads, n_kv, head_dim, partition_tokens, workgroup_size,
        head_tile, q_len, (paged,), query_tile)
    ms = await time_prepared(kk.ctx, prepared, reps, inner)
    prepared.destroy()
    cache.destroy()
    kv_bytes = 2 * batch * context * n_kv * head_dim * layout.np_dtype.itemsize
    return {"kernel": kind, "context": context, "batch": batch, "block_size": block_size, "dtype": dtype,
            "paged": paged, "partition_tokens": partition_tokens, "workgroup_size": workgroup_size,
            "head_tile": kk.head_tile, "query_tile": kk.query_tile, "ms": round(ms, 4), "kv_GB_per_s": round(kv_bytes / ms / 1e6, 3)}


async def bench_paged_vs_contiguous(kind, context, batch=1, block_size=16, dtype="f32", n_heads=9, n_kv=3,
                                    head_dim=64, rounds=9, inner=4, q_len=512):
    """Scattered vs identity block table on the same cache, timed alternately (the machine's load drifts):
    medians of each and the median of the per-round ratios paged / contiguous."""
    kk, cache, layout, (paged, contiguous) = await _attention_setup(
        kind, context, batch, block_size, dtype, n_heads, n_kv, head_dim, 128, 16, None, q_len, (True, False))
    t_paged, t_contig, ratios = [], [], []
    for _ in range(rounds):
        t_paged.append(await time_prepared(kk.ctx, paged, 1, inner))
        t_contig.append(await time_prepared(kk.ctx, contiguous, 1, inner))
        ratios.append(t_paged[-1] / t_contig[-1])
    paged.destroy()
    contiguous.destroy()
    cache.destroy()
    return {"kernel": kind, "context": context, "batch": batch, "block_size": block_size, "dtype": dtype,
            "rounds": rounds, "paged_ms": round(statistics.median(t_paged), 4),
            "contiguous_ms": round(statistics.median(t_contig), 4),
            "paged_over_contiguous": round(statistics.median(ratios), 3),
            "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)]}


async def bench_kv_write(num_tokens, block_size=16, dtype="f32", n_kv=3, head_dim=64, reps=7, inner=4):
    """Median ms of writing num_tokens K/V rows into scattered slots."""
    ctx = await bench_context()
    rng = np.random.default_rng(1)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), -(-num_tokens // block_size) * 2)
    kk = await KVKernels(ctx, layout, n_kv).compile()
    cache = KVCacheBuffers(ctx, layout)
    tables = tables_for([num_tokens], block_size, layout.num_blocks, True, rng)
    slots = ref.slots_of(tables[0], np.arange(num_tokens), block_size)
    rows = rng.standard_normal((num_tokens, n_kv, head_dim)).astype(np.float32)
    prepared = kk.prepare_kv_write(cache, rows, rows, slots)
    ms = await time_prepared(ctx, prepared, reps, inner)
    prepared.destroy()
    cache.destroy()
    return {"kernel": "kv_write", "tokens": num_tokens, "dtype": dtype, "ms": round(ms, 4)}
