"""A request's KV retention (sliding window with sinks, importance eviction) on a model with window KV groups.

The semantics (kv/retention.py, "KV groups"): the tables of every group are positional in one cache index
space, so an evicted table index leaves every group's table, and a window layer's mask counts cache indices
(the tokens a retention dropped are not in the distance). The request's window therefore binds the full group;
a window group keeps its own window on top of it: a request window smaller than the model's applies to both, a
larger one leaves the window group as it is.

Checked on the manager with exact block ids (a full and a 32-token window group, block 0 the null block) and
on the engine with a tiny random Gemma 3 (12 layers, 5 and 11 global, the rest a 32-token window: one full and
five window groups of 2 layers): greedy ids equal to the oracle that never pages (original positions) and to
the same engine with every layer full (shifted positions, where the kept keys are re-rotated per group with
each layer's own rotary base), and the blocks each group holds, at every step, equal to what the rule gives;
under importance eviction (window groups keep every entry) the same entries as with every layer full are evicted.
The prompt (token ids 3..42) is the one test_kv_retention.py holds to its oracle; on this model its greedy
continuation has no near tie (the checks below would flip on one).
"""
from __future__ import annotations

import pytest
from model_fixtures import gemma_dir, gemma_weights  # noqa: F401  (fixtures)
from test_kv_groups import FULL_AND_WINDOW, computed, decode, make
from test_kv_retention import window_oracle

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.numpy_ref import NumpyModel
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.accounting import kv_stats
from pagedkv.kv.block_pool import OutOfBlocks
from pagedkv.kv.manager import CopyOp
from pagedkv.kv.retention import KVRetention, ShiftOp
from pagedkv.sampling import SamplingParams
from pagedkv.sequence import Sequence
from pagedkv.tokenizer import Tokenizer

PROMPT = list(range(3, 43))  # 40 tokens
NO_STOP = (10_000,)
BS = 16
MODEL_WINDOW = 32


# ---------------------------------------------------------------- the manager, exact block ids

def test_evicted_indices_leave_every_groups_table_and_shift_per_group():
    mgr = make(num_blocks=12, groups=FULL_AND_WINDOW)
    seq = computed(mgr, list(range(64)))
    assert seq.block_tables == [[1, 2, 3, 4], [5, 6, 7, 8]]
    copies, shifts = mgr.evict_blocks(seq, [1], shift_positions=True)
    assert copies == []
    assert shifts == [ShiftOp(3, 16, 0), ShiftOp(4, 16, 0), ShiftOp(7, 16, 1), ShiftOp(8, 16, 1)]
    assert seq.block_tables == [[1, 3, 4], [5, 7, 8]] and seq.num_evicted_tokens == 16
    assert mgr.pool.free_queue_ids() == [9, 10, 11, 2, 6]  # hashed blocks: cached, at the tail
    # The next query is cache index 48 (text position 64): it sees cache keys 17..48, so the window group
    # releases its table index 0 only (counted in text positions it would also release index 1, block 7).
    decode(mgr, seq, 64)
    assert seq.block_tables == [[1, 3, 4, 9], [0, 7, 8, 10]]
    assert mgr.num_held_blocks(seq) == 7
    for t in range(65, 81):
        decode(mgr, seq, t)
    # Block 7 (rotated, so no longer a cached prefix) left the window at query 63 and was taken first again.
    assert seq.block_tables == [[1, 3, 4, 9, 7], [0, 0, 8, 10, 11]]
    # An evicted index whose window entry was released already frees only the full group's block.
    copies, shifts = mgr.evict_blocks(seq, [1], shift_positions=False)
    assert (copies, shifts) == ([], [])
    assert seq.block_tables == [[1, 4, 9, 7], [0, 8, 10, 11]] and seq.num_evicted_tokens == 32
    mgr.free(seq)
    assert mgr.pool.num_used == 1  # the null block


def test_eviction_copies_the_blocks_it_shares_before_rotating_them_in_every_group():
    mgr = make(num_blocks=16, groups=FULL_AND_WINDOW)
    seq = computed(mgr, list(range(48)))
    child = mgr.fork(seq)
    assert seq.block_tables == [[1, 2, 3], [4, 5, 6]]
    copies, shifts = mgr.evict_blocks(seq, [0], shift_positions=True)
    assert copies == [CopyOp(2, 7), CopyOp(3, 8), CopyOp(5, 9), CopyOp(6, 10)]
    assert shifts == [ShiftOp(7, 16, 0), ShiftOp(8, 16, 0), ShiftOp(9, 16, 1), ShiftOp(10, 16, 1)]
    assert seq.block_tables == [[7, 8], [9, 10]]
    assert child.block_tables == [[1, 2, 3], [4, 5, 6]]  # the fork keeps the original keys
    mgr.free(seq)
    mgr.free(child)
    assert mgr.pool.num_used == 1


def test_eviction_refuses_copies_the_pool_cannot_give_with_the_state_unchanged():
    mgr = make(num_blocks=9, groups=FULL_AND_WINDOW)
    seq = computed(mgr, list(range(48)))
    mgr.fork(seq)
    with pytest.raises(OutOfBlocks, match="needs 4 copies of shared blocks, 2 free"):
        mgr.evict_blocks(seq, [0], shift_positions=True)
    assert seq.block_tables == [[1, 2, 3], [4, 5, 6]] and seq.num_evicted_tokens == 0


def test_window_groups_keep_what_a_drop_could_show_them_again():
    narrow, wide = KVRetention(window_tokens=16, sink_tokens=4), KVRetention(window_tokens=32, sink_tokens=4)
    evicting = KVRetention(evict=True, sink_tokens=4, recent_tokens=16)
    assert [r.pinned_blocks(MODEL_WINDOW, BS) for r in (narrow, wide, evicting)] == [1, 0, None]
    for retention, window_table in ((None, [0, 5, 6, 8]), (narrow, [4, 5, 6, 8]), (wide, [0, 5, 6, 8]),
                                    (evicting, [4, 5, 6, 8])):
        mgr = make(num_blocks=12, groups=FULL_AND_WINDOW)
        seq = Sequence(list(range(60)))
        seq.retention = retention  # the scheduler sets it before every allocation
        for n in (48, 12):  # the second chunk's first query, 48, no longer sees window index 0 (tokens 0..15)
            mgr.allocate_slots(seq, n)
            mgr.mark_computed(seq, n)
        assert seq.block_tables == [[1, 2, 3, 7], window_table]
    # Under pressure eviction takes the entries that free what is short, a block per group that holds one.
    assert mgr.entries_freeing(seq, [1, 2], 2) == [1]
    assert mgr.entries_freeing(seq, [1, 2], 3) == [1, 2]
    assert mgr.entries_freeing(seq, [1, 2], 9) == [1, 2]


# ---------------------------------------------------------------- the engine on a tiny Gemma 3

def engine_of(weights, num_blocks: int, kv_groups: bool = True) -> LLMEngine:
    backend = CpuBackend(weights, num_blocks=num_blocks, block_size=BS, kv_groups=kv_groups)
    return LLMEngine(backend, Tokenizer.from_manifest(weights.manifest), EngineConfig(max_num_batched_tokens=32))


def expected_held(cache_before: int, cache_after: int, num_window_groups: int, pinned: int) -> list[int]:
    """Blocks each group holds after a step that computed cache indices cache_before .. cache_after - 1: the
    full group every block of the cache; a window group those its step's first query (cache_before) still sees,
    released before the step allocated (kv/groups.py), the step's own, and the `pinned` leading ones."""
    blocks = -(-cache_after // BS)
    released = max(0, (cache_before - MODEL_WINDOW + 1) // BS - pinned)
    return [blocks] + [blocks - released] * num_window_groups


def run(engine: LLMEngine, n: int, retention: KVRetention) -> tuple[list[int], list[list[int]], int]:
    """PROMPT greedily to n ids under `retention`; returns them, each step's blocks per group and the blocks whose
    keys were re-rotated, checking the
    pool's used blocks against them (plus the null block) and the cache length against the window bound."""
    rid = engine.add_request(PROMPT, SamplingParams(max_tokens=n, stop_token_ids=NO_STOP), retention=retention)
    req = engine.request(rid)
    seq = req.seq
    bound = retention.max_blocks(BS) * BS
    groups, trace = engine.kv.num_groups, []
    while engine.has_unfinished:
        computed = seq.num_computed_tokens
        run_sync(engine.step())
        if seq.status.value == "finished":
            break
        after = seq.num_computed_tokens - seq.num_evicted_tokens  # the window's drops run before the step
        before = after - (seq.num_computed_tokens - computed)
        assert after <= bound
        held = list(kv_stats(engine.kv).group_used_blocks)
        if groups > 1:
            assert held == expected_held(before, after, groups - 1, retention.pinned_blocks(MODEL_WINDOW, BS)), (before, after)
        assert engine.kv.pool.num_used == sum(held) + (groups > 1)
        trace.append(held)
    assert engine.kv.pool.num_used == (groups > 1)
    return req.output_ids, trace, engine.stats()["shifted_blocks"]


@pytest.mark.parametrize("window,last", [(16, [3] * 6), (64, [6] + [3] * 5)])
def test_window_retention_on_window_groups_equals_the_oracle_with_original_positions(gemma_weights, window,  # noqa: F811
                                                                                    last):
    # A 16-token sink block and a 16-token request window: narrower than the model's 32, so it binds the window
    # layers too (they keep the sink block, which a drop brings back into their view); 64: wider, so the window
    # groups keep only their own window, and the full group the sinks and the request's window.
    r = KVRetention(window_tokens=window, sink_tokens=4, positions="original")
    out, trace, shifted = run(engine_of(gemma_weights, 40), 100, r)
    assert out == window_oracle(NumpyModel(gemma_weights), PROMPT, 100, 1, window // BS) and shifted == 0
    assert max(t[0] for t in trace) == window // BS + 2 and trace[-1] == last


@pytest.mark.parametrize("window", [16, 64])
def test_shifted_window_retention_with_groups_equals_every_layer_full(gemma_weights, window):  # noqa: F811
    # 16: the request's window is narrower than the model's and binds the window layers too; 64: wider.
    r = KVRetention(window_tokens=window, sink_tokens=4)
    out, trace, shifted = run(engine_of(gemma_weights, 40), 100, r)
    flat, _, _ = run(engine_of(gemma_weights, 40, kv_groups=False), 100, r)
    assert out == flat and shifted > 0
    assert max(t[0] for t in trace) == window // BS + 2


def test_importance_eviction_on_window_groups_equals_every_layer_full(gemma_weights):  # noqa: F811
    # Under eviction every window group keeps all its entries (pinned_blocks None), so each table entry is 6
    # pages: a pool of 6 x 12 pages (+ the null page) is under the pressure of 12 pages with every layer full,
    # the same entries are evicted (the last layer, 11, is a full-group layer: the same attention mass), and the
    # ids are equal.
    r = KVRetention(evict=True, sink_tokens=4, recent_tokens=32)
    params = SamplingParams(max_tokens=60, stop_token_ids=NO_STOP)
    engines = [engine_of(gemma_weights, 6 * 12 + 1), engine_of(gemma_weights, 12, kv_groups=False)]
    reqs = [[e.request(e.add_request(list(range(1 + 50 * i, 41 + 50 * i)), params, retention=r)) for i in range(2)]
            for e in engines]
    while engines[0].has_unfinished:
        for e in engines:
            run_sync(e.step())
        assert engines[0].kv.pool.num_used == 6 * engines[1].kv.pool.num_used + 1
    assert [q.output_ids for q in reqs[0]] == [q.output_ids for q in reqs[1]]
    stats = [e.stats() for e in engines]
    assert stats[0]["evicted_blocks"] == stats[1]["evicted_blocks"] > 0
    assert stats[0]["preemptions"] == {"swap": 0, "recompute": 0}


def test_a_backend_refuses_a_shift_of_a_group_it_does_not_hold(gemma_weights):  # noqa: F811
    backend = CpuBackend(gemma_weights, num_blocks=4, block_size=BS, kv_groups=False)
    with pytest.raises(ValueError, match=r"names KV group 3; this backend's pool holds 1 group"):
        run_sync(backend.shift_keys([ShiftOp(1, 16, 0), ShiftOp(2, 16, 3)]))
