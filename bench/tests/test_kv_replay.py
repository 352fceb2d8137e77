"""bench/kv_sim.py's Replay: the slots it reports (what bench/kv_browser.py writes on the GPU) and its block map."""
import pytest

from bench.kv_sim import Replay, SessionPlan, Turn, WorkloadConfig, block_map, token_slots
from pagedkv.config import CacheConfig
from pagedkv.kv.contiguous import ContiguousAllocator
from pagedkv.kv.manager import KVCacheManager
from pagedkv.sequence import Sequence

BPT = 100  # bytes per token: a budget of 64 * 100 B holds 64 slots (4 blocks of 16)
CFG = WorkloadConfig(num_sessions=1, decode_tokens_per_s=10, warmup_s=0)


def one_session(system=20, user=5, answer=25) -> list[SessionPlan]:
    return [SessionPlan(arrival=0, system=list(range(1, system + 1)),
                        turns=[Turn(list(range(100, 100 + user)), list(range(200, 200 + answer)))], thinks=[3])]


def test_token_slots_follow_the_block_table_and_the_contiguous_range():
    mgr = KVCacheManager(CacheConfig(num_blocks=4, block_size=16))
    seq = Sequence(list(range(1, 21)))
    mgr.pool.get_new_blocks(1)  # block 0 taken: the sequence gets blocks 1 and 2
    mgr.allocate_slots(seq, 20)
    assert seq.block_table == [1, 2]
    assert token_slots(mgr, seq, 14, 16).tolist() == [30, 31, 32, 33, 34, 35]
    arena = ContiguousAllocator(64, 8)
    first = Sequence([1, 2, 3])
    arena.allocate_slots(first, 3)  # range [0, 8)
    second = Sequence([4, 5])
    arena.allocate_slots(second, 2)  # range [8, 16)
    assert token_slots(arena, second, 0, 16).tolist() == [8, 9]


@pytest.mark.parametrize("kind, expected", [
    # paged: prompt 25 tokens -> slots 0..24 (blocks 0, 1); decode 10 + 10 + 5 tokens -> 25..49 (blocks 1..3)
    ("paged", [list(range(0, 25)), list(range(25, 35)), list(range(35, 45)), list(range(45, 50))]),
    # contiguous: one 32-slot reservation (max context 32), outgrown at 50 tokens -> extended in place to 64
    ("contiguous", [list(range(0, 25)), list(range(25, 35)), list(range(35, 45)), list(range(45, 50))]),
])
def test_replay_reports_every_token_slot_once(kind, expected):
    reported = []
    replay = Replay(kind, one_session(), CFG, 64 * BPT, BPT, contiguous_max_context=32,
                    on_slots=lambda seq, first, n, slots: reported.append(slots.tolist()))
    while not replay.done:
        replay.tick()
    assert reported == expected
    result = replay.result()
    assert (result["turns_started"], result["turns_failed"], result["sessions_served"]) == (1, 0, 1)
    assert result["max_context_tokens"] == 50


def test_replay_counts_a_refused_turn_as_a_failed_session():
    # 80 tokens of prompt do not fit a 64-slot pool: the only turn fails, nothing is reported.
    reported = []
    replay = Replay("paged", one_session(system=75), CFG, 64 * BPT, BPT,
                    on_slots=lambda *a: reported.append(a))
    while not replay.done:
        replay.tick()
    result = replay.result()
    assert reported == []
    assert (result["turns_started"], result["turns_failed"], result["sessions_served"]) == (1, 1, 0)


def test_block_map_marks_free_cached_and_filled_blocks():
    replay = Replay("paged", one_session(), CFG, 64 * BPT, BPT)
    replay.tick()  # t=0: the 25-token prompt is in blocks 0 (full) and 1 (9 of 16), and 10 answer tokens
    assert block_map(replay)["state"] == [2 + 16, 2 + 16, 2 + 3, 0]
    replay.tick()
    replay.tick()  # t=2: the answer is done (50 tokens), the sequence freed: its 3 full blocks stay cached
    assert block_map(replay)["state"] == [1, 1, 1, 0]
    contiguous = Replay("contiguous", one_session(), CFG, 64 * BPT, BPT, contiguous_max_context=48)
    contiguous.tick()  # a 48-slot range holding 35 tokens, then 16 free slots
    assert block_map(contiguous)["state"] == [2 + 16, 2 + 16, 2 + 3, 0]


def test_replay_rejects_an_unknown_allocator():
    with pytest.raises(ValueError, match="'paged' or 'contiguous'"):
        Replay("buddy", one_session(), CFG, 64 * BPT, BPT)
