"""Exact-value tests of the contiguous baseline (arena of 100 slots, max_context 30)."""

import pytest

from pagedkv.kv.contiguous import Arena, ContiguousAllocator, ContiguousOOM, CopyRange
from pagedkv.kv.manager import DoubleFree, NeverFits, SequenceFreed
from pagedkv.sequence import Sequence


def state(alloc, seqs):
    return ([list(h) for h in alloc.arena.holes], dict(alloc.ranges),
            [(s.num_kv_tokens, list(s.token_ids), s.status) for s in seqs])


def reserve(alloc, n, session="default"):
    seq = Sequence(list(range(n)), session=session)
    assert alloc.allocate_slots(seq, n) == []
    return seq


def test_first_fit_reservations_and_exact_ranges():
    alloc = ContiguousAllocator(100, 30)
    a, b, c = reserve(alloc, 10), reserve(alloc, 5), reserve(alloc, 1)
    assert [alloc.ranges[s.seq_id] for s in (a, b, c)] == [(0, 30), (30, 30), (60, 30)]
    assert alloc.arena.holes == [[90, 10]]
    d = Sequence([1])
    assert not alloc.can_allocate(d, 1)
    with pytest.raises(ContiguousOOM, match="needs 30 contiguous slots; largest hole is 10 of 10"):
        alloc.allocate_slots(d, 1)
    alloc.free(b)
    assert alloc.arena.holes == [[30, 30], [90, 10]]
    alloc.allocate_slots(d, 1)
    assert alloc.ranges[d.seq_id] == (30, 30)


def test_external_fragmentation_fails_despite_enough_free_slots():
    alloc = ContiguousAllocator(100, 30)
    a, b, c = reserve(alloc, 10), reserve(alloc, 10), reserve(alloc, 10)
    alloc.free(a)
    alloc.free(c)
    assert alloc.arena.holes == [[0, 30], [60, 40]] and alloc.arena.free_slots == 70
    big = Sequence(list(range(50)))
    before = state(alloc, [b, big])
    with pytest.raises(ContiguousOOM, match="needs 50 contiguous slots; largest hole is 40 of 70"):
        alloc.allocate_slots(big, 50)
    assert state(alloc, [b, big]) == before


def test_growth_extends_in_place_or_moves_with_a_copy():
    alloc = ContiguousAllocator(100, 30)
    a = reserve(alloc, 10)
    assert alloc.append_tokens(a, list(range(21))) == []      # 31 > 30: hole after -> in place
    assert alloc.ranges[a.seq_id] == (0, 60)
    b = reserve(alloc, 10)                                    # (60, 30)
    alloc.free(a)
    a2 = reserve(alloc, 30)                                   # (0, 30)
    assert alloc.arena.holes == [[30, 30], [90, 10]]
    # Doubling to 60 needs 30 more slots: the hole right after is exactly 30 -> in place.
    assert alloc.append_tokens(a2, [1]) == []
    assert alloc.ranges[a2.seq_id] == (0, 60)
    alloc.truncate(a2, 20)
    assert alloc.ranges[a2.seq_id] == (0, 60) and a2.num_kv_tokens == 20
    alloc.free(b)
    c = reserve(alloc, 30)                                    # (60, 30)
    assert alloc.ranges[c.seq_id] == (60, 30) and alloc.arena.holes == [[90, 10]]
    alloc.free(a2)
    assert alloc.append_tokens(c, [5]) == [CopyRange(60, 0, 30)]   # moves into hole [0, 60)
    assert alloc.ranges[c.seq_id] == (0, 60) and alloc.arena.holes == [[60, 40]]
    assert alloc.num_copied_tokens == 30


def test_fork_copies_the_whole_range():
    alloc = ContiguousAllocator(100, 30)
    a = reserve(alloc, 10)
    child = alloc.fork(a)
    assert alloc.ranges[child.seq_id] == (30, 30)
    assert alloc.append_tokens(child, [1]) == [CopyRange(0, 30, 10)]
    assert alloc.lookup_prefix(list(range(10))) == (0, [])
    s = alloc.stats()
    assert (s.total_blocks, s.used_blocks, s.utilization) == (100, 60, 0.6)
    assert (s.logical_tokens, s.slot_efficiency, s.sharing_factor) == (21, 21 / 60, 1.0)


def test_swap_round_trip():
    alloc = ContiguousAllocator(100, 30, num_cpu_slots=40)
    a = reserve(alloc, 10)
    reserve(alloc, 10)
    assert alloc.swap_out(a) == [CopyRange(0, 0, 10)]
    assert alloc.arena.holes == [[0, 30], [60, 40]]
    reserve(alloc, 3)                                         # takes (0, 30)
    assert alloc.swap_in(a) == [CopyRange(0, 60, 10)]
    assert alloc.ranges[a.seq_id] == (60, 30)


def test_bad_input_and_freed_sequences():
    with pytest.raises(ValueError, match="max_context 200 exceeds the arena"):
        ContiguousAllocator(100, 200)
    with pytest.raises(ValueError, match="num_slots must be an int >= 1"):
        ContiguousAllocator(0, 1)
    with pytest.raises(ValueError, match="max_context must be an int >= 1"):
        ContiguousAllocator(10, -1)
    alloc = ContiguousAllocator(100, 30)
    with pytest.raises(NeverFits, match="needs 101 contiguous slots"):
        alloc.allocate_slots(Sequence(list(range(101))), 101)
    a = reserve(alloc, 10)
    alloc.free(a)
    before = state(alloc, [a])
    with pytest.raises(DoubleFree):
        alloc.free(a)
    with pytest.raises(SequenceFreed):
        alloc.append_tokens(a, [1])
    assert state(alloc, [a]) == before


def test_arena_merges_neighbouring_holes():
    arena = Arena(50)
    arena.take(0, 10)
    arena.take(10, 10)
    arena.take(20, 10)
    arena.release(0, 10)
    arena.release(20, 10)
    assert arena.holes == [[0, 10], [20, 30]]
    arena.release(10, 10)
    assert arena.holes == [[0, 50]]
