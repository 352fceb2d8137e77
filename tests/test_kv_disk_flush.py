"""The disk tier's flush (LLMEngine.flush_disk, CPU backend, tiny model): every full block of a chat's history
that the GPU holds computed ends up on disk, also one whose write failed or whose file another tab deleted; a
flush waits for a step in flight and writes nothing twice; DiskTier.resync follows another tab's files."""
from __future__ import annotations

import asyncio

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.disk_tier import DiskKey, DiskTier, MemoryStore, block_chain, model_hash
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer
from test_chat_service import in_fresh_loop

GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(10_000,))  # a stop id the tiny vocab never emits
TURN1 = list(range(3, 43))  # 40 tokens: 40 + 12 = 52, 51 computed, 3 full blocks


class FlakyStore(MemoryStore):
    """A MemoryStore whose writes of the names in `fail` raise OSError (a file lost as it was written)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: set[str] = set()
        self.delay_s = 0.0
        self.writes: list[str] = []

    async def write(self, name: str, data: bytes) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # a step's write-behind awaits real I/O, as OPFS does
        if name in self.fail:
            raise OSError(f"{name} went as it was written")
        self.writes.append(name)
        await super().write(name, data)


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):
    return Tokenizer.from_manifest(tiny_weights.manifest)


def engine_on(weights, tokenizer, store) -> LLMEngine:
    backend = CpuBackend(weights, num_blocks=64, block_size=16, kv_dtype="f32")
    engine = LLMEngine(backend, tokenizer, EngineConfig())
    tier = DiskTier(store, DiskKey(model_hash(weights.manifest), backend.kv_spec), 1 << 30)
    run_sync(tier.open())
    engine.attach_disk(tier)
    return engine


def block_files(engine, store) -> list[str]:
    prefix = engine.disk.key.hex + "-"
    return sorted(name for name in store.files if name.startswith(prefix))


def chain_files(engine, history: list[int], n: int) -> list[str]:
    return sorted(engine.disk.key.file_name(h) for h in block_chain(engine.disk.key, history, n))


def test_flush_writes_the_blocks_write_behind_could_not(tiny_weights, tokenizer):
    store = FlakyStore()
    engine = engine_on(tiny_weights, tokenizer, store)
    history = TURN1 + list(range(200, 212))  # the chat's history as its owner names it (52 tokens)
    second = engine.disk.key.file_name(block_chain(engine.disk.key, TURN1, 2)[1])
    store.fail = {second}
    out = run_sync(engine.generate(TURN1, GREEDY)).output_ids
    history = TURN1 + out
    engine.refer_history("chat-1", history)
    assert len(block_files(engine, store)) == 2 and second not in store.files
    assert engine.stats()["disk_notes"][-1].startswith(f"block {second.split('-')[1]} was not written")
    store.fail = set()
    assert run_sync(engine.flush_disk()) == 1
    assert block_files(engine, store) == chain_files(engine, history, 3)
    assert store.writes[-2:] == [second, engine.disk.tier.index_name]  # the block, then the LRU order
    assert run_sync(engine.flush_disk()) == 0  # everything is on disk: nothing written twice
    assert engine.stats()["disk_written_blocks"] == 3


def test_flush_writes_back_what_another_tab_deleted(tiny_weights, tokenizer):
    store = FlakyStore()
    engine = engine_on(tiny_weights, tokenizer, store)
    out = run_sync(engine.generate(TURN1, GREEDY)).output_ids
    history = TURN1 + out
    engine.refer_history("chat-1", history)
    files = block_files(engine, store)
    assert files == chain_files(engine, history, 3)
    for name in files[:2]:  # another tab of the origin evicted two of them (its own budget)
        del store.files[name]
    store.files["0123456789abcdef-" + "ab" * 16] = b"x" * 100  # and wrote a block of another layout
    assert run_sync(engine.flush_disk()) == 2
    assert block_files(engine, store) == files
    assert engine.disk.tier.num_bytes == 3 * engine.disk.key.file_bytes + 100  # the other tab's file counts
    # The chat deleted: its files go, the other layout's stays; a flush then writes nothing back.
    assert run_sync(engine.forget_owner("chat-1")) == 3
    assert run_sync(engine.flush_disk()) == 0 and block_files(engine, store) == []


def test_flush_waits_for_a_step_in_flight_and_writes_each_block_once(tiny_weights, tokenizer):
    store = FlakyStore()
    store.delay_s = 0.002
    engine = engine_on(tiny_weights, tokenizer, store)
    params = SamplingParams(max_tokens=40, stop_token_ids=(10_000,))  # 80 tokens, 79 computed: 4 blocks

    async def chat() -> tuple[list[int], list[int]]:
        task = asyncio.ensure_future(engine.generate(TURN1, params))
        flushed = []
        while not task.done():  # a flush asked for at every turn of the loop, a step mostly in flight
            flushed.append(await engine.flush_disk())
            await asyncio.sleep(0)  # the page's messages arrive between the loop's turns, never back to back
        return (await task).output_ids, flushed

    out, flushed = in_fresh_loop(chat)  # not asyncio.run: Playwright may run a loop in this thread
    history = TURN1 + out
    assert block_files(engine, store) == chain_files(engine, history, 4)
    blocks = [name for name in store.writes if name != engine.disk.tier.index_name]
    assert sorted(blocks) == chain_files(engine, history, 4)  # each file written once, by the step or a flush
    assert engine.disk.tier.num_written == 4 and len(flushed) > 1  # flushes ran between the steps


def test_resync_follows_another_tabs_files(tiny_weights):
    backend = CpuBackend(tiny_weights, num_blocks=8, block_size=16, kv_dtype="f32")
    key = DiskKey("m", backend.kv_spec)
    store = MemoryStore()
    tier = DiskTier(store, key, 1 << 30)
    run_sync(tier.open())
    hashes = block_chain(key, list(range(48)))
    payload = bytes(key.payload_bytes)
    for i, h in enumerate(hashes[:2]):
        run_sync(tier.save(h, list(range(i * 16, i * 16 + 16)), payload))
    run_sync(tier.flush(force=True))
    other = DiskTier(store, key, 1 << 30)  # the other tab's tier over the same directory
    run_sync(other.open())
    run_sync(other.save(hashes[2], list(range(32, 48)), payload))
    del store.files[key.file_name(hashes[0])]  # ... which also evicted this tab's first block
    assert run_sync(tier.resync()) == (1, 1)
    assert tier.lru_names() == [key.file_name(hashes[1]), key.file_name(hashes[2])]
    assert run_sync(tier.resync()) == (0, 0)
