"""Time to first token for turns 1..k of one conversation, through LLMEngine on any backend.

Imported by bench/ttft.py in CPython (the numpy CPU backend) and installed into the page's worker
(the WebGPU backend): it uses only pagedkv and numpy. Turn k's prompt is the whole conversation so far
plus a new user message; with prefix caching the engine should prefill only the tokens it has not cached.
"""
import time

import numpy as np

from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.sampling import SamplingParams

NO_STOP = (1_000_000,)  # a stop id no model emits: every answer has exactly `answer_tokens` tokens


async def conversation_ttft(backend, tokenizer, prefix_caching, turns=5, system_tokens=200, user_tokens=40,
                            answer_tokens=8, seed=0):
    """[{turn, prompt_tokens, cached_tokens, ttft_ms, steps_to_first_token}] for one greedy conversation."""
    engine = LLMEngine(backend, tokenizer, EngineConfig(enable_prefix_caching=prefix_caching))
    rng = np.random.default_rng(seed)
    history = [int(t) for t in rng.integers(100, 40000, system_tokens)]
    rows = []
    for turn in range(1, turns + 1):
        prompt = history + [int(t) for t in rng.integers(100, 40000, user_tokens)]
        hits_before = engine.kv.num_hit_tokens
        t0 = time.perf_counter()
        rid = engine.add_request(prompt, SamplingParams(max_tokens=answer_tokens, stop_token_ids=NO_STOP))
        ttft_ms, steps, answer = None, 0, []
        while engine.has_unfinished:
            outs = await engine.step()
            steps += ttft_ms is None
            for out in outs:
                if out.request_id == rid and out.token_ids:
                    if ttft_ms is None:
                        ttft_ms = (time.perf_counter() - t0) * 1e3
                    answer += out.token_ids
        rows.append({"turn": turn, "prompt_tokens": len(prompt),
                     "cached_tokens": engine.kv.num_hit_tokens - hits_before,
                     "ttft_ms": round(ttft_ms, 2), "steps_to_first_token": steps})
        history = prompt + answer
    return rows
