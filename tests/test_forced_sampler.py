"""ForcedSampler (teacher forcing) and the engine's add_request(sampler=): a known continuation scored through
ordinary decode steps equals the all-logits forward over the same tokens (bench/long_chat.py relies on it)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from model_fixtures import reference_greedy, tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.evaluate import evaluate
from pagedkv.kv.retention import KVRetention
from pagedkv.sampling import ForcedSampler, Sampler, SamplingParams
from pagedkv.tokenizer import Tokenizer

NEVER_STOP = SamplingParams(max_tokens=1, stop_token_ids=(10_000,))  # a stop id the tiny vocab never emits


def test_forced_sampler_emits_the_forced_ids_scores_them_then_goes_greedy():
    s = ForcedSampler([0, 3])
    logits = np.array([1.0, 2.0, 3.0, 0.5], np.float32)  # (vocab,)
    lse = math.log(math.exp(1.0) + math.exp(2.0) + math.exp(3.0) + math.exp(0.5))
    assert s.sample(logits) == 0
    assert s.sample(logits[::-1].copy()) == 3
    assert s.sample(logits) == 2  # forced ids used up: argmax
    assert s.logprobs == pytest.approx([1.0 - lse, 1.0 - lse], abs=1e-12)
    assert s.argmax_ids == [2, 1]
    assert s.argmax_only is False


def test_argmax_only_follows_the_params():
    assert Sampler(SamplingParams()).argmax_only is True
    assert Sampler(SamplingParams(temperature=0.7)).argmax_only is False
    assert Sampler(SamplingParams(repetition_penalty=1.2)).argmax_only is False


def test_forced_sampler_refuses_bad_ids():
    with pytest.raises(ValueError, match="non-negative token ids"):
        ForcedSampler([1, -2])
    s = ForcedSampler([7])
    with pytest.raises(ValueError, match="forced token 7 is outside the vocabulary"):
        s.sample(np.zeros(4, np.float32))
    assert s.logprobs == [] and s.argmax_ids == []


def _engine(weights, num_blocks=64, **kw):
    backend = CpuBackend(weights, num_blocks=num_blocks, block_size=16)
    return LLMEngine(backend, Tokenizer.from_manifest(weights.manifest), EngineConfig(**kw))


def _score_through_engine(engine, prompt, forced, reply, retention=None):
    """Run one request whose sampler forces `forced`; returns (sampler, request, argmax-only flags per step)."""
    flags = []
    forward = engine.backend.forward

    async def spy(batch, *, greedy=False, attention_mass=None):
        flags.append(greedy)
        return await forward(batch, greedy=greedy, attention_mass=attention_mass)

    engine.backend.forward = spy
    sampler = ForcedSampler(forced)
    params = SamplingParams(max_tokens=len(forced) + reply, stop_token_ids=(10_000,))
    req = engine.request(engine.add_request(prompt, params, sampler=sampler, retention=retention))
    while engine.has_unfinished:
        run_sync(engine.step())
    return sampler, req, flags


def test_engine_scores_a_forced_continuation_like_the_all_logits_forward(tiny_weights, tiny_model):
    tokens = [int(t) for t in np.random.default_rng(5).integers(3, 500, 70)]
    prompt, forced = tokens[:50], tokens[50:]
    engine = _engine(tiny_weights, max_num_batched_tokens=24)
    sampler, req, flags = _score_through_engine(engine, prompt, forced, reply=5)
    # 50-token prompt in 3 chunks (the last one emits forced[0]), 19 forced + 5 greedy decode steps: logits each
    assert flags == [False] * 27
    assert req.output_ids[:20] == forced
    assert req.output_ids[20:] == reference_greedy(tiny_model, tokens, 5)
    want = evaluate(tiny_weights, tokens, None, pool_blocks=8)  # one forward, every position's logits
    assert sampler.logprobs == pytest.approx(want["logp"][49:].tolist(), abs=2e-4)
    assert sampler.argmax_ids == want["greedy"][49:].tolist()


def test_forced_continuation_past_the_context_under_a_window_equals_the_chunked_reference(tiny_weights):
    # 300 tokens through the tiny model's 256-token context, window 64 + 4 sinks: decode steps score the
    # same log-probs as the scheduler-driven all-logits run over the same tokens (bench/long_chat.py's pair).
    tokens = [int(t) for t in np.random.default_rng(6).integers(3, 500, 300)]
    r = KVRetention(window_tokens=64, sink_tokens=4)
    engine = _engine(tiny_weights, num_blocks=r.max_blocks(16), max_num_batched_tokens=24)
    sampler, req, _ = _score_through_engine(engine, tokens[:200], tokens[200:], reply=3, retention=r)
    assert len(req.seq.token_ids) == 303 and len(sampler.logprobs) == 100
    want = evaluate(tiny_weights, tokens, r, pool_blocks=r.max_blocks(16), chunk=24)
    assert want["max_blocks_held"] == 6
    assert sampler.logprobs == pytest.approx(want["logp"][199:].tolist(), abs=2e-4)
    assert sampler.argmax_ids == want["greedy"][199:].tolist()


def test_a_callers_sampler_is_refused_with_parallel_samples(tiny_weights):
    engine = _engine(tiny_weights)
    with pytest.raises(ValueError, match="use n=1 with sampler="):
        engine.add_request([5, 6, 7], SamplingParams(n=2), sampler=ForcedSampler([1]))
    assert not engine.has_unfinished and engine.stats()["waiting"] == 0
