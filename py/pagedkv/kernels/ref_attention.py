"""Numpy references for the KV-cache kernels in shaders/ (the oracle the browser tests compare against).

Cache layout per layer, shared with the WGSL kernels: (num_blocks, block_size, n_kv_heads, head_dim),
one array for K and one for V. Token `pos` of a sequence lives in physical block
`block_table[pos // block_size]` at offset `pos % block_size`; its slot is
`physical * block_size + offset`. The caches hold float32 or float16 values, or are
pagedkv.kv.dtypes.PackedKV words of a quantized dtype (int8, fp8-e4m3, int4, int4-asym) exactly as the GPU
holds them, read through the same dequantizer; attention math runs in float64 here so the
reference error is negligible next to the GPU's.

Everything is pure numpy: it runs in CPython and in Pyodide.
"""
from __future__ import annotations

import numpy as np

from ..kv.dtypes import PackedKV

KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def check_cache(k_cache, v_cache) -> None:
    """K and V caches of one shape and one dtype: float32 / float16 arrays or PackedKV words."""
    if isinstance(k_cache, PackedKV) or isinstance(v_cache, PackedKV):
        if not (isinstance(k_cache, PackedKV) and isinstance(v_cache, PackedKV)) or (
                k_cache.shape, k_cache.dtype) != (v_cache.shape, v_cache.dtype):
            raise ValueError("K and V must both be PackedKV of one dtype and shape")
        return
    if k_cache.ndim != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"K and V caches must both be (num_blocks, block_size, n_kv_heads, head_dim), "
                         f"got {k_cache.shape} and {v_cache.shape}")
    if k_cache.dtype not in KV_DTYPES or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"KV caches must both be float32 or float16, got {k_cache.dtype} and {v_cache.dtype}")


def slots_of(block_table: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Slot (physical * block_size + offset) of each token position of one sequence."""
    positions = np.asarray(positions, dtype=np.int64)  # (n,)
    return np.asarray(block_table, dtype=np.int64)[positions // block_size] * block_size + positions % block_size


def check_kv_rows(k_new: np.ndarray, v_new: np.ndarray, slot_mapping: np.ndarray, cache_shape: tuple) -> np.ndarray:
    """Validate new K/V rows (num_tokens, n_kv_heads, head_dim) and their slots; returns slots as int64."""
    num_blocks, block_size, n_kv, head_dim = cache_shape
    slot_mapping = np.asarray(slot_mapping, dtype=np.int64)  # (num_tokens,)
    if slot_mapping.ndim != 1:
        raise ValueError(f"slot_mapping must be 1-D (num_tokens,), got shape {slot_mapping.shape}")
    if k_new.shape != (slot_mapping.shape[0], n_kv, head_dim) or v_new.shape != k_new.shape:
        raise ValueError(f"new K/V must be (num_tokens={slot_mapping.shape[0]}, {n_kv}, {head_dim}), "
                         f"got {k_new.shape} and {v_new.shape}")
    if slot_mapping.size and (slot_mapping.min() < 0 or slot_mapping.max() >= num_blocks * block_size):
        raise ValueError(f"slot_mapping must lie in [0, {num_blocks * block_size}), "
                         f"got range [{slot_mapping.min()}, {slot_mapping.max()}]")
    if np.unique(slot_mapping).size != slot_mapping.size:
        raise ValueError("slot_mapping has a repeated slot: two tokens cannot share one cache row")
    return slot_mapping


def kv_write_ref(k_cache: np.ndarray, v_cache: np.ndarray, k_new: np.ndarray, v_new: np.ndarray,
                 slot_mapping: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reshape-and-cache: row i of k_new/v_new (num_tokens, n_kv_heads, head_dim) goes to slot slot_mapping[i].

    Returns new caches (the inputs are not modified); values are rounded to the cache dtype.
    """
    check_cache(k_cache, v_cache)
    num_blocks, block_size, n_kv, head_dim = k_cache.shape
    slot_mapping = check_kv_rows(k_new, v_new, slot_mapping, k_cache.shape)
    if isinstance(k_cache, PackedKV):
        return k_cache.with_rows(k_new, slot_mapping), v_cache.with_rows(v_new, slot_mapping)
    k_out = k_cache.reshape(num_blocks * block_size, n_kv, head_dim).copy()
    v_out = v_cache.reshape(num_blocks * block_size, n_kv, head_dim).copy()
    k_out[slot_mapping] = k_new.astype(k_cache.dtype)
    v_out[slot_mapping] = v_new.astype(v_cache.dtype)
    return k_out.reshape(k_cache.shape), v_out.reshape(v_cache.shape)


def check_block_pairs(pairs: np.ndarray, num_blocks: int) -> np.ndarray:
    """Validate (src, dst) block pairs for copy_blocks; returns them as (n, 2) int64."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)  # (n, 2)
    if pairs.size and (pairs.min() < 0 or pairs.max() >= num_blocks):
        raise ValueError(f"block ids must lie in [0, {num_blocks}), got range [{pairs.min()}, {pairs.max()}]")
    src, dst = pairs[:, 0], pairs[:, 1]
    if np.unique(dst).size != dst.size:
        raise ValueError("copy_blocks: a destination block appears twice")
    if np.intersect1d(src, dst).size:
        raise ValueError("copy_blocks: a block is both a source and a destination; the copies would race")
    return pairs


def copy_blocks_ref(k_cache: np.ndarray, v_cache: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Copy whole blocks src -> dst in both caches (copy-on-write / swap staging). Returns new caches."""
    check_cache(k_cache, v_cache)
    pairs = check_block_pairs(pairs, k_cache.shape[0])
    k_out, v_out = k_cache.copy(), v_cache.copy()
    k_out[pairs[:, 1]] = k_cache[pairs[:, 0]]
    v_out[pairs[:, 1]] = v_cache[pairs[:, 0]]
    return k_out, v_out


def check_block_ids(block_ids: np.ndarray, num_blocks: int) -> np.ndarray:
    """Validate a list of distinct block ids for swap-out / swap-in; returns them as (n,) int64."""
    block_ids = np.asarray(block_ids, dtype=np.int64)  # (n,)
    if block_ids.ndim != 1 or block_ids.size == 0:
        raise ValueError(f"block ids must be a non-empty 1-D list, got shape {block_ids.shape}")
    if block_ids.min() < 0 or block_ids.max() >= num_blocks:
        raise ValueError(f"block ids must lie in [0, {num_blocks}), got range [{block_ids.min()}, {block_ids.max()}]")
    if np.unique(block_ids).size != block_ids.size:
        raise ValueError("a block id appears twice in the swap list")
    return block_ids


def gather_blocks_ref(k_cache: np.ndarray, v_cache: np.ndarray, block_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Swap-out staging: the listed blocks, in list order, (n, block_size, n_kv_heads, head_dim) each."""
    check_cache(k_cache, v_cache)
    block_ids = check_block_ids(block_ids, k_cache.shape[0])
    return k_cache[block_ids], v_cache[block_ids]


def scatter_blocks_ref(k_cache: np.ndarray, v_cache: np.ndarray, block_ids: np.ndarray, k_blocks: np.ndarray,
                       v_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Swap-in: block block_ids[i] becomes k_blocks[i] / v_blocks[i]. Returns new caches."""
    check_cache(k_cache, v_cache)
    block_ids = check_block_ids(block_ids, k_cache.shape[0])
    want = (block_ids.size,) + k_cache.shape[1:]
    if k_blocks.shape != want or v_blocks.shape != want:
        raise ValueError(f"swapped-in blocks must be {want}, got {k_blocks.shape} and {v_blocks.shape}")
    k_out, v_out = k_cache.copy(), v_cache.copy()
    k_out[block_ids] = k_blocks
    v_out[block_ids] = v_blocks
    return k_out, v_out


def check_block_tables(block_tables: np.ndarray, context_lens: np.ndarray, num_blocks: int,
                       block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate a batch's block tables (num_seqs, max_blocks_per_seq) against its context lengths."""
    block_tables = np.asarray(block_tables, dtype=np.int64)  # (num_seqs, max_blocks_per_seq)
    context_lens = np.asarray(context_lens, dtype=np.int64)  # (num_seqs,)
    if block_tables.ndim != 2 or context_lens.shape != (block_tables.shape[0],):
        raise ValueError(f"block_tables must be (num_seqs, max_blocks) and context_lens (num_seqs,), "
                         f"got {block_tables.shape} and {context_lens.shape}")
    if context_lens.size and context_lens.min() < 1:
        raise ValueError(f"every context length must be >= 1, got {context_lens.tolist()}")
    needed = -(-context_lens // block_size)  # (num_seqs,)
    if needed.size and needed.max() > block_tables.shape[1]:
        raise ValueError(f"a context of {context_lens.max()} tokens needs {needed.max()} blocks of {block_size}, "
                         f"but block_tables has only {block_tables.shape[1]} columns")
    for s, n in enumerate(needed):
        used = block_tables[s, :n]
        if used.size and (used.min() < 0 or used.max() >= num_blocks):
            raise ValueError(f"sequence {s}: block ids must lie in [0, {num_blocks}), got {used.tolist()}")
    return block_tables, context_lens


def gather_sequence(cache, block_table: np.ndarray, length: int) -> np.ndarray:
    """The first `length` rows of one sequence, in order: (length, n_kv_heads, head_dim) float64."""
    if isinstance(cache, PackedKV):
        cache = cache.values()  # (num_blocks, block_size, n_kv_heads, head_dim) f32
    block_size = cache.shape[1]
    slots = slots_of(block_table, np.arange(length), block_size)  # (length,)
    flat = cache.reshape(-1, cache.shape[2], cache.shape[3])
    return flat[slots].astype(np.float64)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_heads: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """q (n_q, n_heads, d) over k, v (n_k, n_kv, d) with GQA; every query sees every key given:
    scores (n_heads, n_q, n_k) and v repeated per query head (n_k, n_heads, d)."""
    n_kv = k.shape[1]
    group = n_heads // n_kv
    k_h = np.repeat(k, group, axis=1)  # (n_k, n_heads, d): query head h reads kv head h // group
    v_h = np.repeat(v, group, axis=1)  # (n_k, n_heads, d)
    scores = np.einsum("qhd,khd->hqk", q.astype(np.float64), k_h) * scale  # (n_heads, n_q, n_k)
    return scores, v_h


def _softmax_av(scores: np.ndarray, v_h: np.ndarray) -> np.ndarray:
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v_h)  # (n_q, n_heads, d)


def check_heads(n_heads: int, n_kv: int) -> None:
    """GQA needs a whole number of query heads per kv head."""
    if n_heads % n_kv:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv}) for GQA")


def paged_attention_ref(query: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
                        context_lens: np.ndarray, scale: float, window: int | None = None) -> np.ndarray:
    """Decode attention: one query token per sequence over its whole cached context (with window, over its
    last `window` keys: a window layer's).

    query (num_seqs, n_heads, head_dim) -> out (num_seqs, n_heads, head_dim) float64.
    """
    check_cache(k_cache, v_cache)
    num_blocks, block_size, n_kv, head_dim = k_cache.shape
    block_tables, context_lens = check_block_tables(block_tables, context_lens, num_blocks, block_size)
    check_heads(query.shape[1], n_kv)
    out = np.empty(query.shape, dtype=np.float64)  # (num_seqs, n_heads, head_dim)
    for s, length in enumerate(context_lens):
        k = gather_sequence(k_cache, block_tables[s], int(length))  # (length, n_kv, d)
        v = gather_sequence(v_cache, block_tables[s], int(length))  # (length, n_kv, d)
        scores, v_h = attend(query[s:s + 1], k, v, query.shape[1], scale)
        if window:
            scores[:, :, : max(0, int(length) - window)] = -np.inf
        out[s] = _softmax_av(scores, v_h)[0]
    return out


def paged_prefill_attention_ref(query: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                                block_tables: np.ndarray, query_start_loc: np.ndarray,
                                context_lens: np.ndarray, scale: float, window: int | None = None) -> np.ndarray:
    """Causal chunked-prefill attention through the block table (with window, a window layer's: the token at
    position p sees keys k with p - k < window).

    Sequence s owns query rows query_start_loc[s]:query_start_loc[s+1] (its q_len new tokens, already
    written to the cache); its context is context_lens[s] tokens, of which the first
    context_lens[s] - q_len were cached before this chunk (prefix-cache hits or earlier chunks).
    New token i sits at position context_lens[s] - q_len + i and sees keys 0..that position.
    query (num_tokens, n_heads, head_dim) -> out (num_tokens, n_heads, head_dim) float64.
    """
    check_cache(k_cache, v_cache)
    num_blocks, block_size, n_kv, head_dim = k_cache.shape
    block_tables, context_lens = check_block_tables(block_tables, context_lens, num_blocks, block_size)
    check_heads(query.shape[1], n_kv)
    starts = check_query_start_loc(query_start_loc, context_lens, query.shape[0])
    out = np.empty(query.shape, dtype=np.float64)  # (num_tokens, n_heads, head_dim)
    for s, length in enumerate(context_lens):
        q0, q1 = int(starts[s]), int(starts[s + 1])
        k = gather_sequence(k_cache, block_tables[s], int(length))  # (length, n_kv, d)
        v = gather_sequence(v_cache, block_tables[s], int(length))  # (length, n_kv, d)
        scores, v_h = attend(query[q0:q1], k, v, query.shape[1], scale)  # (n_heads, q_len, length)
        positions = int(length) - (q1 - q0) + np.arange(q1 - q0)  # (q_len,)
        future = np.arange(int(length))[None, :] > positions[:, None]  # (q_len, length)
        if window:
            future |= np.arange(int(length))[None, :] <= positions[:, None] - window
        scores[:, future] = -np.inf
        out[q0:q1] = _softmax_av(scores, v_h)
    return out


def check_query_start_loc(query_start_loc: np.ndarray, context_lens: np.ndarray, num_tokens: int) -> np.ndarray:
    """Validate cumulative query starts (num_seqs + 1,): 0, nondecreasing, each chunk within its context."""
    starts = np.asarray(query_start_loc, dtype=np.int64)  # (num_seqs + 1,)
    if starts.shape != (context_lens.shape[0] + 1,) or starts[0] != 0 or starts[-1] != num_tokens:
        raise ValueError(f"query_start_loc must be (num_seqs + 1,) from 0 to num_tokens={num_tokens}, "
                         f"got {starts.tolist()}")
    q_lens = np.diff(starts)  # (num_seqs,)
    if (q_lens < 1).any() or (q_lens > context_lens).any():
        raise ValueError(f"each sequence needs 1 <= q_len <= context_len, got q_lens {q_lens.tolist()} "
                         f"and context_lens {context_lens.tolist()}")
    return starts


def decode_partials_ref(query: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_table: np.ndarray,
                        length: int, scale: float, partition_tokens: int) -> list[tuple]:
    """Flash-decoding partial states of one sequence: per partition (max (h,), sum (h,), acc (h, d)).

    acc is the unnormalised sum of exp(score - max) * v over the partition's tokens; merge them with
    merge_partials_ref. This is the math the two WGSL passes split between them.
    """
    n_heads = query.shape[0]
    k = gather_sequence(k_cache, block_table, length)  # (length, n_kv, d)
    v = gather_sequence(v_cache, block_table, length)  # (length, n_kv, d)
    partials = []
    for t0 in range(0, length, partition_tokens):
        scores, v_h = attend(query[None], k[t0:t0 + partition_tokens], v[t0:t0 + partition_tokens], n_heads, scale)
        scores = scores[:, 0, :]  # (n_heads, n_k)
        m = scores.max(axis=-1)  # (n_heads,)
        p = np.exp(scores - m[:, None])  # (n_heads, n_k)
        partials.append((m, p.sum(axis=-1), np.einsum("hk,khd->hd", p, v_h)))
    return partials


def merge_partials_ref(partials: list[tuple]) -> np.ndarray:
    """Merge flash-decoding partial states into the normalised output (n_heads, head_dim)."""
    m_all = np.stack([p[0] for p in partials])  # (parts, n_heads)
    m = m_all.max(axis=0)  # (n_heads,)
    w = np.exp(m_all - m[None])  # (parts, n_heads)
    total = sum(w[i] * p[1] for i, p in enumerate(partials))  # (n_heads,)
    acc = sum(w[i][:, None] * p[2] for i, p in enumerate(partials))  # (n_heads, d)
    return acc / total[:, None]
