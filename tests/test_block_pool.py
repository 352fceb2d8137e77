"""Exact-value tests of the block pool and CacheConfig on a tiny pool (10 blocks of 16)."""

import pytest

from pagedkv.kv.block_pool import BlockPool, OutOfBlocks
from pagedkv.config import CacheConfig

TOKENS = tuple(range(16))


def state(pool):
    return (pool.free_queue_ids(), [b.ref_count for b in pool.block_states()],
            [b.block_hash for b in pool.block_states()], pool.num_free, pool.num_cached, pool.num_used)


def test_fresh_pool_hands_out_ids_in_order():
    pool = BlockPool(10)
    assert pool.free_queue_ids() == list(range(10))
    assert pool.get_new_blocks(3) == [0, 1, 2]
    assert pool.free_queue_ids() == [3, 4, 5, 6, 7, 8, 9]
    assert (pool.num_used, pool.num_free, pool.num_cached) == (3, 7, 0)
    assert [pool.ref_count(i) for i in (0, 1, 2, 3)] == [1, 1, 1, 0]


def test_unhashed_blocks_return_to_the_head_and_are_reused_first():
    pool = BlockPool(10)
    a = pool.get_new_blocks(3)
    pool.get_new_blocks(2)                      # [3, 4]
    pool.free_blocks(reversed(a))               # frees 2, 1, 0 -> each pushed at the head
    assert pool.free_queue_ids() == [0, 1, 2, 5, 6, 7, 8, 9]
    assert pool.get_new_blocks(2) == [0, 1]


def test_hashed_blocks_go_to_the_tail_in_reverse_and_are_evicted_lru():
    pool = BlockPool(10)
    a = pool.get_new_blocks(3)                  # [0, 1, 2]; 0 and 1 are full
    pool.register(0, b"h0", TOKENS, None, None)
    pool.register(1, b"h1", TOKENS, (0, pool.block(0).epoch), None)
    pool.free_blocks(reversed(a))
    # 2 (unhashed) at the head; 1 then 0 at the tail: the prefix block is evicted last.
    assert pool.free_queue_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    assert (pool.num_free, pool.num_cached, pool.num_used) == (8, 2, 0)
    assert [pool.state_of(i) for i in (0, 1, 2)] == ["cached", "cached", "free"]
    assert pool.get_new_blocks(8) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert pool.get_new_blocks(1) == [1]        # evicts the tail block of the prefix first
    assert pool.cached_block(b"h1") is None
    assert pool.cached_block(b"h0") == pool.block(0) == (0, 0, b"h0", TOKENS, None, None, 1)
    assert (pool.num_cached, pool.free_queue_ids()) == (1, [0])


def test_touch_pulls_a_cached_block_out_of_the_middle():
    pool = BlockPool(10)
    a = pool.get_new_blocks(3)
    pool.register(1, b"h1", TOKENS, None, None)
    pool.free_blocks(reversed(a))               # 2 and 0 pushed at the head, 1 at the tail
    assert pool.free_queue_ids() == [0, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    pool.touch([1])
    assert pool.free_queue_ids() == [0, 2, 3, 4, 5, 6, 7, 8, 9]
    assert (pool.ref_count(1), pool.num_cached, pool.num_used) == (1, 0, 1)
    pool.touch([1])
    assert pool.ref_count(1) == 2
    pool.free_blocks([1])
    assert pool.free_queue_ids() == [0, 2, 3, 4, 5, 6, 7, 8, 9]
    pool.free_blocks([1])
    assert pool.free_queue_ids() == [0, 2, 3, 4, 5, 6, 7, 8, 9, 1]


def test_out_of_blocks_and_double_free_leave_state_unchanged():
    pool = BlockPool(10)
    pool.get_new_blocks(4)
    before = state(pool)
    with pytest.raises(OutOfBlocks, match="need 7 blocks, only 6"):
        pool.get_new_blocks(7)
    assert state(pool) == before
    pool.free_blocks([3])
    before = state(pool)
    with pytest.raises(ValueError, match="block 3 freed more often"):
        pool.free_blocks([2, 3])
    assert state(pool) == before
    with pytest.raises(ValueError, match="block 2 freed more often"):
        pool.free_blocks([2, 2])
    assert state(pool) == before


def test_register_rejects_free_partial_or_duplicate_blocks():
    pool = BlockPool(10)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError, match="not in use"):
        pool.register(5, b"x", TOKENS, None, None)
    with pytest.raises(ValueError, match="must hold its token ids"):
        pool.register(0, b"x", (), None, None)
    assert pool.register(0, b"x", TOKENS, None, None) == (0, 1)
    with pytest.raises(ValueError, match="already registered"):
        pool.register(1, b"x", TOKENS, None, None)
    pool.unregister(0)
    assert pool.cached_block(b"x") is None and pool.link(0) == (0, 2)


@pytest.mark.parametrize("n", [0, -1, True, 2.5])
def test_pool_rejects_bad_sizes(n):
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        BlockPool(n)


@pytest.mark.parametrize("bad, msg", [
    (dict(num_blocks=10, block_size=0), "block_size must be >= 1"),
    (dict(num_blocks=10, block_size=-16), "block_size must be >= 1"),
    (dict(num_blocks=10, block_size=12), "power of two"),
    (dict(num_blocks=10, block_size=128), r"one of \(8, 16, 32, 64\)"),
    (dict(num_blocks=10, block_size=4), r"one of \(8, 16, 32, 64\)"),
    (dict(num_blocks=10, block_size=16.0), "must be an int"),
    (dict(num_blocks=0), "num_blocks must be >= 1"),
    (dict(num_blocks=-3), "num_blocks must be >= 1"),
    (dict(num_blocks=True), "must be an int"),
    (dict(num_blocks=10, num_cpu_blocks=-1), "num_cpu_blocks must be >= 0"),
])
def test_cache_config_rejects_bad_sizes(bad, msg):
    with pytest.raises(ValueError, match=msg):
        CacheConfig(**bad)


def test_cache_config_from_budget_exact_blocks():
    # 1 GiB of SmolLM2-135M f16 KV (23,040 B/token) in blocks of 16 tokens.
    assert CacheConfig.from_budget(1 << 30, 23040, 16).num_blocks == 2912
    assert CacheConfig.from_budget(1 << 30, 46080, 32).num_blocks == 728  # 728.18
    with pytest.raises(ValueError, match="holds no block"):
        CacheConfig.from_budget(1000, 23040, 16)
    with pytest.raises(ValueError, match="budget_bytes must be >= 1"):
        CacheConfig.from_budget(0, 23040)
    for bs in (8, 16, 32, 64):
        assert CacheConfig(num_blocks=1, block_size=bs).block_size == bs
