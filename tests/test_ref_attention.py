"""The numpy references of the KV-cache kernels against independently written dense attention."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pagedkv.kernels import ref_attention as ref


def scattered_cache(rng, lengths, num_blocks, block_size, n_kv, head_dim, dtype=np.float32):
    """Random caches plus per-sequence contiguous K/V written into shuffled, non-monotonic blocks."""
    k_cache = rng.standard_normal((num_blocks, block_size, n_kv, head_dim)).astype(dtype)
    v_cache = rng.standard_normal((num_blocks, block_size, n_kv, head_dim)).astype(dtype)
    needed = [-(-n // block_size) for n in lengths]
    perm = rng.permutation(num_blocks)[: sum(needed)]
    max_blocks = max(needed) + 1
    tables = np.zeros((len(lengths), max_blocks), dtype=np.int64)
    dense = []
    at = 0
    for s, n in enumerate(lengths):
        tables[s, : needed[s]] = perm[at: at + needed[s]]
        at += needed[s]
        k = rng.standard_normal((n, n_kv, head_dim)).astype(dtype)
        v = rng.standard_normal((n, n_kv, head_dim)).astype(dtype)
        for pos in range(n):  # one row at a time, not through ref.slots_of
            block = tables[s, pos // block_size]
            k_cache[block, pos % block_size] = k[pos]
            v_cache[block, pos % block_size] = v[pos]
        dense.append((k.astype(np.float64), v.astype(np.float64)))
    return k_cache, v_cache, tables, dense


def naive_attention(q_row, k, v, n_heads, scale):
    """Loop-form softmax attention of one query token (n_heads, d) over k, v (n, n_kv, d)."""
    n_kv = k.shape[1]
    out = np.zeros(q_row.shape, dtype=np.float64)
    for h in range(n_heads):
        kvh = h * n_kv // n_heads
        scores = [float(np.dot(q_row[h], k[t, kvh])) * scale for t in range(k.shape[0])]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        for t, w in enumerate(weights):
            out[h] += w / total * v[t, kvh]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block_size", [8, 16])
def test_paged_attention_ref_equals_naive_dense(dtype, block_size):
    rng = np.random.default_rng(1)
    lengths = [1, 37, block_size * 3, 70]
    n_heads, n_kv, d = 6, 2, 8
    k_cache, v_cache, tables, dense = scattered_cache(rng, lengths, 40, block_size, n_kv, d, dtype)
    q = rng.standard_normal((len(lengths), n_heads, d)).astype(np.float32)
    out = ref.paged_attention_ref(q, k_cache, v_cache, tables, np.array(lengths), 1 / math.sqrt(d))
    for s, (k, v) in enumerate(dense):
        np.testing.assert_allclose(out[s], naive_attention(q[s].astype(np.float64), k, v, n_heads, 1 / math.sqrt(d)),
                                   rtol=1e-12, atol=1e-12)


def test_prefill_ref_is_causal_with_cached_prefix():
    rng = np.random.default_rng(2)
    lengths = [20, 9, 33]
    q_lens = [5, 9, 1]  # 15 cached tokens + 5 new; no prefix; a decode-like single token
    n_heads, n_kv, d = 4, 4, 8
    k_cache, v_cache, tables, dense = scattered_cache(rng, lengths, 30, 8, n_kv, d)
    starts = np.concatenate([[0], np.cumsum(q_lens)])
    q = rng.standard_normal((starts[-1], n_heads, d)).astype(np.float32)
    out = ref.paged_prefill_attention_ref(q, k_cache, v_cache, tables, starts, np.array(lengths), 0.3)
    for s, (k, v) in enumerate(dense):
        for i in range(q_lens[s]):
            pos = lengths[s] - q_lens[s] + i
            want = naive_attention(q[starts[s] + i].astype(np.float64), k[: pos + 1], v[: pos + 1], n_heads, 0.3)
            np.testing.assert_allclose(out[starts[s] + i], want, rtol=1e-12, atol=1e-12)


def test_flash_decoding_partials_merge_to_full_attention():
    rng = np.random.default_rng(3)
    k_cache, v_cache, tables, dense = scattered_cache(rng, [203], 30, 16, 3, 8)
    q = rng.standard_normal((9, 8))
    for partition in (16, 48, 64, 203, 512):
        parts = ref.decode_partials_ref(q, k_cache, v_cache, tables[0], 203, 0.25, partition)
        assert len(parts) == -(-203 // partition)
        merged = ref.merge_partials_ref(parts)
        np.testing.assert_allclose(merged, naive_attention(q, *dense[0], 9, 0.25), rtol=1e-12, atol=1e-12)


def test_kv_write_ref_puts_each_row_in_its_slot():
    rng = np.random.default_rng(4)
    k_cache = np.zeros((5, 4, 2, 8), dtype=np.float16)
    v_cache = np.zeros_like(k_cache)
    k_new = rng.standard_normal((3, 2, 8)).astype(np.float32)
    v_new = rng.standard_normal((3, 2, 8)).astype(np.float32)
    k_out, v_out = ref.kv_write_ref(k_cache, v_cache, k_new, v_new, np.array([17, 2, 8]))
    assert np.array_equal(k_out[4, 1], k_new[0].astype(np.float16))
    assert np.array_equal(v_out[0, 2], v_new[1].astype(np.float16))
    assert np.array_equal(k_out[2, 0], k_new[2].astype(np.float16))
    assert np.count_nonzero(k_out) == 3 * 2 * 8 and np.count_nonzero(k_cache) == 0
    with pytest.raises(ValueError, match="repeated slot"):
        ref.kv_write_ref(k_cache, v_cache, k_new, v_new, np.array([1, 2, 1]))
    with pytest.raises(ValueError, match=r"\[0, 20\)"):
        ref.kv_write_ref(k_cache, v_cache, k_new, v_new, np.array([1, 2, 20]))


def test_copy_blocks_ref_copies_whole_blocks_and_rejects_races():
    k_cache = np.arange(6 * 2 * 1 * 4, dtype=np.float32).reshape(6, 2, 1, 4)
    v_cache = -k_cache
    k_out, v_out = ref.copy_blocks_ref(k_cache, v_cache, np.array([[4, 0], [1, 5]]))
    assert k_out[0].tolist() == k_cache[4].tolist() and v_out[5].tolist() == v_cache[1].tolist()
    assert k_out[1:5].tolist() == k_cache[1:5].tolist()
    with pytest.raises(ValueError, match="both a source and a destination"):
        ref.copy_blocks_ref(k_cache, v_cache, np.array([[1, 2], [2, 3]]))
    with pytest.raises(ValueError, match="destination block appears twice"):
        ref.copy_blocks_ref(k_cache, v_cache, np.array([[1, 2], [3, 2]]))


def test_bad_tables_are_rejected_with_the_reason():
    k_cache = np.zeros((4, 8, 1, 4), dtype=np.float32)
    q = np.zeros((1, 1, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="needs 3 blocks of 8"):
        ref.paged_attention_ref(q, k_cache, k_cache, np.array([[0, 1]]), np.array([17]), 1.0)
    with pytest.raises(ValueError, match=r"block ids must lie in \[0, 4\)"):
        ref.paged_attention_ref(q, k_cache, k_cache, np.array([[0, 4]]), np.array([9]), 1.0)
    with pytest.raises(ValueError, match=">= 1"):
        ref.paged_attention_ref(q, k_cache, k_cache, np.array([[0, 1]]), np.array([0]), 1.0)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        cache = np.zeros((4, 8, 2, 4), np.float32)
        ref.paged_attention_ref(np.zeros((1, 3, 4)), cache, cache, np.array([[0]]), np.array([3]), 1.0)


def test_gather_and_scatter_refs_move_whole_blocks():
    k_cache = np.arange(5 * 2 * 1 * 4, dtype=np.float32).reshape(5, 2, 1, 4)
    v_cache = -k_cache
    k_blocks, v_blocks = ref.gather_blocks_ref(k_cache, v_cache, np.array([3, 0]))
    assert k_blocks.tolist() == [k_cache[3].tolist(), k_cache[0].tolist()]
    assert v_blocks[1].tolist() == v_cache[0].tolist()
    k_out, v_out = ref.scatter_blocks_ref(k_cache, v_cache, np.array([1, 4]), k_blocks, v_blocks)
    assert k_out[1].tolist() == k_cache[3].tolist() and v_out[4].tolist() == v_cache[0].tolist()
    assert k_out[[0, 2, 3]].tolist() == k_cache[[0, 2, 3]].tolist()
    with pytest.raises(ValueError, match="appears twice"):
        ref.gather_blocks_ref(k_cache, v_cache, np.array([1, 1]))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        ref.gather_blocks_ref(k_cache, v_cache, np.array([5]))
    with pytest.raises(ValueError, match="must be \\(1, 2, 1, 4\\)"):
        ref.scatter_blocks_ref(k_cache, v_cache, np.array([1]), k_blocks, v_blocks)
