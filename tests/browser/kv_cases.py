"""Cases for the KV-cache kernel tests; this file is sent to the page's worker and runs there (and under
CPython on wgpu-py for tests/native).

Each case builds random caches with scattered, non-monotonic block tables, runs a kernel on the GPU and
its numpy reference (pagedkv.kernels.ref_attention) on the same data, and returns the errors as JSON.
"""
import math

import numpy as np

from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout, KVCacheBuffers
from pagedkv.kernels import ref_attention as ref
from pagedkv.kv.spec import KVSpec

_STATE = {}


FAMILIES = {"cpu": ("cpu", False), "gpu": ("gpu", False), "gpu-sg": ("gpu", True)}  # name -> (family, subgroups)


async def kernels(layout, n_heads, family="cpu", **options):
    """Compiled kernels for a layout, on one device shared by every case (the page's, or wgpu-py's);
    family: whose decode attention, "gpu-sg" being the gpu family's subgroup variant."""
    if "ctx" not in _STATE:
        _STATE["ctx"] = await open_device()
    ctx = _STATE["ctx"]
    name, subgroups = FAMILIES[family]
    if subgroups and "subgroups" not in ctx.info.features:
        raise RuntimeError(f"{family} needs the subgroups feature; {ctx.info.name} has {sorted(ctx.info.features)}")
    return await KVKernels(ctx, layout, n_heads, family=name, subgroups=subgroups, **options).compile()


def block_tables(rng, lengths, block_size, num_blocks, contiguous=False):
    """(num_seqs, max_blocks) tables: shuffled physical blocks (or 0, 1, 2, ... when contiguous)."""
    needed = [-(-n // block_size) for n in lengths]
    if sum(needed) > num_blocks:
        raise ValueError(f"{sum(needed)} blocks needed, pool has {num_blocks}")
    order = np.arange(num_blocks) if contiguous else rng.permutation(num_blocks)
    tables = np.zeros((len(lengths), max(needed) + 1), dtype=np.int64)  # spare column: stride != used blocks
    at = 0
    for s, n in enumerate(needed):
        tables[s, :n] = order[at:at + n]
        at += n
    return tables


def random_cache(rng, layout):
    shape = layout.shape
    return (rng.standard_normal(shape).astype(layout.np_dtype), rng.standard_normal(shape).astype(layout.np_dtype))


def errors(got, want):
    diff = np.abs(got.astype(np.float64) - want)
    max_abs = float(diff.max())
    return {"max_abs": max_abs, "rel": max_abs / float(np.abs(want).max()), "shape": list(got.shape)}


def poisoned(tables, lengths, first_keys, block_size, k_cache, v_cache):
    """A window layer's view (f32 / f16 caches): each sequence's table entries of blocks wholly before its first
    visible key name one block of NaN (a released block's placeholder), which no kernel may read; returns the
    tables and caches the GPU gets (the reference keeps the originals)."""
    used = {int(b) for s, n in enumerate(lengths) for b in tables[s, : -(-n // block_size)]}
    nan_block = next(b for b in range(k_cache.shape[0] - 1, -1, -1) if b not in used)
    k_gpu, v_gpu, t_gpu = k_cache.copy(), v_cache.copy(), tables.copy()
    k_gpu[nan_block] = np.nan
    v_gpu[nan_block] = np.nan
    for s, first in enumerate(first_keys):
        t_gpu[s, : max(0, first) // block_size] = nan_block
    return t_gpu, k_gpu, v_gpu


async def decode_case(seed, lengths, block_size, dtype, n_heads, n_kv, head_dim, partition_tokens=128, family="cpu",
                      head_major=True, window=0):
    """window > 0: a window layer's decode, the blocks before every window poisoned (poisoned())."""
    rng = np.random.default_rng(seed)
    needed = sum(-(-n // block_size) for n in lengths)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), needed + 5, head_major=head_major)
    k_cache, v_cache = random_cache(rng, layout)
    tables = block_tables(rng, lengths, block_size, layout.num_blocks)
    query = rng.standard_normal((len(lengths), n_heads, head_dim)).astype(np.float32)
    kk = await kernels(layout, n_heads, family, partition_tokens=partition_tokens)
    cache = KVCacheBuffers(kk.ctx, layout)
    gpu_tables, k_gpu, v_gpu = tables, k_cache, v_cache
    if window:
        gpu_tables, k_gpu, v_gpu = poisoned(tables, lengths, [n - window for n in lengths], block_size, k_cache,
                                              v_cache)
    cache.upload(k_gpu, v_gpu)
    prepared = kk.prepare_paged_attention(cache, query, gpu_tables, np.array(lengths), window=window)
    dispatches = len(prepared.dispatches)
    got = await kk.run(prepared, "paged_attention")
    cache.destroy()
    want = ref.paged_attention_ref(query, k_cache, v_cache, tables, np.array(lengths), 1 / math.sqrt(head_dim),
                                   window or None)
    partitions = -(-(-(-max(lengths) // block_size)) // kk.partition_blocks)
    kernels_run = [kk.decode.attention, kk.decode.reduce][:dispatches]
    return dict(errors(got, want), dispatches=dispatches, partitions=partitions, kernels=kernels_run)


async def decode_bad_table():
    """A block id past the pool must be refused with ValueError before anything is dispatched."""
    layout = GpuKVLayout(KVSpec(1, 3, 64, 16, "f32"), 8)
    kk = await kernels(layout, 9)
    cache = KVCacheBuffers(kk.ctx, layout)
    try:
        await kk.paged_attention(cache, np.zeros((2, 9, 64), np.float32), np.array([[0, 1], [8, 2]]),
                                 np.array([20, 5]))
    finally:
        cache.destroy()


async def prefill_case(seed, chunks, block_size, dtype, n_heads, n_kv, head_dim, window=0, **options):
    """chunks: (cached tokens, new tokens) per sequence; the new K/V go in with kv_write first. window > 0: a
    window layer's, the blocks before every window poisoned (poisoned())."""
    rng = np.random.default_rng(seed)
    lengths = [c + n for c, n in chunks]
    needed = sum(-(-n // block_size) for n in lengths)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), needed + 3)
    k_cache, v_cache = random_cache(rng, layout)
    tables = block_tables(rng, lengths, block_size, layout.num_blocks)
    slots = np.concatenate([ref.slots_of(tables[s], np.arange(c, c + n), block_size)
                            for s, (c, n) in enumerate(chunks)])  # (num_new_tokens,)
    k_new = rng.standard_normal((slots.size, n_kv, head_dim)).astype(np.float32)
    v_new = rng.standard_normal((slots.size, n_kv, head_dim)).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum([n for _, n in chunks])])
    query = rng.standard_normal((slots.size, n_heads, head_dim)).astype(np.float32)
    kk = await kernels(layout, n_heads, **options)
    cache = KVCacheBuffers(kk.ctx, layout)
    gpu_tables, k_gpu, v_gpu = tables, k_cache, v_cache
    if window:  # a chunk's first token, at cache index `cached`, sees keys from cached - window + 1 on
        gpu_tables, k_gpu, v_gpu = poisoned(tables, lengths, [c - window + 1 for c, _ in chunks], block_size,
                                              k_cache, v_cache)
    cache.upload(k_gpu, v_gpu)
    await kk.kv_write(cache, k_new, v_new, slots)
    got = await kk.prefill_attention(cache, query, starts, gpu_tables, np.array(lengths), window=window)
    cache.destroy()
    k_ref, v_ref = ref.kv_write_ref(k_cache, v_cache, k_new, v_new, slots)
    want = ref.paged_prefill_attention_ref(query, k_ref, v_ref, tables, starts, np.array(lengths),
                                           1 / math.sqrt(head_dim), window or None)
    return {**errors(got, want), "passes": kk.prefill_passes(np.array(lengths))}


async def same_bits_case(seed, chunks, block_sizes, n_heads, n_kv, head_dim, window=0, family="cpu"):
    """The same sequences' f16 K/V laid out in blocks of each of block_sizes (scattered tables): whether decode (one
    query after each sequence) and prefill (chunks: (cached, new) tokens, every token already in the cache) give
    the same output bits at every block size, the errors of the first against the reference, and the prefill
    passes at each block size."""
    rng = np.random.default_rng(seed)
    lengths = [c + n for c, n in chunks]
    keys = [rng.standard_normal((2, n, n_kv, head_dim)).astype(np.float16) for n in lengths]  # (K | V, token, ...)
    decode_q = rng.standard_normal((len(lengths), n_heads, head_dim)).astype(np.float32)
    prefill_q = rng.standard_normal((sum(n for _, n in chunks), n_heads, head_dim)).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum([n for _, n in chunks])])
    outs, first, passes = [], None, []
    for bs in block_sizes:
        layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, bs, "f16"), sum(-(-n // bs) for n in lengths) + 2)
        k_cache, v_cache = np.zeros(layout.shape, np.float16), np.zeros(layout.shape, np.float16)
        tables = block_tables(rng, lengths, bs, layout.num_blocks)
        for s, kv in enumerate(keys):
            t = np.arange(lengths[s])
            k_cache[tables[s, t // bs], t % bs], v_cache[tables[s, t // bs], t % bs] = kv[0], kv[1]
        kk = await kernels(layout, n_heads, family)
        cache = KVCacheBuffers(kk.ctx, layout)
        cache.upload(k_cache, v_cache)
        got = (await kk.paged_attention(cache, decode_q, tables, np.array(lengths), window=window),
               await kk.prefill_attention(cache, prefill_q, starts, tables, np.array(lengths), window=window))
        cache.destroy()
        outs.append(got)
        passes.append(kk.prefill_passes(np.array(lengths)))
        if first is None:
            scale = 1 / math.sqrt(head_dim)
            want = (ref.paged_attention_ref(decode_q, k_cache, v_cache, tables, np.array(lengths), scale,
                                            window or None),
                    ref.paged_prefill_attention_ref(prefill_q, k_cache, v_cache, tables, starts, np.array(lengths),
                                                    scale, window or None))
            first = {"decode": errors(got[0], want[0]), "prefill": errors(got[1], want[1])}
    same = [all(np.array_equal(o[i].view(np.uint32), outs[0][i].view(np.uint32)) for o in outs) for i in (0, 1)]
    return {**first, "decode_same_bits": same[0], "prefill_same_bits": same[1], "passes": passes}


async def kv_write_case(seed, lengths, block_size, dtype, n_kv, head_dim):
    """Writes every token of several sequences into scattered slots; returns mismatch counts."""
    rng = np.random.default_rng(seed)
    needed = sum(-(-n // block_size) for n in lengths)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), needed + 4)
    k_cache, v_cache = random_cache(rng, layout)
    tables = block_tables(rng, lengths, block_size, layout.num_blocks)
    slots = np.concatenate([ref.slots_of(tables[s], np.arange(n), block_size) for s, n in enumerate(lengths)])
    slots = slots[rng.permutation(slots.size)]  # tokens arrive in any order
    k_new = rng.standard_normal((slots.size, n_kv, head_dim)).astype(np.float32)
    v_new = rng.standard_normal((slots.size, n_kv, head_dim)).astype(np.float32)
    kk = await kernels(layout, n_kv)
    cache = KVCacheBuffers(kk.ctx, layout)
    cache.upload(k_cache, v_cache)
    await kk.kv_write(cache, k_new, v_new, slots)
    k_got, v_got = await cache.read()
    cache.destroy()
    k_want, v_want = ref.kv_write_ref(k_cache, v_cache, k_new, v_new, slots)
    return {"tokens": int(slots.size),
            "k_mismatch": int((k_got.view(np.uint16 if dtype == "f16" else np.uint32)
                               != k_want.view(np.uint16 if dtype == "f16" else np.uint32)).sum()),
            "v_mismatch": int((v_got.view(np.uint16 if dtype == "f16" else np.uint32)
                               != v_want.view(np.uint16 if dtype == "f16" else np.uint32)).sum()),
            "k_max_abs": float(np.abs(k_got.astype(np.float64) - k_want).max()),
            "untouched_equal": bool(np.array_equal(np.delete(k_got.reshape(-1, n_kv, head_dim), slots, axis=0),
                                                   np.delete(k_cache.reshape(-1, n_kv, head_dim), slots, axis=0)))}


async def copy_blocks_case(seed, num_blocks, block_size, dtype, n_kv, head_dim, pairs):
    rng = np.random.default_rng(seed)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), num_blocks)
    k_cache, v_cache = random_cache(rng, layout)
    kk = await kernels(layout, n_kv)
    cache = KVCacheBuffers(kk.ctx, layout)
    cache.upload(k_cache, v_cache)
    await kk.copy_blocks(cache, np.array(pairs))
    k_got, v_got = await cache.read()
    cache.destroy()
    k_want, v_want = ref.copy_blocks_ref(k_cache, v_cache, np.array(pairs))
    return {"k_equal": bool(np.array_equal(k_got.view(np.uint16), k_want.view(np.uint16))),
            "v_equal": bool(np.array_equal(v_got.view(np.uint16), v_want.view(np.uint16))),
            "blocks_changed": int(sum(not np.array_equal(k_got[b], k_cache[b]) for b in range(num_blocks)))}


async def swap_case(seed, num_blocks, block_size, dtype, n_kv, head_dim, out_ids, in_ids):
    """Swap blocks out to the host, then back in to other physical blocks; bit-exact comparisons."""
    rng = np.random.default_rng(seed)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), num_blocks)
    k_cache, v_cache = random_cache(rng, layout)
    kk = await kernels(layout, n_kv)
    cache = KVCacheBuffers(kk.ctx, layout)
    cache.upload(k_cache, v_cache)
    k_blocks, v_blocks = await kk.swap_out(cache, np.array(out_ids))
    await kk.swap_in(cache, np.array(in_ids), k_blocks, v_blocks)
    k_got, v_got = await cache.read()
    cache.destroy()
    k_out_ref, v_out_ref = ref.gather_blocks_ref(k_cache, v_cache, np.array(out_ids))
    k_ref, v_ref = ref.scatter_blocks_ref(k_cache, v_cache, np.array(in_ids), k_out_ref, v_out_ref)
    bits = np.uint16 if dtype == "f16" else np.uint32
    return {"out_shape": list(k_blocks.shape), "out_dtype": str(k_blocks.dtype),
            "swap_out_equal": bool(np.array_equal(k_blocks.view(bits), k_out_ref.view(bits))
                                   and np.array_equal(v_blocks.view(bits), v_out_ref.view(bits))),
            "swap_in_equal": bool(np.array_equal(k_got.view(bits), k_ref.view(bits))
                                  and np.array_equal(v_got.view(bits), v_ref.view(bits))),
            "blocks_changed": int(sum(not np.array_equal(k_got[b], k_cache[b]) for b in range(num_blocks)))}
