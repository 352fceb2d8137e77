"""Time to first token of a chat's next turn after a reload, with the disk tier of the KV cache on or off.

Imported by bench/kv_disk.py in CPython (the numpy CPU backend, block files in a directory) and installed into
the page's worker (the WebGPU backend, block files in OPFS): it uses only pagedkv and numpy. The "reload" is a
fresh engine on the same backend: its prefix index starts empty, as after a page reload (the backend's buffers
are reused, so the figure leaves out the model load both cases share).
"""
import time

import numpy as np

from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.disk_tier import DiskKey, DiskTier, model_hash
from pagedkv.sampling import SamplingParams

NO_STOP = (1_000_000,)  # a stop id no model emits
USER_TOKENS = 16  # the next turn's new message


async def _engine(backend, tokenizer, manifest, store, disk: bool, budget_bytes: int, fresh: bool = False):
    engine = LLMEngine(backend, tokenizer, EngineConfig())
    if disk:
        tier = DiskTier(store, DiskKey(model_hash(manifest), backend.kv_spec), budget_bytes)
        t0 = time.perf_counter()
        await tier.open()  # the index of the files on disk: part of a reload's cost
        if fresh:  # nothing left from an earlier run
            await tier.clear()
        engine.attach_disk(tier)
        return engine, (time.perf_counter() - t0) * 1e3
    return engine, 0.0


async def reload_ttft(backend, tokenizer, manifest, store, chat_tokens: int, disk: bool, seed: int = 0,
                      budget_bytes: int = 1 << 30) -> dict:
    """One chat of `chat_tokens` tokens computed, then a reload and its next turn: the next turn's TTFT."""
    rng = np.random.default_rng(seed)
    vocab = min(40000, tokenizer.vocab_size)
    history = [int(t) for t in rng.integers(100, vocab, chat_tokens)]
    turn1_s, written, disk_bytes = None, 0, 0
    if disk:  # without the tier, what was computed before the reload does not matter
        a, _ = await _engine(backend, tokenizer, manifest, store, disk, budget_bytes, fresh=True)
        t0 = time.perf_counter()
        first = await a.generate(history[:-1], SamplingParams(max_tokens=1, stop_token_ids=NO_STOP))
        turn1_s = round(time.perf_counter() - t0, 2)
        history = history[:-1] + first.output_ids  # chat_tokens tokens, the last one never computed
        written, disk_bytes = a.stats()["disk_written_blocks"], a.stats()["disk_bytes"]
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
            "restored_tokens": stats["disk_restored_tokens"], "written_blocks": written, "disk_bytes": disk_bytes}
