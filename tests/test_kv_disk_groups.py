"""The CPU and disk tiers with KV groups (kv/groups.py): a tiny Gemma 3 (12 layers, a 32-token window in 10 of
them: 1 full group + 5 window groups of 2 layers) keeps its prefix across a reload from disk and across
demotion to and promotion from the CPU tier, by the manager's rule for group hits: every block of the full
group up to the hit, the blocks of each window group its next query sees.

Exact block ids on the manager (block size 16, a full group and a 32-token window group, block 0 the null
block in both pools); exact token counts and the reference's greedy ids in the engine."""
from __future__ import annotations

import pytest

from model_fixtures import gemma_dir, gemma_weights, reference_greedy  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.numpy_ref import NumpyModel
from pagedkv.config import CacheConfig
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.block_files import group_seed
from pagedkv.kv.disk_tier import DiskKey, DiskTier, MemoryStore, block_chain, model_hash
from pagedkv.kv.groups import KVGroup, KVGroups
from pagedkv.kv.manager import CopyOp, KVCacheManager
from pagedkv.kv.spec import KVSpec
from pagedkv.sampling import SamplingParams
from pagedkv.sequence import Sequence
from pagedkv.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(10_000,))
TURN1 = [3 + (7 * i) % 200 for i in range(100)]  # 100 tokens
MORE = list(range(40, 78))  # the next message: 38 tokens, so turn 2 is 100 + 12 + 38 = 150 tokens
FULL_AND_WINDOW = KVGroups((KVGroup(None, (0,)), KVGroup(32, (1,))))


@pytest.fixture(scope="module")
def turns(gemma_weights):
    """(out1, turn 2's prompt, out2) of the reference forward, every layer full."""
    ref = NumpyModel(gemma_weights)
    out1 = reference_greedy(ref, TURN1, 12)
    turn2 = TURN1 + out1 + MORE
    return out1, turn2, reference_greedy(ref, turn2, 12)


def engine_on(weights, store, num_blocks=96, cpu_blocks=0, **config):
    backend = CpuBackend(weights, num_blocks=num_blocks, block_size=16, num_cpu_blocks=cpu_blocks)
    engine = LLMEngine(backend, Tokenizer.from_manifest(weights.manifest), EngineConfig(**config))
    if store is not None:
        tier = DiskTier(store, DiskKey(model_hash(weights.manifest), backend.kv_spec), 1 << 30)
        run_sync(tier.open())
        engine.attach_disk(tier)
    return engine


def reply(engine, prompt):
    return run_sync(engine.generate(prompt, GREEDY)).output_ids


def group_files(key, token_ids, num_blocks, groups=range(6)):
    return {key.file_name(h) for g in groups for h in block_chain(key, token_ids, num_blocks, group=g)}


# ---------------------------------------------------------------- file names

def test_each_group_has_a_chain_of_its_own_and_the_one_group_layout_is_unchanged():
    flat = DiskKey("m", KVSpec(12, 1, 16, block_size=16, dtype="f32"))
    paged = DiskKey("m", KVSpec(12, 1, 16, block_size=16, dtype="f32", layers_per_page=2))
    assert (flat.num_groups, paged.num_groups) == (1, 6)
    assert paged.hex != flat.hex  # a page of 2 layers is another payload: another layout key
    assert paged.payload_bytes * 6 == flat.payload_bytes == 12 * 2 * 16 * 16 * 4
    assert group_seed(flat, 0) == bytes.fromhex(flat.hex)  # group 0: the chain a model without groups has
    tokens = list(range(32))
    chains = [block_chain(paged, tokens, group=g) for g in range(6)]
    assert len({h for c in chains for h in c}) == 12  # 2 blocks x 6 groups, all different
    assert block_chain(paged, tokens) == chains[0]
    with pytest.raises(ValueError, match="KV group 1 of a layout with 1"):
        block_chain(flat, tokens, group=1)


# ---------------------------------------------------------------- the engine over a reload

def test_reload_restores_every_groups_prefix_from_disk(gemma_weights, turns):
    out1, turn2, out2 = turns
    store = MemoryStore()
    a = engine_on(gemma_weights, store)
    assert a.kv.num_groups == 6 and a.disk.key.num_groups == 6
    assert reply(a, TURN1) == out1
    key = a.disk.key
    # 100 + 11 computed tokens: 6 full blocks, every group's written (a window group's while it holds them).
    assert set(a.disk.tier.lru_names()) == group_files(key, TURN1 + out1, 6)
    assert reply(a, turn2) == out2
    stats = a.stats()
    # 150 + 11 computed: 10 full blocks per group; turn 2 found 6 of them on the GPU.
    assert (stats["disk_blocks"], stats["disk_written_blocks"], stats["disk_restored_tokens"]) == (60, 60, 0)
    assert set(a.disk.tier.lru_names()) == group_files(key, turn2 + out2, 10)
    assert stats["disk_bytes"] == 60 * key.file_bytes

    b = engine_on(gemma_weights, store)  # the page reloaded: empty GPU pool, same store
    assert reply(b, turn2) == out2
    stats = b.stats()
    # (150 - 1) // 16 = 9 blocks from disk: the full group's 0..8 and each window group's 7 and 8 (a query at
    # 144 sees keys 113..144): 9 + 5 x 2 = 19 pages; the model computes the other 6 prompt tokens.
    assert (stats["disk_restored_tokens"], stats["last_disk_restored_tokens"]) == (144, 144)
    assert stats["prefill_tokens"] == 6 and stats["disk_written_blocks"] == 0
    assert b.disk.tier.num_read == 19


def test_a_damaged_file_of_one_window_group_is_recomputed(gemma_weights, turns):
    out1, turn2, out2 = turns
    store = MemoryStore()
    a = engine_on(gemma_weights, store)
    reply(a, TURN1)
    reply(a, turn2)
    key = a.disk.key
    eighth = key.file_name(block_chain(key, turn2, 9, group=3)[8])  # window group 3's block 8
    data = bytearray(store.files[eighth])
    data[-1] ^= 0x40
    store.files[eighth] = bytes(data)

    b = engine_on(gemma_weights, store)
    assert reply(b, turn2) == out2
    stats = b.stats()
    # Without group 3's block 8 the hit ends at block 8 (a query at 128 sees blocks 6 and 7 of each window).
    assert (stats["disk_restored_tokens"], stats["prefill_tokens"], stats["disk_corrupt_blocks"]) == (128, 22, 1)
    assert "payload fails its sha256 check; recomputing it" in stats["disk_notes"][0]
    assert stats["disk_written_blocks"] == 1  # group 3's block 8 again; every other file was still there
    c = engine_on(gemma_weights, store)
    assert reply(c, turn2) == out2 and c.stats()["disk_restored_tokens"] == 144


def test_deleting_a_chat_deletes_every_groups_files_and_a_flush_writes_them(gemma_weights, turns):
    out1, turn2, out2 = turns
    store = MemoryStore()
    a = engine_on(gemma_weights, store)
    reply(a, TURN1)
    history = TURN1 + out1
    a.refer_history("chat", history)
    assert a.disk.tier.held_only_by("chat") == {h for g in range(6) for h in block_chain(a.disk.key, history, group=g)}
    # Files another tab deleted: the flush writes back what the GPU cache holds of the history (its last token
    # was never computed: 111 tokens, 6 full blocks): the full group's 0..5 and each window group's 4 and 5 (the
    # window of a query at 96).
    for name in list(store.files):
        if not name.endswith(".lru"):
            del store.files[name]
    assert run_sync(a.flush_disk()) == 6 + 5 * 2
    assert set(store.files) - {a.disk.tier.index_name} == (
        group_files(a.disk.key, history, 6, [0])
        | {a.disk.key.file_name(block_chain(a.disk.key, history, 6, group=g)[i]) for g in range(1, 6) for i in (4, 5)})
    assert run_sync(a.forget_owner("chat")) == 16 and a.disk.tier.num_blocks == 0


# ---------------------------------------------------------------- the CPU tier

def manager(num_blocks=7, cpu=12):
    return KVCacheManager(CacheConfig(num_blocks=num_blocks, block_size=16, num_cpu_blocks=cpu, demote_to_cpu=True),
                          namespace="m", groups=FULL_AND_WINDOW)


def computed(kv, tokens):
    seq = Sequence(tokens)
    kv.allocate_slots(seq, len(tokens))
    kv.mark_computed(seq, len(tokens))
    return seq


def test_evicted_pages_of_every_group_are_demoted_and_promoted_back_by_the_groups_rule():
    kv = manager()
    a_tokens = list(range(48))
    a = computed(kv, a_tokens)
    assert a.block_tables == [[1, 2, 3], [4, 5, 6]]
    kv.free(a)  # every page cached (ref 0)
    b = computed(kv, list(range(100, 148)))  # 6 fresh pages: A's are evicted, each to the CPU pool
    assert b.block_tables == [[3, 2, 1], [6, 5, 4]]
    assert kv.take_demotions() == [CopyOp(3, 1), CopyOp(2, 2), CopyOp(1, 3), CopyOp(6, 4), CopyOp(5, 5), CopyOp(4, 6)]
    assert kv.lookup_prefix(a_tokens) == (0, [])
    kv.free(b)
    # A's 3 blocks come back: the full group's 0..2 and the window group's 1 and 2 (a query at 48 sees keys
    # 17..48), not its block 0: 5 pages, into GPU pages whose B blocks are demoted first.
    assert kv.promote_from_cpu(a_tokens) == [CopyOp(3, 1), CopyOp(2, 2), CopyOp(1, 3), CopyOp(5, 4), CopyOp(4, 5)]
    assert kv.take_demotions() == [CopyOp(1, 7), CopyOp(2, 8), CopyOp(3, 9), CopyOp(4, 10), CopyOp(5, 11)]
    assert kv.cached_tables(a_tokens) == [[1, 2, 3], [0, 4, 5]]
    assert kv.lookup_prefix(a_tokens) == (48, [1, 2, 3])
    # Promoted pages are used now: the recent end of the CPU pool's LRU; A's window block 0 (CPU 6) is oldest.
    assert kv.cpu_pool.free_queue_ids() == [6, 7, 8, 9, 10, 11, 4, 5, 1, 2, 3]
    assert kv.cpu.forget(a_tokens) == 6 and kv.cpu_pool.num_cached == 5  # every group's pages of A go


def test_engine_with_a_cpu_tier_restores_a_hybrid_prefix_from_it(gemma_weights, turns):
    out1, turn2, out2 = turns
    # 40 pages (the null one aside), prefill in chunks of 32: a chat of 162 tokens holds at most 11 full-group
    # pages + 5 x 5 window pages. Chat B's allocations evict A's cached pages to the CPU pool; A's next turn
    # promotes them back.
    e = engine_on(gemma_weights, None, num_blocks=40, cpu_blocks=64, max_num_batched_tokens=32)
    assert reply(e, turn2) == out2
    other = [5 + (11 * i) % 190 for i in range(150)]
    reply(e, other)
    stats = e.stats()
    # Every cached page an allocation evicts is demoted (window pages released in a chat's own prefill too),
    # the CPU pool's 63 pages (the null one aside) keeping the most recent.
    assert (stats["cpu_demoted_blocks"], stats["cpu_cached_blocks"]) == (87, 63)
    before = stats["prefill_tokens"]
    assert reply(e, turn2) == out2
    stats = e.stats()
    assert (stats["cpu_restored_tokens"], stats["prefill_tokens"] - before) == (144, 6)


def test_swapped_out_pages_of_every_group_are_found_in_the_cpu_tier():
    kv = manager(num_blocks=9)
    tokens = list(range(49))  # 3 full blocks and one token
    seq = computed(kv, tokens)
    assert seq.block_tables == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert kv.swap_out(seq) == [CopyOp(g, g) for g in range(1, 9)]
    kv.free(seq)  # the full pages of both groups stay cached in the CPU pool: 3 + 3
    assert kv.cpu_pool.num_cached == 6
    kv.evict_prefix(tokens)  # and leave the GPU cache
    assert kv.lookup_prefix(tokens) == (0, [])
    # The full group's 3 pages and the window group's blocks 1 and 2 (CPU 6 and 7) come back.
    assert kv.promote_from_cpu(tokens[:48]) == [CopyOp(1, 7), CopyOp(2, 6), CopyOp(3, 3), CopyOp(6, 2), CopyOp(7, 1)]
    assert kv.take_demotions() == [] and kv.cached_tables(tokens[:48]) == [[7, 6, 3], [0, 2, 1]]
