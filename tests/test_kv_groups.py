"""KV groups (kv/groups.py): sliding-window layers hold only their window, in tables of their own in one pool.

Exact block ids on a tiny pool (block size 16, a full group and a window group of 32 tokens; block 0 is the
null block), the random workload's invariants with groups, and the engine on a tiny Gemma 3 (window layers)
generating exactly the reference's greedy ids with every layer holding everything."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kv_invariants import run_random_workload, snapshot
from model_fixtures import reference_greedy  # noqa: F401
from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.numpy_ref import NumpyModel
from pagedkv.config import CacheConfig
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.accounting import kv_stats
from pagedkv.kv.block_pool import BlockPool
from pagedkv.kv.groups import KVGroup, KVGroups
from pagedkv.kv.manager import CopyOp, KVCacheManager
from pagedkv.kv.spec import KVSpec
from pagedkv.model.config import ModelConfig
from pagedkv.model.tiny import TINY_VOCAB, tiny_config, write_tiny_model
from pagedkv.model.weights import ModelWeights
from pagedkv.sampling import SamplingParams
from pagedkv.sequence import Sequence
from pagedkv.tokenizer import Tokenizer

FULL_AND_WINDOW = KVGroups((KVGroup(None, (0,)), KVGroup(32, (1,))))


def make(num_blocks=12, cpu=6, groups=FULL_AND_WINDOW):
    return KVCacheManager(CacheConfig(num_blocks=num_blocks, block_size=16, num_cpu_blocks=cpu),
                          namespace="m", groups=groups)


def computed(mgr, tokens, chunks=None):
    """A sequence of `tokens` allocated and computed in `chunks` (default: one)."""
    seq = Sequence(tokens)
    for n in chunks or [len(tokens)]:
        mgr.allocate_slots(seq, n)
        mgr.mark_computed(seq, n)
    return seq


def decode(mgr, seq, token):
    ops = mgr.append_tokens(seq, [token])
    mgr.mark_computed(seq, 1)
    return ops


def gemma3_config(n_layers=18, window=512, **kw) -> ModelConfig:
    return replace(tiny_config(), architecture="gemma3", n_layers=n_layers, sliding_window=window, **kw)


# ---------------------------------------------------------------- groups and page size

def test_gemma3_270m_layers_group_in_threes_full_first():
    cfg = gemma3_config(n_heads=4, n_kv_heads=1, head_dim=256)  # 270M: 18 layers, 1 KV head of 256
    groups = KVGroups.of(cfg)
    assert groups.group_size == 3 and groups.num_groups == 6
    assert [g.layers for g in groups.groups] == [(5, 11, 17), (0, 1, 2), (3, 4, 6), (7, 8, 9), (10, 12, 13),
                                                 (14, 15, 16)]
    assert groups.windows == (None, 512, 512, 512, 512, 512)
    assert groups.where(6) == (2, 2) and groups.where(17) == (0, 2)
    flat = KVSpec.of(cfg, dtype="f16")
    paged = KVSpec.of(cfg, dtype="f16", groups=groups)
    assert flat.bytes_per_block == 16 * 2 * 18 * 256 * 2 == 294_912
    assert paged.bytes_per_block == 16 * 2 * 3 * 256 * 2 == 49_152  # a page: one group's 3 layers
    assert paged.bytes_per_token == flat.bytes_per_token  # a token in every layer: unchanged
    # 16k tokens: 1,024 full-group pages + 5 window groups x at most ceil((511 + 16) / 16) + 1 = 34 pages
    assert groups.blocks_needed(16_384, 16, 16) == 1024 + 5 * 34


def test_a_model_without_windows_is_one_group_of_every_layer():
    groups = KVGroups.of(tiny_config())
    assert groups == KVGroups.flat(2) and not groups.is_hybrid
    assert KVSpec.of(tiny_config(), groups=groups) == KVSpec.of(tiny_config())
    tiny7 = KVGroups.of(gemma3_config(n_layers=7, window=32))  # 1 full layer + 6 window layers: groups of 1
    assert [g.layers for g in tiny7.groups] == [(5,), (0,), (1,), (2,), (3,), (4,), (6,)]


# ---------------------------------------------------------------- release out of the window

def test_window_group_releases_a_block_once_the_next_query_passes_it_in_decode():
    mgr = make()
    assert mgr.null_block == 0 and mgr.pool.free_queue_ids() == list(range(1, 12))
    seq = computed(mgr, list(range(40)))
    assert seq.block_tables == [[1, 2, 3], [4, 5, 6]]
    for t in range(40, 47):  # queries 40..46 still see token 15 (46 - 15 < 32)
        decode(mgr, seq, t)
    assert seq.block_tables == [[1, 2, 3], [4, 5, 6]]
    decode(mgr, seq, 47)  # query 47 sees keys 16..47: block 0 of the window group (tokens 0..15) leaves
    assert seq.block_tables == [[1, 2, 3], [0, 5, 6]]
    assert mgr.pool.free_queue_ids() == [7, 8, 9, 10, 11, 4]  # hashed: kept in the prefix cache, evicted last
    assert mgr.pool.state_of(4) == "cached"
    decode(mgr, seq, 48)  # a new block in each group
    assert seq.block_tables == [[1, 2, 3, 7], [0, 5, 6, 8]]


def test_window_group_releases_between_prefill_chunks():
    mgr = make()
    seq = Sequence(list(range(100)))
    mgr.allocate_slots(seq, 40)
    mgr.mark_computed(seq, 40)
    mgr.allocate_slots(seq, 40)  # queries 40..79: the first still sees token 9
    assert seq.block_tables == [[1, 2, 3, 7, 8], [4, 5, 6, 9, 10]]
    mgr.mark_computed(seq, 40)
    # Queries 80..99 see keys from 49 on: window entries 0..2 (tokens 0..47) leave first, oldest first, and
    # the allocation evicts them again at once (the pool has 11 blocks).
    mgr.allocate_slots(seq, 20)
    assert seq.block_tables == [[1, 2, 3, 7, 8, 11, 4], [0, 0, 0, 9, 10, 5, 6]]
    assert mgr.pool.free_queue_ids() == []


def test_held_blocks_stay_within_the_window_however_long_the_sequence():
    mgr = make(num_blocks=40)
    seq = computed(mgr, list(range(20)))
    for t in range(20, 400):
        decode(mgr, seq, t)
        n = seq.num_tokens
        assert len(seq.block_tables[0]) == -(-n // 16)
        assert sum(b != 0 for b in seq.block_tables[1]) <= 32 // 16 + 1
    assert mgr.num_held_blocks(seq) == 25 + 2  # query 399 sees keys 368..399: window entries 23 and 24
    assert mgr.blocks_needed(400, 1) == 25 + 3  # the bound: ceil((W - 1 + 1) / B) + 1


def test_can_allocate_counts_the_blocks_a_release_gives_back():
    mgr = make(num_blocks=7)  # 6 usable blocks
    seq = computed(mgr, list(range(47)))  # [[1, 2, 3], [4, 5, 6]]: the pool is empty
    assert mgr.pool.num_available == 0
    seq.token_ids.append(47)
    assert mgr.can_allocate(seq, 1) and mgr.num_blocks_short(seq, 1) == 0  # no new block: fits
    seq.token_ids.append(48)
    mgr.allocate_slots(seq, 1)
    mgr.mark_computed(seq, 1)  # query 47 released window block 4
    assert seq.block_tables == [[1, 2, 3], [0, 5, 6]] and mgr.pool.free_queue_ids() == [4]
    # Token 48 needs a new block in each group: 2; block 4 and nothing else -> short by 1
    assert not mgr.can_allocate(seq, 1) and mgr.num_blocks_short(seq, 1) == 1


# ---------------------------------------------------------------- prefix cache per group

def test_prefix_hit_holds_only_the_window_blocks_at_its_end():
    mgr = make(num_blocks=16)
    a = computed(mgr, list(range(100)))
    assert a.block_tables == [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14]]
    mgr.free(a)  # group by group, each tail first
    assert mgr.pool.free_queue_ids() == [14, 7, 15, 6, 5, 4, 3, 2, 1, 13, 12, 11, 10, 9, 8]
    assert mgr.lookup_prefix(list(range(100))) == (96, [1, 2, 3, 4, 5, 6])
    b = Sequence(list(range(100)))
    mgr.allocate_slots(b, 100)
    # Query 96 sees keys 65..96: the window group takes its cached blocks 4 and 5, the rest is the null block.
    assert b.block_tables == [[1, 2, 3, 4, 5, 6, 14], [0, 0, 0, 0, 12, 13, 7]]
    assert b.num_computed_tokens == 96
    assert mgr.pool.state_of(8) == "cached"  # the window blocks before stay cached, unreferenced


def test_prefix_hit_shortens_to_where_the_window_group_holds_its_blocks():
    mgr = make(num_blocks=16)
    mgr.free(computed(mgr, list(range(100))))
    assert mgr.pool.evict_cached([13]) == 1  # window block 5 (tokens 80..95) is gone
    # At 96 the window misses block 5; at 80 it needs blocks 3 and 4 (keys 49..79): cached. 5 blocks hit.
    assert mgr.lookup_prefix(list(range(100))) == (80, [1, 2, 3, 4, 5])
    assert mgr.pool.evict_cached([10]) == 1  # window block 2 too: at 80 fine (needs 3, 4)
    assert mgr.lookup_prefix(list(range(100)))[0] == 80
    assert mgr.pool.evict_cached([11]) == 1  # window block 3: the longest run of 2 ending at a hit is 0..1
    assert mgr.lookup_prefix(list(range(100))) == (32, [1, 2])
    b = Sequence(list(range(100)))
    mgr.allocate_slots(b, 100)
    assert b.block_tables[1][:2] == [8, 9] and b.num_computed_tokens == 32


def test_window_groups_hash_under_their_own_namespace():
    mgr = make(num_blocks=16)
    seq = computed(mgr, list(range(32)))
    full, window = (mgr.pool.block(seq.block_tables[g][0]) for g in (0, 1))
    assert full.salt == "m" and window.salt == "m#g1"
    assert isinstance(window.block_hash, bytes) and len(window.block_hash) == 16  # the chain digest


# ---------------------------------------------------------------- fork, truncate, swap, free

def test_fork_shares_every_group_and_copies_each_partial_block_on_write():
    mgr = make(num_blocks=16)
    parent = computed(mgr, list(range(40)))
    child = mgr.fork(parent)
    assert child.block_tables == parent.block_tables == [[1, 2, 3], [4, 5, 6]]
    assert [mgr.pool.ref_count(b) for b in (1, 3, 4, 6)] == [2, 2, 2, 2]
    assert decode(mgr, child, 99) == [CopyOp(3, 7), CopyOp(6, 8)]
    assert child.block_tables == [[1, 2, 7], [4, 5, 8]]
    mgr.free(parent)
    mgr.free(child)
    assert mgr.pool.num_used == 1  # the null block


def test_truncate_refuses_to_go_back_where_the_window_was_released():
    mgr = make(num_blocks=16)
    seq = computed(mgr, list(range(48)))
    decode(mgr, seq, 48)  # query 48 released window block 0
    assert seq.block_tables == [[1, 2, 3, 7], [0, 5, 6, 8]]
    before = snapshot(mgr, [seq])
    with pytest.raises(ValueError, match="released the keys"):
        mgr.truncate(seq, 40)  # query 40 would see token 9 again
    assert snapshot(mgr, [seq]) == before
    mgr.truncate(seq, 47)  # query 47 sees 16.. : fine
    assert seq.block_tables == [[1, 2, 3], [0, 5, 6]] and mgr.pool.free_queue_ids()[:2] == [8, 7]


def test_swap_out_copies_held_blocks_and_keeps_the_null_entries():
    mgr = make(num_blocks=16, cpu=8)
    assert mgr.cpu_pool.free_queue_ids() == [1, 2, 3, 4, 5, 6, 7]  # CPU block 0: the same null block
    seq = computed(mgr, list(range(48)))
    decode(mgr, seq, 48)
    assert seq.block_tables == [[1, 2, 3, 7], [0, 5, 6, 8]]
    ops = mgr.swap_out(seq)
    assert ops == [CopyOp(1, 1), CopyOp(2, 2), CopyOp(3, 3), CopyOp(7, 4), CopyOp(5, 5), CopyOp(6, 6),
                   CopyOp(8, 7)]
    assert seq.block_tables == [[1, 2, 3, 4], [0, 5, 6, 7]]
    assert mgr.pool.free_queue_ids()[:7] == [8, 7, 9, 10, 11, 12, 13]  # the swapped blocks are cached behind
    assert mgr.swap_in(seq) == [CopyOp(1, 8), CopyOp(2, 7), CopyOp(3, 9), CopyOp(4, 10), CopyOp(5, 11),
                                CopyOp(6, 12), CopyOp(7, 13)]
    assert seq.block_tables == [[8, 7, 9, 10], [0, 11, 12, 13]]
    decode(mgr, seq, 49)  # grows on as before
    assert seq.block_tables == [[8, 7, 9, 10], [0, 11, 12, 13]] and seq.num_computed_tokens == 50


@pytest.mark.parametrize("seed", range(6))
def test_random_workload_keeps_every_invariant_with_window_groups(seed):
    groups = KVGroups((KVGroup(None, (0,)), KVGroup(12, (1,)), KVGroup(20, (2,))))
    counts = run_random_workload(seed, 300, groups=groups)
    assert counts["checks"] == 301 and counts["new"] > 0


# ---------------------------------------------------------------- the null page in a shared pool

def test_a_shared_pools_null_page_is_reserved_in_the_cpu_pool_too_or_refused():
    pool = BlockPool(8)
    pool.reserve(3)  # another model's weights: the null page is page 3
    with pytest.raises(ValueError, match=r"page 3 of the shared pool, past the CPU pool's 2 blocks"):
        KVCacheManager(CacheConfig(num_blocks=8, block_size=16, num_cpu_blocks=2, demote_to_cpu=False),
                       namespace="m", pool=pool, groups=FULL_AND_WINDOW)
    assert pool.num_reserved == 3  # nothing kept of the refused manager
    mgr = KVCacheManager(CacheConfig(num_blocks=8, block_size=16, num_cpu_blocks=6, demote_to_cpu=False),
                         namespace="m", pool=pool, groups=FULL_AND_WINDOW)
    assert mgr.null_block == 3 and mgr.cpu_pool.is_reserved(3) and mgr.cpu_pool.num_reserved == 1


# ---------------------------------------------------------------- the engine on a tiny Gemma 3

@pytest.fixture(scope="module")
def gemma_weights(tmp_path_factory):
    """A tiny random Gemma 3: 12 layers (5 and 11 global, the rest a 32-token window) -> groups of 2 layers."""
    cfg = replace(gemma3_config(n_layers=12, window=32), context_length=512, vocab=TINY_VOCAB)
    path = tmp_path_factory.mktemp("models") / "tiny-gemma3"
    write_tiny_model(path, seed=1, config=cfg)
    return ModelWeights.load(path)


@pytest.fixture(scope="module")
def gemma_reference(gemma_weights):
    return NumpyModel(gemma_weights)


PROMPTS = [list(range(3 + 7 * i, 3 + 7 * i + n)) for i, n in enumerate((5, 70, 41, 100))]
GREEDY = SamplingParams(max_tokens=24, stop_token_ids=(10_000,))


def run(engine, prompts, priorities=None):
    rids = [engine.add_request(p, GREEDY, priority=(priorities or [0] * len(prompts))[i])
            for i, p in enumerate(prompts)]
    reqs = [engine.request(r) for r in rids]
    while engine.has_unfinished:
        run_sync(engine.step())
    return [r.output_ids for r in reqs]


@pytest.fixture(scope="module")
def expected(gemma_reference):
    return [reference_greedy(gemma_reference, p, 24) for p in PROMPTS]


def engine_of(weights, num_blocks, cpu_blocks=0, **kw):
    backend = CpuBackend(weights, num_blocks=num_blocks, block_size=16, num_cpu_blocks=cpu_blocks)
    return LLMEngine(backend, Tokenizer.from_manifest(weights.manifest), EngineConfig(**kw))


def test_engine_with_window_groups_equals_the_reference_with_every_layer_full(gemma_weights, expected):
    engine = engine_of(gemma_weights, 96, max_num_batched_tokens=24)  # chunked prefill, 4 sequences at once
    assert engine.kv.num_groups == 6 and engine.backend.kv_groups.group_size == 2
    assert len(engine.backend.kv.k) == 2  # one pool per slot, not per layer
    assert run(engine, PROMPTS) == expected
    snap = engine.kv_snapshot()
    assert snap["groups"] == ["full"] + ["window 32"] * 5 and snap["group_used_blocks"] == [0] * 6


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_with_window_groups_keeps_the_reference_ids(gemma_weights, expected, mode):
    # 100 + 24 tokens in chunks of 32: at most 8 full-group blocks + 5 x 5 window blocks; 39 blocks (and the
    # null block) hold about one sequence.
    engine = engine_of(gemma_weights, 40, cpu_blocks=64, preemption=mode, enable_prefix_caching=False,
                       max_num_batched_tokens=32)
    assert run(engine, PROMPTS, priorities=[3, 2, 1, 0]) == expected
    assert engine.stats()["preemptions"][mode] >= 1


def test_prefix_hits_with_window_groups_keep_the_reference_ids(gemma_weights, gemma_reference, expected):
    engine = engine_of(gemma_weights, 96)
    (first,) = run(engine, [PROMPTS[3]])
    follow_up = PROMPTS[3] + first + [7, 8, 9]
    before = engine.stats()["prefill_tokens"]
    (second,) = run(engine, [follow_up])
    assert engine.stats()["prefill_tokens"] - before == len(follow_up) - 112  # 7 blocks from the cache
    assert second == reference_greedy(gemma_reference, follow_up, 24)


def test_kv_groups_false_keeps_every_layer_full(gemma_weights, expected):
    backend = CpuBackend(gemma_weights, num_blocks=96, block_size=16, kv_groups=False)
    engine = LLMEngine(backend, Tokenizer.from_manifest(gemma_weights.manifest), EngineConfig())
    assert engine.kv.num_groups == 1 and len(backend.kv.k) == 12
    assert run(engine, PROMPTS[:2]) == expected[:2]


def test_pages_shared_by_several_models_hold_one_groups_layers(gemma_weights):
    from pagedkv.backends.cpu import allocate_pages, plan_pages
    page, sizes = plan_pages([gemma_weights.config])  # 16 tokens of 2 layers x 2 KV heads x 16 f32
    assert (page, sizes) == (8192, [16])
    backend = CpuBackend(gemma_weights, 8, sizes[0], pages=allocate_pages(8, page))
    assert backend.kv_groups.group_size == 2 and len(backend.kv.k) == 2  # tests/test_kv_groups_shared_pool.py


def test_cli_sizes_its_pool_for_the_window_groups(gemma_weights, gemma_reference):
    from pagedkv.cli import generate_ids
    prompt = PROMPTS[3]
    ids, reason = generate_ids(gemma_weights, Tokenizer.from_manifest(gemma_weights.manifest), prompt, GREEDY)
    assert ids == reference_greedy(gemma_reference, prompt, 24) and reason == "length"


def test_perplexity_lanes_keep_every_layer_full(gemma_weights, gemma_reference):
    from pagedkv.evaluate import evaluate
    tokens = list(range(3, 83))  # past the 32-token window, in chunks of 32
    out = evaluate(gemma_weights, tokens, None, 16, 32)
    assert out["logp"].shape == (79,) and int(out["greedy"][-1]) == reference_greedy(gemma_reference, tokens[:79], 1)[0]


def test_beams_and_parallel_samples_with_window_groups_match_every_layer_full(gemma_weights):
    from pagedkv.beam_search import BeamSearchParams
    tok = Tokenizer.from_manifest(gemma_weights.manifest)
    engines = [LLMEngine(CpuBackend(gemma_weights, num_blocks=160, block_size=16, kv_groups=grouped), tok,
                         EngineConfig(max_num_batched_tokens=32)) for grouped in (True, False)]
    beams = [run_sync(e.beam_search(PROMPTS[3], BeamSearchParams(width=3, max_tokens=40, stop_token_ids=(10_000,))))
             for e in engines]
    assert [(h.token_ids, round(h.cum_logprob, 4)) for h in beams[0]] == [(h.token_ids, round(h.cum_logprob, 4))
                                                                      for h in beams[1]]
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=40, stop_token_ids=(10_000,))
    samples = [[s.output_ids for s in run_sync(e.generate(PROMPTS[1], params)).samples] for e in engines]
    assert samples[0] == samples[1] and len({tuple(s) for s in samples[0]}) > 1
    assert engines[0].kv.pool.num_used == 1  # every beam and sample freed; the null block stays reserved


def test_a_lone_window_group_is_treated_as_hybrid():
    mgr = make(groups=KVGroups((KVGroup(32, (0, 1)),)))
    assert mgr.is_hybrid and mgr.null_block == 0 and mgr.cpu.caching
    seq = computed(mgr, list(range(64)))
    decode(mgr, seq, 64)
    assert seq.block_tables == [[0, 0, 3, 4, 5]]  # query 64 sees keys 33..64: tokens 0..31 left
    assert mgr.swap_out(seq) == [CopyOp(3, 1), CopyOp(4, 2), CopyOp(5, 3)]
    assert seq.block_tables == [[0, 0, 1, 2, 3]]
    assert mgr.swap_in(seq) == [CopyOp(1, 5), CopyOp(2, 6), CopyOp(3, 7)]
    assert seq.block_tables == [[0, 0, 5, 6, 7]]
