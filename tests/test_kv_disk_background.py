"""The disk tier's write-behind through a writer task once the engine is idle (DiskCache(background=True), what
the page uses; CPU backend, tiny model): no step of a reply writes a file (until a reply ends while another
streams: then a batch a step), the writer then writes the in-step
mode's files byte for byte, several at once; a flush and the queue's bound write the queue first, a forget drops
what only the forgotten chat held; an error of the writer comes out of the next step."""
from __future__ import annotations

import asyncio

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv import disk_cache
from pagedkv.kv.disk_tier import DiskKey, DiskTier, MemoryStore, block_chain, model_hash
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer
from test_chat_service import in_fresh_loop
from test_kv_disk_flush import FlakyStore, block_files, chain_files

PROMPT = list(range(3, 83))  # 80 tokens: 5 full blocks after the prefill
PARAMS = SamplingParams(max_tokens=40, stop_token_ids=(10_000,))  # 120 tokens, 119 computed: 7 full blocks


class SlowStore(FlakyStore):
    """A FlakyStore whose block writes wait `delay_s` (real I/O, as OPFS's round trips) and that counts how many
    are under way at once."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.open = 0
        self.most_open = 0
        self.broken = False

    async def write(self, name: str, data: bytes) -> None:
        if self.broken:
            raise RuntimeError("the store broke")
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await super().write(name, data)
        finally:
            self.open -= 1


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):
    return Tokenizer.from_manifest(tiny_weights.manifest)


def engine_on(weights, tokenizer, store, background: bool) -> LLMEngine:
    backend = CpuBackend(weights, num_blocks=64, block_size=16, kv_dtype="f32")
    engine = LLMEngine(backend, tokenizer, EngineConfig())
    tier = DiskTier(store, DiskKey(model_hash(weights.manifest), backend.kv_spec), 1 << 30)
    run_sync(tier.open())
    engine.lane().attach_disk(tier, background)
    return engine


def test_the_steps_go_on_while_the_writer_writes_and_a_turn_ends_with_the_same_files(tiny_weights, tokenizer):
    in_step = MemoryStore()
    expected = run_sync(engine_on(tiny_weights, tokenizer, in_step, False).generate(PROMPT, PARAMS)).output_ids
    store = SlowStore(0.01)
    engine = engine_on(tiny_weights, tokenizer, store, True)

    async def chat():
        rid = engine.add_request(PROMPT, PARAMS)
        req = engine.request(rid)
        written = []
        while engine.is_unfinished(rid):
            await engine.step()
            written.append(len(store.writes))
        writing = engine.disk.writing  # the last step started the writer, and returned
        await engine.settle_disk()
        return req.output_ids, written, writing

    out, written, writing = in_fresh_loop(chat)
    assert out == expected
    assert set(written) == {0} and writing  # no file written while the reply ran
    assert not engine.disk.writing and engine.stats()["disk_written_blocks"] == 7
    assert block_files(engine, store) == chain_files(engine, PROMPT + out, 7)
    assert {n: store.files[n] for n in block_files(engine, store)} == \
        {n: in_step.files[n] for n in block_files(engine, in_step)}  # byte for byte the in-step mode's files
    assert store.most_open == disk_cache.WRITE_BATCH  # 7 blocks: 4 files at once, then 3
    assert store.writes[-1] == engine.disk.tier.index_name  # then the LRU order


def test_a_reply_that_ends_while_another_streams_is_on_disk_a_few_steps_later(tiny_weights, tokenizer):
    """A short reply ends while a long one streams: its blocks are not left queued until the engine is idle
    (a reload then found none) but written one batch (4 files) in each following step, the ended reply's
    blocks first, then the queue oldest first; until a reply ends, no step writes."""
    store = SlowStore(0.0)
    engine = engine_on(tiny_weights, tokenizer, store, True)
    long = SamplingParams(max_tokens=150, stop_token_ids=(10_000,))

    async def chat():
        streaming = engine.add_request(list(range(100, 120)), long)
        short = engine.request(engine.add_request(PROMPT, SamplingParams(max_tokens=20, stop_token_ids=(10_000,))))
        while engine.is_unfinished(short.request_id):
            await engine.step()
        before = len(block_files(engine, store))
        await engine.step()
        first = set(block_files(engine, store))  # the ended reply's blocks come first
        steps = 1
        while len(block_files(engine, store)) < 6 and engine.is_unfinished(streaming):
            await engine.step()
            steps += 1
        unfinished = engine.is_unfinished(streaming)
        if unfinished:
            engine.abort(streaming)
        return short.output_ids, before, first, steps, unfinished

    out, before, first, steps, still_streaming = in_fresh_loop(chat)
    assert before == 0  # nothing written while no reply had ended
    files = set(block_files(engine, store))
    assert set(chain_files(engine, PROMPT + out, 6)) <= files  # its 99 computed tokens: 6 full blocks
    assert first <= set(chain_files(engine, PROMPT + out, 6)) and len(first) == 4  # a batch, its blocks first
    # the long reply's first 2 blocks (40 tokens computed by then) and the short one's 6: two batches
    assert still_streaming and steps == 2
    assert engine.stats()["disk_written_blocks"] == 8 and not engine.disk.writing


def test_forget_and_flush_wait_for_the_writer(tiny_weights, tokenizer):
    store = SlowStore(0.01)
    engine = engine_on(tiny_weights, tokenizer, store, True)

    async def forget_while_queued():
        rid = engine.add_request(PROMPT, SamplingParams(max_tokens=8, stop_token_ids=(10_000,)))
        await engine.step()  # 5 blocks queued
        engine.refer_history("chat-1", PROMPT)
        engine.refer_history("chat-2", PROMPT[:32])  # another chat shares the first 2 blocks
        assert engine.disk.writing and not store.writes
        engine.abort(rid)
        gone = await engine.forget_owner("chat-1")  # the 3 blocks only it held: dropped, never written
        queued = len(engine.disk._queue)
        flushed = await engine.flush_disk()  # the queue first (the shared blocks), then nothing new
        return gone, queued, block_files(engine, store), flushed

    gone, queued, left, flushed = in_fresh_loop(forget_while_queued)
    assert gone == 3 and queued == 2 and flushed == 0
    assert left == chain_files(engine, PROMPT, 2)  # the shared blocks
    assert sorted(n for n in store.writes if n.startswith(engine.disk.key.hex + "-")) == left  # nothing else

    store = SlowStore(0.01)
    engine = engine_on(tiny_weights, tokenizer, store, True)

    async def forget_while_writing():
        rid = engine.add_request(PROMPT, SamplingParams(max_tokens=8, stop_token_ids=(10_000,)))
        await engine.step()
        engine.refer_history("chat-1", PROMPT)
        engine.abort(rid)
        assert engine.disk.write_when_idle()  # the writer has begun its first batch of 4
        await asyncio.sleep(0)
        gone = await engine.forget_owner("chat-1")  # the queued one dropped; the batch lands, then is deleted
        return gone, block_files(engine, store)

    gone, left = in_fresh_loop(forget_while_writing)
    assert gone == 5 and left == []

    store = SlowStore(0.01)
    engine = engine_on(tiny_weights, tokenizer, store, True)

    async def flush_while_queued():
        rid = engine.add_request(PROMPT, PARAMS)
        await engine.step()
        engine.refer_history("chat-1", PROMPT)
        flushed = await engine.flush_disk()  # the queue first: what it wrote is not written again
        landed = len(block_files(engine, store))
        engine.abort(rid)
        return flushed, landed

    flushed, landed = in_fresh_loop(flush_while_queued)
    assert flushed == 0 and landed == 5 and sorted(store.writes[:5]) == chain_files(engine, PROMPT, 5)
    assert engine.stats()["disk_written_blocks"] == 5


def test_a_step_writes_the_oldest_past_the_queues_bound(tiny_weights, tokenizer, monkeypatch):
    store = SlowStore(0.01)
    engine = engine_on(tiny_weights, tokenizer, store, True)
    monkeypatch.setattr(disk_cache, "MAX_QUEUED_BYTES", 2 * engine.disk.key.payload_bytes)  # two blocks

    async def prefill():
        engine.add_request(PROMPT, PARAMS)
        await engine.step()  # 5 blocks: over the bound, so the step writes the oldest 3 (4 at most at once)
        return len(engine.disk._queue), len(block_files(engine, store)), engine.stats()["disk_written_blocks"]

    assert in_fresh_loop(prefill) == (2, 3, 3)


def test_an_error_of_the_writer_comes_out_of_the_next_step(tiny_weights, tokenizer):
    store = SlowStore(0.01)
    engine = engine_on(tiny_weights, tokenizer, store, True)

    async def chat():
        store.broken = True
        await engine.generate(PROMPT, PARAMS)  # the writer starts when it ends, and fails
        await engine.settle_disk()
        store.broken = False
        rid = engine.add_request(PROMPT[:40], PARAMS)
        with pytest.raises(RuntimeError, match="the store broke"):
            await engine.step()
        await engine.step()  # reported once; the engine steps on
        engine.abort(rid)

    in_fresh_loop(chat)


def test_a_lost_file_is_noted_and_the_rest_land(tiny_weights, tokenizer):
    store = SlowStore(0.0)
    engine = engine_on(tiny_weights, tokenizer, store, True)
    second = engine.disk.key.file_name(block_chain(engine.disk.key, PROMPT, 2)[1])
    store.fail = {second}

    async def chat():
        out = (await engine.generate(PROMPT, PARAMS)).output_ids
        await engine.settle_disk()
        return out

    out = in_fresh_loop(chat)
    files = block_files(engine, store)
    assert second not in files and len(files) == 6 and set(files) < set(chain_files(engine, PROMPT + out, 7))
    assert engine.stats()["disk_notes"][-1].startswith(f"block {second.split('-')[1]} was not written")
    assert engine.stats()["disk_written_blocks"] == 6


def test_two_models_writers_keep_their_shared_budget(tiny_weights):
    """Two tiers over one store and budget (two models' engines in the page), their writers running at once:
    every batch evicts and writes under the store's one lock, so the files never pass the budget."""
    backend = CpuBackend(tiny_weights, num_blocks=8, block_size=16, kv_dtype="f32")
    store = SlowStore(0.005)
    first = DiskTier(store, DiskKey("a" * 16, backend.kv_spec), 1 << 30)
    run_sync(first.open())
    second = DiskTier(store, DiskKey("b" * 16, backend.kv_spec), 0, share_with=first)
    run_sync(second.open())
    first.budget_bytes = 6 * first.key.file_bytes  # room for 6 of the 16 blocks below
    payload = bytes(first.key.payload_bytes)
    peak = []

    async def write_both():
        caches = [disk_cache.DiskCache(tier, background=True) for tier in (first, second)]
        for n, cache in enumerate(caches):
            hashes = [f"{n}{i:031x}" for i in range(8)]
            cache._queue.extend((h, list(range(16)), payload) for h in hashes)
            cache.write_when_idle()
        while any(cache.writing for cache in caches):
            peak.append(sum(len(v) for k, v in store.files.items() if not k.endswith(".lru")))
            await asyncio.sleep(0.001)
        for cache in caches:
            await cache.drain()

    in_fresh_loop(write_both)
    assert first.num_written + second.num_written == 16
    assert max(peak) <= first.budget_bytes and first.num_bytes <= first.budget_bytes
