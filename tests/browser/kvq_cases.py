"""Cases for test_kv_dtypes.py, sent to the page's worker after kv_cases.py (whose helpers they use):
quantized KV caches (int8, fp8-e4m3, int4, int4-asym; f16 alongside) on the GPU vs pagedkv.kv.dtypes's numpy twin.
Caches go up as the words numpy packs (PackedKV) and come back as words, so comparisons are bit for bit."""
import math

import numpy as np

from pagedkv.kv.dtypes import PackedKV, pack_tokens


def hard_rows(rng, shape):
    """(num_tokens, n_kv, head_dim) f32 rows that stress the quantizers: magnitudes from 1e-3 to 1e3 per row,
    an outlier channel, a row of zeros, denormal-small rows, exact ties (k + 0.5) * scale and negative zeros;
    for int4-asym also exact ties m + (k + 0.5) * d and rows below 2^-14 (minimum 0, smallest f16 step)."""
    rows = rng.standard_normal(shape).astype(np.float32)
    rows *= (10.0 ** rng.uniform(-3, 3, shape[:2] + (1,))).astype(np.float32)
    rows[::5, :, 3] *= 40.0  # outlier channel
    rows[1] = 0.0
    rows[1, 0, 5] = -0.0
    if shape[0] > 2:
        rows[2] = rng.standard_normal(shape[1:]).astype(np.float32) * np.float32(1e-39)  # denormal: scale 0
    if shape[0] > 3:
        # 127 * 0.5 and friends: y = x / d lands exactly on .5 for an int8 group with amax 127 * d
        ties = (np.arange(shape[2]) % 16 - 8 + 0.5).astype(np.float32)
        ties[0] = 127.0
        rows[3] = ties
    if shape[0] > 5:
        # min -1 and max 14 in every group of 16: m = -1, d = 1, and x - m = k + 0.5 elsewhere
        asym_ties = (np.arange(shape[2]) % 15 - 0.5).astype(np.float32)
        asym_ties[::16], asym_ties[1::16] = -1.0, 14.0
        rows[4] = asym_ties
        rows[5] *= np.float32(2e-5) / np.abs(rows[5]).max()  # every |x| <= 2e-5 < 2^-14
    return rows


def as_storage(words, layout):
    """Packed words in the dtype KVCacheBuffers.upload takes (f16 caches go up as float16 values)."""
    return words.view(layout.storage_dtype).reshape(layout.storage_shape)


def as_words(array):
    """A cache read back (any storage dtype) as (num_blocks, block_size, token_u32s) u32."""
    return np.ascontiguousarray(array).view(np.uint32).reshape(array.shape[0], array.shape[1], -1)


async def kvq_write_case(seed, lengths, block_size, dtype, n_kv, head_dim):
    """kv_write of hard rows into scattered slots of a packed cache; u32 mismatches vs numpy pack_tokens."""
    rng = np.random.default_rng(seed)
    needed = sum(-(-n // block_size) for n in lengths)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), needed + 4)
    k0 = PackedKV.pack(rng.standard_normal(layout.shape).astype(np.float32), dtype)
    v0 = PackedKV.pack(rng.standard_normal(layout.shape).astype(np.float32), dtype)
    tables = block_tables(rng, lengths, block_size, layout.num_blocks)
    slots = np.concatenate([ref.slots_of(tables[s], np.arange(n), block_size) for s, n in enumerate(lengths)])
    slots = slots[rng.permutation(slots.size)]
    k_new = hard_rows(rng, (slots.size, n_kv, head_dim))
    v_new = hard_rows(rng, (slots.size, n_kv, head_dim))[::-1].copy()
    kk = await kernels(layout, n_kv)
    cache = KVCacheBuffers(kk.ctx, layout)
    cache.upload(as_storage(k0.words, layout), as_storage(v0.words, layout))
    await kk.kv_write(cache, k_new, v_new, slots)
    k_got, v_got = (as_words(c) for c in await cache.read())
    cache.destroy()
    k_want, v_want = ref.kv_write_ref(k0, v0, k_new, v_new, slots)
    bad = np.argwhere(k_got != k_want.words)[:6]  # (n, 3) block, offset, u32 index: for failure messages
    return {"tokens": int(slots.size), "words_per_token": int(k_got.shape[2]),
            "first_k_mismatches": [[int(i[2]), hex(k_got[tuple(i)]), hex(k_want.words[tuple(i)])] for i in bad],
            "k_mismatch": int((k_got != k_want.words).sum()), "v_mismatch": int((v_got != v_want.words).sum()),
            "untouched_equal": bool(np.array_equal(np.delete(k_got.reshape(-1, k_got.shape[2]), slots, axis=0),
                                                   np.delete(k0.words.reshape(-1, k_got.shape[2]), slots, axis=0)))}


async def kvq_decode_case(seed, lengths, block_size, dtype, n_heads, n_kv, head_dim, partition_tokens=128,
                          family="cpu"):
    """Decode attention over a packed cache vs the float64 reference over the same dequantized values."""
    rng = np.random.default_rng(seed)
    needed = sum(-(-n // block_size) for n in lengths)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), needed + 5)
    k = PackedKV.pack(rng.standard_normal(layout.shape).astype(np.float32), dtype)
    v = PackedKV.pack(rng.standard_normal(layout.shape).astype(np.float32), dtype)
    tables = block_tables(rng, lengths, block_size, layout.num_blocks)
    query = rng.standard_normal((len(lengths), n_heads, head_dim)).astype(np.float32)
    kk = await kernels(layout, n_heads, family, partition_tokens=partition_tokens)
    cache = KVCacheBuffers(kk.ctx, layout)
    cache.upload(k.words, v.words)
    got = await kk.paged_attention(cache, query, tables, np.array(lengths))
    cache.destroy()
    want = ref.paged_attention_ref(query, k, v, tables, np.array(lengths), 1 / math.sqrt(head_dim))
    plain = ref.paged_attention_ref(query, k.values(), v.values(), tables, np.array(lengths), 1 / math.sqrt(head_dim))
    return dict(errors(got, want), ref_consistent=bool(np.array_equal(want, plain)))


async def kvq_prefill_case(seed, chunks, block_size, dtype, n_heads, n_kv, head_dim, family="cpu"):
    """Chunked prefill: the chunk's K/V quantized by kv_write on the GPU, then attention over the packed cache;
    the reference quantizes with numpy (bit-identical, see kvq_write_case) and attends in float64."""
    rng = np.random.default_rng(seed)
    lengths = [c + n for c, n in chunks]
    needed = sum(-(-n // block_size) for n in lengths)
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, dtype), needed + 3)
    k0 = PackedKV.pack(rng.standard_normal(layout.shape).astype(np.float32), dtype)
    v0 = PackedKV.pack(rng.standard_normal(layout.shape).astype(np.float32), dtype)
    tables = block_tables(rng, lengths, block_size, layout.num_blocks)
    slots = np.concatenate([ref.slots_of(tables[s], np.arange(c, c + n), block_size)
                            for s, (c, n) in enumerate(chunks)])  # (num_new_tokens,)
    k_new = rng.standard_normal((slots.size, n_kv, head_dim)).astype(np.float32)
    v_new = rng.standard_normal((slots.size, n_kv, head_dim)).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum([n for _, n in chunks])])
    query = rng.standard_normal((slots.size, n_heads, head_dim)).astype(np.float32)
    kk = await kernels(layout, n_heads, family)
    cache = KVCacheBuffers(kk.ctx, layout)
    cache.upload(k0.words, v0.words)
    await kk.kv_write(cache, k_new, v_new, slots)
    got = await kk.prefill_attention(cache, query, starts, tables, np.array(lengths))
    cache.destroy()
    k_ref, v_ref = ref.kv_write_ref(k0, v0, k_new, v_new, slots)
    want = ref.paged_prefill_attention_ref(query, k_ref, v_ref, tables, starts, np.array(lengths),
                                           1 / math.sqrt(head_dim))
    return errors(got, want)


async def kvq_copy_swap_case(seed, dtype, block_size, pairs, out_ids, in_ids):
    """copy_blocks, then swap-out / swap-in of a packed cache (SmolLM2 heads): scales travel with their data."""
    rng = np.random.default_rng(seed)
    layout = GpuKVLayout(KVSpec(1, 3, 64, block_size, dtype), 12)
    k = PackedKV.pack(rng.standard_normal(layout.shape).astype(np.float32), dtype).words
    v = PackedKV.pack(rng.standard_normal(layout.shape).astype(np.float32), dtype).words
    kk = await kernels(layout, 3)
    cache = KVCacheBuffers(kk.ctx, layout)
    cache.upload(k, v)
    await kk.copy_blocks(cache, np.array(pairs))
    k_copied, v_copied = await cache.read()
    k_want, v_want = k.copy(), v.copy()
    for src, dst in pairs:
        k_want[dst], v_want[dst] = k[src], v[src]
    k_out, v_out = await kk.swap_out(cache, np.array(out_ids))
    await kk.swap_in(cache, np.array(in_ids), k_out, v_out)
    k_got, v_got = await cache.read()
    cache.destroy()
    k_after, v_after = k_want.copy(), v_want.copy()
    k_after[in_ids], v_after[in_ids] = k_want[out_ids], v_want[out_ids]
    return {"copy_equal": bool(np.array_equal(k_copied, k_want) and np.array_equal(v_copied, v_want)),
            "out_shape": list(k_out.shape), "out_dtype": str(k_out.dtype),
            "swap_out_equal": bool(np.array_equal(k_out, k_want[out_ids]) and np.array_equal(v_out, v_want[out_ids])),
            "swap_in_equal": bool(np.array_equal(k_got, k_after) and np.array_equal(v_got, v_after))}


async def kvq_tiny_greedy(block_size, kv_dtype, max_tokens=10):
    """The tiny model through LLMEngine on WebGPU vs the CPU engine, both with `kv_dtype` KV, same batching."""
    import engine_cases as ec
    from pagedkv.backends.cpu import CpuBackend
    from pagedkv.tokenizer import Tokenizer

    w = await ec.weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    b = await ec.backend("tiny-random", budget_bytes=8 * ec.MIB, block_size=block_size, kv_dtype=kv_dtype,
                         max_num_batched_tokens=24, max_num_seqs=4)
    config = dict(max_num_batched_tokens=24, max_num_seqs=4)
    gpu, stats = await ec.run_engine(b, tok, ec.TINY_PROMPTS, max_tokens, kv_dtype=kv_dtype, **config)
    backend_stats = b.stats()
    b.destroy()
    cpu_backend = CpuBackend(w, num_blocks=64, block_size=block_size, kv_dtype=kv_dtype)
    cpu, _ = await ec.run_engine(cpu_backend, tok, ec.TINY_PROMPTS, max_tokens, kv_dtype=kv_dtype, **config)
    return {"gpu": gpu, "cpu": cpu, "engine_kv_dtype": stats.get("kv_dtype"),
            "backend": backend_stats}
