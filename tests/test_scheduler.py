"""Scheduler policy on tiny pools: exact batches, chunked prefill, prefix skips, preemption."""
from __future__ import annotations

import pytest

from pagedkv.config import CacheConfig
from pagedkv.kv.manager import KVCacheManager, NeverFits
from pagedkv.request import Request
from pagedkv.scheduler import Scheduler, SchedulerConfig
from pagedkv.sequence import Sequence, SequenceStatus


def make(num_blocks=10, cpu=0, budget=64, max_seqs=8, preemption="auto", swap_max_blocks=64):
    kv = KVCacheManager(CacheConfig(num_blocks=num_blocks, block_size=16, num_cpu_blocks=cpu))
    return Scheduler(SchedulerConfig(budget, max_seqs, preemption, swap_max_blocks), kv)


def req(name, prompt, max_tokens=8, priority=0):
    return Request(name, Sequence(list(prompt)), num_prompt_tokens=len(prompt), max_tokens=max_tokens,
                   priority=priority)


def run_step(s: Scheduler, next_token=7):
    """What the engine does after the forward: mark computed, append a sampled token if prefill is done."""
    out = s.schedule()
    for r, n in out.scheduled:
        s.kv.mark_computed(r.seq, n)
        if r.seq.num_computed_tokens == r.seq.num_tokens:
            r.append_token(next_token)
    return out


def test_chunked_prefill_and_decode_share_one_step():
    s = make(budget=40)
    a = req("a", range(30))
    s.add(a)
    out = run_step(s)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 30)]
    b = req("b", range(100, 150))  # 50 tokens: 39 fit next to a's decode token
    s.add(b)
    out = run_step(s)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 1), ("b", 39)]
    out = run_step(s)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 1), ("b", 11)]
    out = run_step(s)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 1), ("b", 1)]
    assert a.seq.block_table == [0, 1, 6] and b.seq.block_table == [2, 3, 4, 5]


def test_prefix_hit_skips_computed_tokens():
    s = make(budget=64)
    prompt = list(range(40))
    first = req("first", prompt)
    s.add(first)
    run_step(s)
    s.remove(first)
    second = req("second", prompt + [99, 98])
    s.add(second)
    out = run_step(s)
    # Two full blocks (32 tokens) come from the prefix cache; only 10 tokens are computed.
    assert [(r.request_id, n) for r, n in out.scheduled] == [("second", 10)]
    assert second.num_cached_prompt_tokens == 32


def test_priority_orders_waiting_requests():
    s = make(budget=20)
    low, high = req("low", range(20)), req("high", range(50, 70), priority=1)
    s.add(low)
    s.add(high)
    out = run_step(s)
    assert [r.request_id for r, _ in out.scheduled] == ["high"]


def test_never_fits_is_refused_before_any_work():
    s = make(num_blocks=4)
    with pytest.raises(NeverFits, match="KV pool only has 4 blocks"):
        s.add(req("huge", range(60), max_tokens=10))
    assert not s.has_work and s.kv.pool.num_free == 4


def test_waiting_requests_wait_and_never_preempt_running_ones():
    s = make(num_blocks=4, budget=64)
    a = req("a", range(32), max_tokens=20, priority=1)  # 2 blocks, then grows into a 3rd
    b = req("b", range(100, 132), max_tokens=20)        # 2 blocks
    s.add(a)
    s.add(b)
    run_step(s)   # a prefills 32
    run_step(s)   # a decodes (needs block 3), b cannot get 2 more blocks -> waits
    assert a.status is SequenceStatus.RUNNING and b.status is SequenceStatus.WAITING
    s.remove(a)
    run_step(s)
    assert b.status is SequenceStatus.RUNNING
    c = req("c", range(200, 232), max_tokens=20, priority=5)
    s.add(c)
    out = run_step(s)  # c (priority 5) waits: a waiting request never preempts a running one
    assert out.preempted == [] and c.status is SequenceStatus.WAITING


def test_running_request_that_cannot_grow_preempts_lower_priority_by_swap():
    s = make(num_blocks=5, cpu=8, budget=128, preemption="swap")
    a = req("a", range(31), max_tokens=40, priority=1)  # 2 blocks after prefill (31 + 1 sampled)
    b = req("b", range(100, 148), max_tokens=10)        # 3 blocks
    s.add(a)
    s.add(b)
    run_step(s)
    assert a.seq.block_table == [0, 1] and b.seq.block_table == [2, 3, 4]
    out = run_step(s)  # a's 32nd token fits block 1; b decodes into a 4th block: no room, b is the victim
    assert [r.request_id for r in out.preempted] == ["b"]
    assert b.status is SequenceStatus.SWAPPED and out.swap_out == [(2, 0), (3, 1), (4, 2)]
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 1)]
    s.remove(a)
    out = run_step(s)
    # b's three full blocks were still in the GPU prefix cache: swap-in shares them and copies nothing.
    assert b.status is SequenceStatus.RUNNING and out.swap_in == []
    assert b.seq.block_table[:3] == [2, 3, 4] and len(b.seq.block_table) == 4
    assert [(r.request_id, n) for r, n in out.scheduled] == [("b", 1)]
    assert s.num_preemptions == {"swap": 1, "recompute": 0}


def test_recompute_preemption_keeps_token_history():
    s = make(num_blocks=5, budget=128, preemption="recompute")
    a = req("a", range(31), max_tokens=40, priority=1)
    b = req("b", range(100, 148), max_tokens=10)
    s.add(a)
    s.add(b)
    run_step(s)
    history = list(b.seq.token_ids)
    out = run_step(s)
    assert [r.request_id for r in out.preempted] == ["b"]
    assert b.status is SequenceStatus.WAITING and b.seq.token_ids == history and b.seq.block_table == []
    assert s.kv.pool.num_used == 2
    s.remove(a)
    out = run_step(s)
    # b recomputes its whole history: the prompt blocks are still in the prefix cache, so only the tail runs.
    assert [(r.request_id, n) for r, n in out.scheduled] == [("b", 49 - 48)]


def test_swap_without_prefix_cache_copies_every_block_both_ways():
    kv = KVCacheManager(CacheConfig(num_blocks=5, block_size=16, num_cpu_blocks=8, enable_prefix_caching=False))
    s = Scheduler(SchedulerConfig(128, 8, "swap"), kv)
    a = req("a", range(31), max_tokens=40, priority=1)
    b = req("b", range(100, 148), max_tokens=10)
    s.add(a)
    s.add(b)
    run_step(s)
    out = run_step(s)
    assert out.swap_out == [(2, 0), (3, 1), (4, 2)]
    s.remove(a)
    out = run_step(s)
    # Freed unhashed blocks go to the head of the free ring: a frees 1, 0 (tail first) -> 0, 1, 2, 3, 4.
    assert [tuple(op) for op in out.swap_in] == [(0, 0), (1, 1), (2, 2)]
    assert b.seq.block_table == [0, 1, 2, 3]
