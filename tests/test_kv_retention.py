"""Sliding window with attention sinks and importance eviction: exact block accounting, reuse of freed
blocks, generation past the model's context, and bad input."""
from __future__ import annotations

import numpy as np
import pytest

from model_fixtures import reference_greedy, tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.model_runner import ForwardBatch
from pagedkv.kernels.ref_ops import rope_adjacent, shift_keys
from pagedkv.backends.numpy_ref import PagedKVCache
from pagedkv.config import CacheConfig
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.manager import KVCacheManager
from pagedkv.kv.retention import KVRetention, ShiftOp, evictable, window_drops
from pagedkv.request import Request
from pagedkv.sampling import SamplingParams
from pagedkv.sequence import Sequence
from pagedkv.tokenizer import Tokenizer
from test_scheduler import make, run_step

WINDOW = KVRetention(window_tokens=64, sink_tokens=4)  # 1 sink block + 4 window blocks (+1 being filled)
NO_STOP = (10_000,)  # a stop id the tiny vocab never emits


def windowed(name, prompt, max_tokens, retention=WINDOW):
    return Request(name, Sequence(list(prompt)), num_prompt_tokens=len(prompt), max_tokens=max_tokens,
                   retention=retention)


# ---------------------------------------------------------------- bad input

def test_bad_retention_configs_are_rejected():
    with pytest.raises(ValueError, match=r"window_tokens \(8\) is smaller than sink_tokens \(16\)"):
        KVRetention(window_tokens=8, sink_tokens=16)
    with pytest.raises(ValueError, match="positions must be one of"):
        KVRetention(window_tokens=64, positions="absolute")
    with pytest.raises(ValueError, match="needs window_tokens or evict=True"):
        KVRetention()
    with pytest.raises(ValueError, match="sink_tokens must be an int >= 0"):
        KVRetention(window_tokens=64, sink_tokens=-1)
    with pytest.raises(ValueError, match=r"window_tokens \(72\) must be a multiple of the block size \(16\).*"
                                         r"use 64 or 80"):
        KVRetention(window_tokens=72).check_block_size(16)


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):
    return Tokenizer.from_manifest(tiny_weights.manifest)


def engine_for(weights, tokenizer, num_blocks=64, **kw):
    return LLMEngine(CpuBackend(weights, num_blocks=num_blocks, block_size=16), tokenizer, EngineConfig(**kw))


def test_engine_rejects_unaligned_or_oversized_windows_and_queues_nothing(tiny_weights, tokenizer):
    engine = engine_for(tiny_weights, tokenizer)
    with pytest.raises(ValueError, match=r"window_tokens \(72\) must be a multiple of the block size"):
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=4), retention=KVRetention(window_tokens=72))
    with pytest.raises(ValueError, match=r"sinks \+ window \+ one block \(288 tokens\) exceed the model context "
                                         r"\(256\)"):
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=4), retention=KVRetention(window_tokens=256))
    assert not engine.has_unfinished and engine.scheduler.waiting == []


# ---------------------------------------------------------------- block accounting (scheduler + manager)

def test_window_block_accounting_is_exact_and_bounded():
    s = make(num_blocks=8, budget=64)
    a = windowed("a", range(40), max_tokens=200)
    s.add(a)
    bound = WINDOW.max_blocks(16)
    assert bound == 6  # ceil((4 + 64) / 16) + 1
    held = []
    for _ in range(160):
        run_step(s)
        held.append(len(a.seq.block_table))
        assert s.kv.pool.num_used == len(a.seq.block_table) <= bound
        assert a.seq.num_cached_kv_tokens == a.seq.num_kv_tokens - a.seq.num_evicted_tokens
    assert max(held) == bound
    # 40 prompt + 160 steps: 199 tokens have slots; 7 blocks of 16 (tokens 16..127) were dropped.
    assert a.seq.num_kv_tokens == 199 and a.seq.num_evicted_tokens == 112
    # Table: the sink block, the 4 window blocks (tokens 128..191) and the one being filled (192..198).
    assert a.seq.block_table == [0, 3, 4, 5, 6, 2]
    assert window_drops(a.seq, WINDOW, 16) == []


def test_long_prompt_prefills_block_by_block_inside_the_window():
    s = make(num_blocks=8, budget=256)
    a = windowed("a", range(1, 201), max_tokens=4)
    s.add(a)
    chunks = [n for _, n in run_step(s).scheduled]
    for _ in range(9):
        chunks += [n for _, n in run_step(s).scheduled]
        assert len(a.seq.block_table) <= 6
    # First chunk fills all 6 blocks (96 tokens), then one block per step: the bound holds during prefill.
    assert chunks == [96, 16, 16, 16, 16, 16, 16, 8, 1, 1]


def test_blocks_leaving_the_window_go_to_another_conversation_at_once():
    s = make(num_blocks=7, budget=128)
    a = windowed("a", range(96), max_tokens=100)  # 6 full blocks: the sink, 4 window blocks and one more
    s.add(a)
    run_step(s)
    assert a.seq.block_table == [0, 1, 2, 3, 4, 5]
    b = Request("b", Sequence(list(range(100, 110))), num_prompt_tokens=10, max_tokens=2)  # needs 1 block
    s.add(b)
    out = run_step(s)  # a starts text block 6: its block 1 left the window, b takes it in the same step
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 1), ("b", 10)]
    assert a.seq.block_table == [0, 2, 3, 4, 5, 6]
    assert b.seq.block_table == [1]
    assert out.preempted == [] and s.kv.pool.num_available == 0


# ---------------------------------------------------------------- the manager's eviction primitive

def test_evict_blocks_shrinks_the_table_and_plans_shifts_and_copies():
    kv = KVCacheManager(CacheConfig(num_blocks=10, block_size=16, enable_prefix_caching=False))
    seq = Sequence(list(range(90)))
    kv.allocate_slots(seq, 90)
    seq.num_computed_tokens = 90
    child = kv.fork(seq)  # shares all 6 blocks
    with pytest.raises(ValueError, match=r"can only evict full, computed blocks 0..4 of its table, got \[5\]"):
        kv.evict_blocks(seq, [5])
    assert seq.block_table == [0, 1, 2, 3, 4, 5] and seq.num_evicted_tokens == 0  # unchanged
    copies, shifts = kv.evict_blocks(seq, [3, 1], shift_positions=True)
    # Blocks after an evicted one move down; the child still holds them, so seq rotates its own copies.
    assert copies == [(2, 6), (4, 7), (5, 8)]
    assert shifts == [ShiftOp(6, 16), ShiftOp(7, 32), ShiftOp(8, 32)]
    assert seq.block_table == [0, 6, 7, 8] and seq.num_evicted_tokens == 32 and seq.num_cached_kv_tokens == 58
    assert child.block_table == [0, 1, 2, 3, 4, 5]
    kv.free(child)  # now blocks 1 and 3 (evicted by seq) return to the pool too
    assert kv.pool.num_used == 4 and kv.pool.num_free == 6


def test_evicted_ids_return_to_the_pool_and_are_handed_out_next():
    kv = KVCacheManager(CacheConfig(num_blocks=8, block_size=16, enable_prefix_caching=False))
    seq = Sequence(list(range(64)))
    kv.allocate_slots(seq, 64)
    seq.num_computed_tokens = 64
    assert kv.evict_blocks(seq, [1, 2]) == ([], [])  # original positions: nothing to rotate
    assert kv.pool.free_queue_ids()[:2] == [1, 2]
    other = Sequence(list(range(20)))
    kv.allocate_slots(other, 20)
    assert other.block_table == [1, 2]


def test_eviction_candidates_spare_sinks_and_recent_blocks():
    r = KVRetention(evict=True, sink_tokens=4, recent_tokens=32)
    seq = Sequence(list(range(120)))
    seq.block_table = [10, 11, 12, 13, 14, 15, 16, 17]
    seq.num_kv_tokens = seq.num_computed_tokens = 120
    seq.block_scores = {11: 5.0, 12: 0.5, 13: 2.0, 14: 0.1, 15: 9.0, 16: 0.0, 17: 0.0}
    # Sink: index 0; recent: 2 blocks + the partial one (indices 5..7).
    assert evictable(seq, r, 16) == [4, 2, 3, 1]


def test_shift_keys_equals_rotating_at_the_shifted_position():
    rng = np.random.default_rng(0)
    inv_freq = (1.0 / 10000 ** (np.arange(0, 16, 2) / 16)).astype(np.float32)  # (8,)
    raw = rng.standard_normal((2, 4, 3, 16)).astype(np.float32)  # (blocks, block_size, n_kv, head_dim)
    pos = np.arange(100, 108).reshape(2, 4)  # (blocks, block_size)
    at = lambda p: rope_adjacent(raw.reshape(8, 3, 16), p.reshape(-1), inv_freq).reshape(raw.shape)  # noqa: E731
    shifted = shift_keys(at(pos), np.array([16, 48]), inv_freq)
    np.testing.assert_allclose(shifted, at(pos - np.array([[16], [48]])), atol=2e-5)


def test_attention_mass_of_the_last_layer_sums_to_one_per_head_and_query(tiny_model):
    cfg = tiny_model.config
    kv = PagedKVCache.allocate(cfg, 4, 16)
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    batch = ForwardBatch(i32(range(1, 41)), i32(range(40)), i32([32 + i for i in range(16)] + list(range(24))),
                         i32([0, 40]), i32([[2, 0, 1, 3]]), i32([40]))  # table order 2, 0, 1
    mass = np.zeros((1, 4), np.float32)  # (S, max_blocks)
    tiny_model.forward(batch, kv, attention_mass=mass)
    assert mass[0, 3] == 0.0  # past the context
    assert mass.sum() == pytest.approx(cfg.n_heads * 40, rel=1e-5)
    # Causal: the first block is seen by all 40 queries, the last by only 8; it gets the most mass.
    assert mass[0, 0] > mass[0, 2]


# ---------------------------------------------------------------- the engine past the model's context

def window_oracle(model, prompt, n, sink_blocks, window_blocks):
    """Greedy decode under the window rule with original positions, straight on the numpy model: the
    whole text stays in an identity-mapped cache (K/V written once), and each step attends through a
    table of the sink blocks and the recent blocks only. No manager, scheduler or model runner."""
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    bs = 16
    kv = PagedKVCache.allocate(model.config, -(-(len(prompt) + n) // bs), bs)
    ids = list(prompt)
    out = []
    for step in range(n + 1):
        start = len(prompt) if step == 0 else len(ids) - 1
        if step == 0:  # the prompt fits the window here: one full-attention prefill
            table, first = list(range(-(-start // bs))), 0
        else:
            j = start // bs
            recent = list(range(max(sink_blocks, j - window_blocks), j + 1))
            table, first = list(range(min(sink_blocks, j))) + recent, start
        if step == 0:
            batch = ForwardBatch(i32(ids), i32(range(start)), i32(range(start)), i32([0, start]), i32([table]),
                                 i32([start]))
        else:
            ctx = (len(table) - 1) * bs + start % bs + 1
            batch = ForwardBatch(i32([ids[-1]]), i32([first]), i32([first]), i32([0, 1]), i32([table]), i32([ctx]))
        if step == n:
            break
        tok = int(np.argmax(model.forward(batch, kv)[0]))
        out.append(tok)
        ids.append(tok)
    return out


def run(engine, prompt, n, retention, track=None):
    rid = engine.add_request(prompt, SamplingParams(max_tokens=n, stop_token_ids=NO_STOP), retention=retention)
    req = engine.request(rid)
    while engine.has_unfinished:
        run_sync(engine.step())
        if track is not None:
            track(req)
    return req.output_ids


def test_window_with_original_positions_runs_past_the_context_and_matches_the_oracle(
        tiny_weights, tiny_model, tokenizer):
    engine = engine_for(tiny_weights, tokenizer, num_blocks=8)
    r = KVRetention(window_tokens=64, sink_tokens=4, positions="original")
    held = []
    out = run(engine, list(range(3, 43)), 300, r, track=lambda q: held.append(len(q.seq.block_table)))
    assert len(out) == 300  # 340 tokens, past the tiny model's 256-token context, in an 8-block pool
    assert max(held) == 6
    assert out == window_oracle(tiny_model, list(range(3, 43)), 300, 1, 4)
    assert engine.stats()["used_blocks"] == 0


def test_shifted_window_keeps_positions_inside_the_context(tiny_weights, tiny_model, tokenizer):
    engine = engine_for(tiny_weights, tokenizer, num_blocks=8)
    positions = []
    forward = engine.backend.forward

    async def spy(batch, *, greedy=False, attention_mass=None):
        positions.append(int(batch.positions.max()))
        return await forward(batch, greedy=greedy, attention_mass=attention_mass)

    engine.backend.forward = spy
    out = run(engine, list(range(3, 43)), 300, WINDOW)
    assert len(out) == 300 and max(positions) == 6 * 16 - 1
    # Up to the first drop (token 96 needs block 6 of the text) the window changes nothing.
    assert out[:56] == reference_greedy(tiny_model, list(range(3, 43)), 56)
    assert engine.stats()["shifted_blocks"] > 0


def test_importance_eviction_keeps_conversations_generating_without_preemption(tiny_weights, tokenizer):
    engine = engine_for(tiny_weights, tokenizer, num_blocks=12)
    r = KVRetention(evict=True, sink_tokens=4, recent_tokens=32)
    params = SamplingParams(max_tokens=100, stop_token_ids=NO_STOP)
    rids = [engine.add_request(list(range(1 + 50 * i, 41 + 50 * i)), params, retention=r) for i in range(2)]
    reqs = [engine.request(x) for x in rids]
    sinks = {}
    while engine.has_unfinished:
        run_sync(engine.step())
        live = [q for q in reqs if q.seq.block_table]
        for q in live:
            sinks.setdefault(q.request_id, q.seq.block_table[0])
            assert q.seq.block_table[0] == sinks[q.request_id]  # the sink block is never evicted
            # The recent 32 tokens (+ the partial block) are all still cached, in order.
            assert q.seq.num_cached_kv_tokens >= min(q.seq.num_kv_tokens, 32 + q.seq.num_kv_tokens % 16 + 16)
        assert engine.kv.pool.num_used == sum(len(q.seq.block_table) for q in live)
    stats = engine.stats()
    assert [len(q.output_ids) for q in reqs] == [100, 100]
    assert stats["preemptions"] == {"swap": 0, "recompute": 0} and stats["evicted_blocks"] > 0
    assert stats["used_blocks"] == 0 and stats["free_blocks"] + stats["cached_blocks"] == 12


def test_attention_mass_reference_on_equal_keys_is_uniform_per_block():
    from pagedkv.kernels.ref_attention_mass import attention_mass_ref
    k_cache = np.zeros((4, 16, 1, 16), np.float32)  # equal keys: every visible key gets 1 / keys
    query = np.ones((2, 2, 16), np.float32)  # 2 new tokens (cache indices 18, 19), 2 heads
    mass = attention_mass_ref(query, k_cache, np.array([[3, 1, 0]]), np.array([0, 2]), np.array([20]), 0.25)
    want = [16 / 19 + 16 / 20, 3 / 19 + 4 / 20, 0.0]
    np.testing.assert_allclose(mass, [[want, want]], rtol=1e-12)


def test_eviction_lets_a_conversation_outgrow_the_pool():
    s = make(num_blocks=6, budget=16)
    r = KVRetention(evict=True, sink_tokens=4, recent_tokens=32)
    a = windowed("a", range(1, 121), max_tokens=4, retention=r)  # 120 tokens = 8 blocks > 6
    s.add(a)
    for _ in range(8):
        run_step(s)
        assert len(a.seq.block_table) <= 6
    # The 120-token prompt is computed in 8 steps; text blocks 1 and 2 (lowest score: all 0.0 without a
    # model, oldest first) were evicted to make room, never the sink nor the recent ones; their ids
    # came back for text blocks 6 and 7.
    assert a.seq.num_computed_tokens == 120 and a.seq.num_evicted_tokens == 32
    assert a.seq.block_table == [0, 3, 4, 5, 1, 2]
    assert s.num_evicted_blocks == 2 and s.num_preemptions == {"swap": 0, "recompute": 0}
