"""The disk tier in the engine (CPU backend, tiny model): a fresh engine over the same store ("a reload")
restores the prefix from disk, prefills only the rest and replies exactly as the engine that never reloaded."""
from __future__ import annotations

import numpy as np
import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.config import CacheConfig
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.manager import KVCacheManager
from pagedkv.kv.disk_tier import DiskKey, DiskTier, MemoryStore, block_chain, model_hash
from pagedkv.kv.dtypes import KV_DTYPES, pack_tokens, round_trip
from pagedkv.sampling import SamplingParams
from pagedkv.sequence import Sequence
from pagedkv.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(10_000,))  # a stop id the tiny vocab never emits
TURN1 = list(range(3, 43))  # 40 tokens
MORE = list(range(100, 120))  # the user's next message: 20 tokens


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):
    return Tokenizer.from_manifest(tiny_weights.manifest)


def engine_on(weights, tokenizer, store, kv_dtype="f32", budget=1 << 30, num_blocks=64):
    backend = CpuBackend(weights, num_blocks=num_blocks, block_size=16, kv_dtype=kv_dtype)
    engine = LLMEngine(backend, tokenizer, EngineConfig())
    if store is not None:
        tier = DiskTier(store, DiskKey(model_hash(weights.manifest), backend.kv_spec), budget)
        run_sync(tier.open())
        engine.attach_disk(tier)
    return engine


def reply(engine, prompt):
    return run_sync(engine.generate(prompt, GREEDY)).output_ids


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_reload_restores_prefix_and_replies_the_same(tiny_weights, tokenizer, kv_dtype):
    store = MemoryStore()
    a = engine_on(tiny_weights, tokenizer, store, kv_dtype)
    out1 = reply(a, TURN1)
    assert a.stats()["disk_blocks"] == 3  # 40 + 12 tokens, 51 computed: 3 full blocks
    turn2 = TURN1 + out1 + MORE  # 72 tokens
    out2 = reply(a, turn2)
    stats = a.stats()
    # 72 + 12 tokens, 83 computed: 5 blocks; turn 2 found its first 3 on the GPU and on disk.
    assert (stats["disk_blocks"], stats["disk_written_blocks"], stats["disk_restored_tokens"]) == (5, 5, 0)
    assert stats["disk_bytes"] == 5 * a.disk.key.file_bytes

    b = engine_on(tiny_weights, tokenizer, store, kv_dtype)  # the page reloaded: empty GPU pool, same store
    assert reply(b, turn2) == out2
    stats = b.stats()
    # (72 - 1) // 16 = 4 blocks come from disk; the model computes the other 8 prompt tokens.
    assert (stats["disk_restored_tokens"], stats["last_disk_restored_tokens"]) == (64, 64)
    assert stats["prefill_tokens"] == 8 and stats["disk_written_blocks"] == 0

    c = engine_on(tiny_weights, tokenizer, None, kv_dtype)  # no disk tier: the whole history again
    assert reply(c, turn2) == out2 and c.stats()["prefill_tokens"] == 72


def test_corrupt_block_file_is_recomputed(tiny_weights, tokenizer):
    store = MemoryStore()
    a = engine_on(tiny_weights, tokenizer, store)
    out1 = reply(a, TURN1)
    turn2 = TURN1 + out1 + MORE
    out2 = reply(a, turn2)
    second = a.disk.key.file_name(block_chain(a.disk.key, turn2, 2)[1])
    assert second in a.disk.tier.lru_names()
    data = bytearray(store.files[second])
    data[-1] ^= 0x40  # one flipped bit in the last layer's V
    store.files[second] = bytes(data)

    b = engine_on(tiny_weights, tokenizer, store)
    assert reply(b, turn2) == out2
    stats = b.stats()
    assert (stats["disk_restored_tokens"], stats["prefill_tokens"], stats["disk_corrupt_blocks"]) == (16, 56, 1)
    assert "payload fails its sha256 check; recomputing it" in stats["disk_notes"][0]
    # The recomputed block went back to disk, so the next reload restores all four.
    assert stats["disk_written_blocks"] == 1  # block 1 again; blocks 2-4 were still on disk
    c = engine_on(tiny_weights, tokenizer, store)
    assert reply(c, turn2) == out2 and c.stats()["disk_restored_tokens"] == 64


def test_full_store_degrades_without_error(tiny_weights, tokenizer):
    backend = CpuBackend(tiny_weights, num_blocks=64, block_size=16)
    file_bytes = DiskKey("x", backend.kv_spec).file_bytes
    store = MemoryStore(quota_bytes=2 * file_bytes)
    a = engine_on(tiny_weights, tokenizer, store)
    out1 = reply(a, TURN1)  # three blocks fill, the store takes two
    stats = a.stats()
    assert (stats["disk_blocks"], stats["disk_written_blocks"]) == (2, 2)
    # The LRU index after the first two blocks did not fit either: noted once, before the third block's note.
    assert [n.split(" (")[0] for n in stats["disk_notes"]] == ["the disk's LRU order was not saved", "disk full"]
    assert len(store.files) == 2
    b = engine_on(tiny_weights, tokenizer, None)
    assert reply(b, TURN1) == out1  # what the disk did or did not hold changes no token


@pytest.mark.parametrize("interval_s, writes", [(10.0, 2), (0.0, 5)])
def test_a_turn_writes_the_lru_index_once_more_at_its_end(tiny_weights, tokenizer, interval_s, writes):
    """A frozen clock: the first write, then none until the turn's last step forces it (with no interval, one
    per step whose write-behind or restore moved the LRU: the five steps here that filled a block)."""
    backend = CpuBackend(tiny_weights, num_blocks=64, block_size=16)
    store = MemoryStore()
    tier = DiskTier(store, DiskKey(model_hash(tiny_weights.manifest), backend.kv_spec), 1 << 30,
                    index_interval_s=interval_s, clock=lambda: 5.0)
    run_sync(tier.open())
    engine = LLMEngine(backend, tokenizer, EngineConfig(max_num_batched_tokens=16))
    engine.attach_disk(tier)
    run_sync(engine.generate(TURN1, SamplingParams(max_tokens=50, stop_token_ids=(10_000,))))  # 90 tokens
    prefix = tier.key.hex + "-"
    assert tier.num_blocks == 5 and engine.stats()["disk_index_writes"] == writes
    assert store.files[tier.index_name].decode().split() == [n[len(prefix):] for n in tier.lru_names()]


def test_disk_layout_must_match_the_backend(tiny_weights, tokenizer):
    a = engine_on(tiny_weights, tokenizer, None, "f16")
    f32 = CpuBackend(tiny_weights, num_blocks=8, block_size=16)
    tier = DiskTier(MemoryStore(), DiskKey("x", f32.kv_spec), 1 << 20)
    with pytest.raises(ValueError, match="the disk tier holds DiskKey.*dtype='f32'.*backend's KV is .*'f16'"):
        a.attach_disk(tier)


@pytest.mark.parametrize("kv_dtype", list(KV_DTYPES))
def test_cpu_blocks_round_trip_in_gpu_words(tiny_weights, kv_dtype):
    backend = CpuBackend(tiny_weights, num_blocks=6, block_size=16, kv_dtype=kv_dtype)
    cfg = backend.config
    rng = np.random.default_rng(1)
    for pool in (*backend.kv.k, *backend.kv.v):  # what kv_write would have left: round-tripped rows
        pool[...] = round_trip(rng.standard_normal(pool.shape).astype(np.float32), kv_dtype)
    words = run_sync(backend.read_blocks([4, 1]))
    tu = KV_DTYPES[kv_dtype].token_u32s(cfg.n_kv_heads, cfg.head_dim)
    assert words.shape == (2, cfg.n_layers, 2, 16, tu) and words.dtype == np.uint32
    np.testing.assert_array_equal(words[0, 1, 1], pack_tokens(backend.kv.v[1][4], kv_dtype))
    run_sync(backend.write_blocks([0, 2], words))
    for layer in range(cfg.n_layers):
        for src, dst in ((4, 0), (1, 2)):
            for pool in (backend.kv.k[layer], backend.kv.v[layer]):
                if kv_dtype in ("f32", "f16"):  # exact: the values are the stored floats
                    np.testing.assert_array_equal(pool[dst], pool[src])
                else:  # re-quantizing dequantized values: the same codes, scales within an f16 step
                    scale = np.abs(pool[src]).max()
                    assert np.abs(pool[dst] - pool[src]).max() <= 2e-3 * scale


def test_adopt_blocks_extends_the_cached_prefix():
    kv = KVCacheManager(CacheConfig(num_blocks=6, block_size=16))
    tokens = list(range(1, 70))  # 4 full blocks + 5 tokens
    first = Sequence(tokens[:20])
    kv.allocate_slots(first, 20)  # block 0 (full, registered) + block 1 (partial)
    kv.free(first)
    assert kv.pool.free_queue_ids() == [1, 2, 3, 4, 5, 0]
    assert kv.adopt_blocks(tokens, 0, 2) == []  # the cached prefix is 1 block, not 0: payloads would not line up
    assert kv.adopt_blocks(tokens, 1, 5) == [1, 2, 3]  # blocks 1..3 of the tokens; only 4 are full
    # All cached now, ref 0; freed in reverse, so the prefix is evicted last.
    assert kv.pool.free_queue_ids() == [4, 5, 3, 2, 1, 0]
    assert kv.lookup_prefix(tokens) == (64, [0, 1, 2, 3])
    seq = Sequence(tokens)
    kv.allocate_slots(seq, len(tokens))
    assert (seq.num_computed_tokens, seq.block_table) == (64, [0, 1, 2, 3, 4])


def test_blocks_two_live_chats_fill_together_are_read_and_written_once(tiny_weights, tokenizer):
    """Two requests with one prompt, prefilled in one step, fill blocks of the same prefix hashes together:
    write-behind reads each hash's block back once and stores it once."""
    engine = engine_on(tiny_weights, tokenizer, MemoryStore())
    read: list[int] = []
    read_blocks = engine.backend.read_blocks

    async def spy(block_ids):
        read.extend(block_ids)
        return await read_blocks(block_ids)

    engine.backend.read_blocks = spy
    outs = {engine.add_request(TURN1, GREEDY): [] for _ in range(2)}
    while engine.has_unfinished:
        for out in run_sync(engine.step()):
            outs[out.request_id] += out.token_ids
    alone = engine_on(tiny_weights, tokenizer, None)
    assert list(outs.values()) == [reply(alone, TURN1)] * 2
    stats = engine.stats()
    assert stats["disk_blocks"] == stats["disk_written_blocks"] == len(read) == 3


def test_block_reads_refuse_a_repeated_id(tiny_weights):
    backend = CpuBackend(tiny_weights, num_blocks=6, block_size=16)
    with pytest.raises(ValueError, match="a block id appears twice"):
        run_sync(backend.read_blocks([1, 1]))
