"""Time to first token of a chat's next turn after a reload, with the disk tier of the KV cache on or off.

Imported by bench/kv_disk.py in CPython (the numpy CPU backend, block files in a directory) and installed into
the page's worker (the WebGPU backend, block files in OPFS): it uses only pagedkv and numpy. The "reload" is a
fresh engine on the same backend: its prefix index starts empty, as after a page reload (the backend's buffers
are reused, so the figure leaves out the model load both cases share).
"""
import asyncio
import time

import numpy as np

from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.disk_tier import DiskKey, DiskTier, block_chain, model_hash
from pagedkv.sampling import SamplingParams

NO_STOP = (1_000_000,)  # a stop id no model emits
USER_TOKENS = 16  # the next turn's new message
REPLY_TOKENS = 16  # the chat's last reply, decoded one token a step (the rest of the chat is its prompt)


class TimedStore:
    """The store the tier writes to, timing its writes: the store's write MB/s as the tier sees it."""

    def __init__(self, store) -> None:
        self.store, self.write_s, self.write_bytes = store, 0.0, 0

    async def read(self, name):
        return await self.store.read(name)

    async def write(self, name, data) -> None:
        t0 = time.perf_counter()
        await self.store.write(name, data)
        self.write_s += time.perf_counter() - t0
        self.write_bytes += len(data)

    async def delete(self, name) -> None:
        await self.store.delete(name)

    async def names(self):
        return await self.store.names()


async def _engine(backend, tokenizer, manifest, store, disk: bool, budget_bytes: int, fresh: bool = False):
    engine = LLMEngine(backend, tokenizer, EngineConfig())
    if disk:
        tier = DiskTier(store, DiskKey(model_hash(manifest), backend.kv_spec), budget_bytes)
        t0 = time.perf_counter()
        await tier.open()  # the index of the files on disk: part of a reload's cost
        if fresh:  # nothing left from an earlier run
            await tier.clear()
        engine.attach_disk(tier, background=_in_loop())  # the page's engine writes once idle, as here
        return engine, (time.perf_counter() - t0) * 1e3
    return engine, 0.0


def _in_loop() -> bool:
    """Whether an event loop runs this (the page's); CPython's run_sync drives coroutines without one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _pause(seconds: float) -> None:
    """Wait `seconds`: on the page's event loop in the browser; CPython's run_sync drives coroutines without one."""
    if not _in_loop():
        time.sleep(seconds)
        return
    await asyncio.sleep(seconds)


async def reload_ttft(backend, tokenizer, manifest, store, chat_tokens: int, disk: bool, seed: int = 0,
                      budget_bytes: int = 1 << 30, reload_after_s: float = 1.0) -> dict:
    """One chat of `chat_tokens` tokens computed (a prompt, then a reply of REPLY_TOKENS decoded tokens), then
    a reload `reload_after_s` after the reply's last token and its next turn: the next turn's TTFT. With the
    tier: how many of the chat's full blocks were on disk when the reply ended, how long after it the rest were
    (the page's engine writes them once idle: LLMEngine.settle_disk; CPython's in the steps), how long the flush
    a page posts when it is left took after that (LLMEngine.flush_disk), and the store's write MB/s (each write
    timed alone; the idle writer runs four at once)."""
    rng = np.random.default_rng(seed)
    vocab = min(40000, tokenizer.vocab_size)
    history = [int(t) for t in rng.integers(100, vocab, chat_tokens)]
    turn1_s, written, disk_bytes, flush = None, 0, 0, {}
    if disk:  # without the tier, what was computed before the reload does not matter
        timed = TimedStore(store)
        a, _ = await _engine(backend, tokenizer, manifest, timed, disk, budget_bytes, fresh=True)
        t0 = time.perf_counter()
        first = await a.generate(history[:-REPLY_TOKENS],
                                 SamplingParams(max_tokens=REPLY_TOKENS, stop_token_ids=NO_STOP))
        turn1_s = round(time.perf_counter() - t0, 2)
        history = history[:-REPLY_TOKENS] + first.output_ids  # chat_tokens tokens, the last one never computed
        full = (len(history) - 1) // a.kv_spec.block_size
        at_end = sum(a.disk.tier.has(h) for h in block_chain(a.disk.key, history, full))
        t0 = time.perf_counter()
        await a.settle_disk()
        settle_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        flushed = await a.flush_disk()
        flush_ms = (time.perf_counter() - t0) * 1e3
        written, disk_bytes = a.stats()["disk_written_blocks"], a.stats()["disk_bytes"]
        flush = {"full_blocks": full, "on_disk_at_reply_end": at_end, "flush_written_blocks": flushed,
                 "flush_ms": round(flush_ms, 1),
                 # all of them on disk: at the reply's end when the steps wrote them, else once the idle writer
                 # had (and the flush, had it left any)
                 "all_on_disk_after_reply_ms": 0.0 if at_end == full else round(
                     settle_ms + (flush_ms if flushed else 0.0), 1),
                 "write_s": round(timed.write_s, 3),
                 "write_mb_s": round(timed.write_bytes / timed.write_s / 1e6, 1) if timed.write_s else None}
    await _pause(reload_after_s)
    b, open_ms = await _engine(backend, tokenizer, manifest, store, disk, budget_bytes)
    nxt = history + [int(t) for t in rng.integers(100, vocab, USER_TOKENS)]
    t0 = time.perf_counter()
    rid = b.add_request(nxt, SamplingParams(max_tokens=1, stop_token_ids=NO_STOP))
    ttft_ms = None
    while b.has_unfinished:
        for out in await b.step():
            if out.request_id == rid and out.token_ids and ttft_ms is None:
                ttft_ms = (time.perf_counter() - t0) * 1e3
    stats = b.stats()
    return {"chat_tokens": chat_tokens, "disk": disk, "turn1_s": turn1_s, "ttft_ms": round(ttft_ms, 1),
            "open_ms": round(open_ms, 1), "prompt_tokens": len(nxt), "prefill_tokens": stats["prefill_tokens"],
            "restored_tokens": stats["disk_restored_tokens"], "written_blocks": written, "disk_bytes": disk_bytes,
            "reload_after_s": reload_after_s, **flush}
