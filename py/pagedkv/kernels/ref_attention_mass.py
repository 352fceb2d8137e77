"""Numpy reference of shaders/attention_mass.wgsl: attention mass per block-table entry (importance eviction).

For every sequence, query head and new query token, the softmax probability of each key the token may see
(causal, through the block table), summed per block-table entry. Pure numpy (CPython and Pyodide).
"""
from __future__ import annotations

import numpy as np

from .ref_attention import attend, check_block_tables, check_cache, check_heads, check_query_start_loc, \
    gather_sequence


def attention_mass_ref(query: np.ndarray, k_cache: np.ndarray, block_tables: np.ndarray,
                       query_start_loc: np.ndarray, context_lens: np.ndarray, scale: float) -> np.ndarray:
    """query (num_tokens, n_heads, head_dim) over k_cache (num_blocks, block_size, n_kv_heads, head_dim)
    -> mass (num_seqs, n_heads, max_blocks_per_seq) float64."""
    check_cache(k_cache, k_cache)
    num_blocks, block_size, n_kv, _ = k_cache.shape
    block_tables, context_lens = check_block_tables(block_tables, context_lens, num_blocks, block_size)
    n_heads = query.shape[1]
    check_heads(n_heads, n_kv)
    starts = check_query_start_loc(query_start_loc, context_lens, query.shape[0])
    mass = np.zeros((context_lens.size, n_heads, block_tables.shape[1]), np.float64)
    for s, length in enumerate(context_lens):
        q0, q1 = int(starts[s]), int(starts[s + 1])
        k = gather_sequence(k_cache, block_tables[s], int(length))  # (length, n_kv, d)
        scores, _ = attend(query[q0:q1], k, k, n_heads, scale)  # (n_heads, q_len, length)
        seen = int(length) - (q1 - q0) + np.arange(q1 - q0)  # (q_len,) cache index of each new token
        scores[:, np.arange(int(length))[None, :] > seen[:, None]] = -np.inf
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        per_key = p.sum(axis=1)  # (n_heads, length)
        entry = np.arange(int(length)) // block_size  # (length,)
        for h in range(n_heads):
            mass[s, h] = np.bincount(entry, weights=per_key[h], minlength=block_tables.shape[1])
    return mass
