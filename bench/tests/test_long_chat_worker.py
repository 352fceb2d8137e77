"""bench/page/long_chat.py's LongChat on the CPU engine (CPython, tiny model): the conversation it drives in
the page, run past the tiny model's 256-token context in slices, with its figures checked exactly."""
from __future__ import annotations

import numpy as np
import pytest

from bench.page.long_chat import LongChat
from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.evaluate import evaluate
from pagedkv.kv.retention import KVRetention
from pagedkv.tokenizer import Tokenizer


def test_long_chat_runs_past_the_context_in_slices_and_reports_its_figures(tiny_weights):
    tokens = [int(t) for t in np.random.default_rng(7).integers(3, 500, 296)]
    r = KVRetention(window_tokens=64, sink_tokens=4)
    backend = CpuBackend(tiny_weights, num_blocks=r.max_blocks(16), block_size=16)
    engine = LLMEngine(backend, Tokenizer.from_manifest(tiny_weights.manifest), EngineConfig())
    chat = LongChat(engine, {"budget_bytes": 0}, tokens, context=256, continuation=40, reply=6, retention=r)
    progress = run_sync(chat.advance(0))  # one step per slice at least
    assert progress["steps"] == 1 and progress["tokens"] == 96 and not progress["done"]  # 6 blocks at most
    partial = chat.result()
    assert partial["complete"] is False and partial["scored_tokens"] == 0 and partial["ppl_continuation"] is None
    while not chat.done:
        run_sync(chat.advance(0))
    out = chat.result()
    assert out["complete"] is True and out["scored_tokens"] == 40 and out["total_tokens"] == 302
    assert out["max_blocks_held"] == out["bound_blocks"] == 6  # ceil((4 + 64) / 16) + 1
    assert out["freed_blocks"] == 13  # 301 tokens written: 19 blocks; 6 held at the end (sink, window, partial)
    assert out["used_blocks_after"] == 0 and out["max_rotary_position"] < 96
    assert len(out["reply_ids"]) == 6
    want = evaluate(tiny_weights, tokens, r, pool_blocks=6)
    assert out["logprobs"] == pytest.approx(want["logp"][255:].tolist(), abs=1e-4)
    assert out["argmax_ids"] == want["greedy"][255:].tolist()
    assert out["ppl_continuation"] == pytest.approx(float(np.exp(-want["logp"][255:].mean())), abs=2e-3)
