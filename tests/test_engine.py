"""LLMEngine over the CPU backend on the tiny model: batching, chunking, prefix reuse and preemption
must never change what a request generates."""
from __future__ import annotations

import pytest

from model_fixtures import reference_greedy, tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.manager import NeverFits
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(10_000,))  # a stop id the tiny vocab never emits


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):
    return Tokenizer.from_manifest(tiny_weights.manifest)


def make_engine(weights, tokenizer, num_blocks=64, cpu_blocks=0, **kw):
    backend = CpuBackend(weights, num_blocks=num_blocks, block_size=16, num_cpu_blocks=cpu_blocks)
    return LLMEngine(backend, tokenizer, EngineConfig(**kw))


def run_all(engine, prompts, params=GREEDY, priorities=None):
    rids = [engine.add_request(p, params, priority=(priorities or [0] * len(prompts))[i])
            for i, p in enumerate(prompts)]
    reqs = [engine.request(r) for r in rids]
    steps = 0
    while engine.has_unfinished:
        run_sync(engine.step())
        steps += 1
    return [r.output_ids for r in reqs], steps


PROMPTS = [list(range(3 + 60 * i, 3 + 60 * i + n)) for i, n in enumerate((5, 23, 40, 17))]  # no shared prefixes


def test_single_request_equals_reference(tiny_weights, tiny_model, tokenizer):
    engine = make_engine(tiny_weights, tokenizer)
    (out,), _ = run_all(engine, [PROMPTS[2]])
    assert out == reference_greedy(tiny_model, PROMPTS[2], 12)
    assert engine.stats()["used_blocks"] == 0  # everything freed; full blocks stay cached
    assert engine.stats()["cached_blocks"] == 3  # 40 prompt + 11 computed outputs = 51 tokens -> 3 full blocks


def test_batched_chunked_requests_equal_their_solo_runs(tiny_weights, tiny_model, tokenizer):
    engine = make_engine(tiny_weights, tokenizer, max_num_batched_tokens=24)
    outs, steps = run_all(engine, PROMPTS)
    assert outs == [reference_greedy(tiny_model, p, 12) for p in PROMPTS]
    s = engine.stats()
    assert s["prefill_tokens"] == sum(len(p) for p in PROMPTS)
    assert s["decode_tokens"] == 4 * 11


def test_prefix_cache_reuse_skips_prefill_and_keeps_output(tiny_weights, tiny_model, tokenizer):
    engine = make_engine(tiny_weights, tokenizer)
    first = PROMPTS[2]
    (out1,), _ = run_all(engine, [first])
    before = engine.stats()["prefill_tokens"]
    follow_up = first + out1 + [7, 8, 9]
    (out2,), _ = run_all(engine, [follow_up])
    computed = engine.stats()["prefill_tokens"] - before
    # 40 + 12 + 3 = 55 tokens; 3 full blocks (48 tokens) come from the cache.
    assert computed == 55 - 48
    assert out2 == reference_greedy(tiny_model, follow_up, 12)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_does_not_change_outputs(tiny_weights, tiny_model, tokenizer, mode):
    # 7 blocks of 16 cannot hold all four requests at once: someone gets preempted.
    engine = make_engine(tiny_weights, tokenizer, num_blocks=7, cpu_blocks=16, preemption=mode,
                         enable_prefix_caching=False)
    outs, _ = run_all(engine, PROMPTS, priorities=[3, 2, 1, 0])
    assert outs == [reference_greedy(tiny_model, p, 12) for p in PROMPTS]
    assert engine.stats()["preemptions"][mode] >= 1


def test_abort_frees_blocks_and_keeps_partial_output(tiny_weights, tokenizer):
    engine = make_engine(tiny_weights, tokenizer)
    rid = engine.add_request(PROMPTS[1], GREEDY)
    run_sync(engine.step())
    run_sync(engine.step())
    req = engine.abort(rid)
    assert len(req.output_ids) == 2 and req.finish_reason == "abort"
    assert engine.stats()["used_blocks"] == 0 and not engine.has_unfinished
    with pytest.raises(KeyError):
        engine.abort(rid)


def test_bad_requests_are_refused_up_front(tiny_weights, tokenizer):
    engine = make_engine(tiny_weights, tokenizer, num_blocks=4)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, 10**6], GREEDY)
    with pytest.raises(NeverFits, match="KV pool only has 4 blocks"):
        engine.add_request(list(range(3, 70)), GREEDY)
    context = tiny_weights.config.context_length
    with pytest.raises(ValueError, match="context"):
        engine.add_request([5] * context, GREEDY)
    assert not engine.has_unfinished and engine.stats()["used_blocks"] == 0


def test_streamed_text_equals_decode_and_seed_repeats(tiny_weights, tokenizer):
    def sample_once():
        engine = make_engine(tiny_weights, tokenizer)
        rid = engine.add_request(tokenizer.encode("hello there"),
                                 SamplingParams(max_tokens=20, temperature=0.8, seed=3))
        req = engine.request(rid)
        pieces = []
        while engine.has_unfinished:
            pieces += [o.text for o in run_sync(engine.step()) if o.request_id == rid]
        return req, "".join(pieces)

    req, text = sample_once()
    stops = engine_stop_ids(tokenizer)
    visible = [t for t in req.output_ids if t not in stops]
    assert text == tokenizer.decode(visible)
    again, _ = sample_once()
    assert again.output_ids == req.output_ids and len(req.output_ids) >= 1


def engine_stop_ids(tokenizer):
    return {tokenizer.im_end_id, tokenizer.eos_token_id} - {None}


def test_max_context_per_conversation_caps_prompt_and_reply(tiny_weights, tiny_model, tokenizer):
    engine = make_engine(tiny_weights, tokenizer, max_context=48)
    with pytest.raises(ValueError, match="context is 48"):
        engine.add_request(list(range(3, 51)), GREEDY)
    (out,), _ = run_all(engine, [list(range(3, 43))], SamplingParams(max_tokens=100, stop_token_ids=(10_000,)))
    assert len(out) == 8 == 48 - 40  # the reply stops when the conversation reaches 48 tokens
    with pytest.raises(ValueError, match="max_context"):
        EngineConfig(max_context=1)


def test_rebuild_on_a_new_backend_resumes_from_token_history(tiny_weights, tiny_model, tokenizer):
    # As after a lost GPU device: mid-generation, the engine moves to a fresh (smaller) pool; every request
    # re-prefills prompt + output so far and finishes with exactly the tokens of an uninterrupted run.
    engine = make_engine(tiny_weights, tokenizer)
    rids = [engine.add_request(p, GREEDY) for p in PROMPTS[:3]]
    for _ in range(6):
        run_sync(engine.step())
    partial = [list(engine.request(r).output_ids) for r in rids]
    assert all(0 < len(p) < 12 for p in partial)
    old_pool = engine.kv.pool
    new_backend = CpuBackend(tiny_weights, num_blocks=12, block_size=16)
    assert engine.rebuild(new_backend) == rids
    assert engine.kv.pool is not old_pool and engine.kv.pool.num_blocks == 12 and engine.backend is new_backend
    reqs = [engine.request(r) for r in rids]
    assert all(r.seq.num_computed_tokens == 0 and not r.seq.block_table for r in reqs)
    while engine.has_unfinished:
        run_sync(engine.step())
    assert [r.output_ids for r in reqs] == [reference_greedy(tiny_model, p, 12) for p in PROMPTS[:3]]
    assert [r.output_ids[:len(p)] for r, p in zip(reqs, partial)] == partial
    assert engine.stats()["used_blocks"] == 0


def test_rebuild_aborts_what_the_new_pool_can_never_hold(tiny_weights, tokenizer):
    engine = make_engine(tiny_weights, tokenizer)
    req = engine.request(engine.add_request(PROMPTS[2], GREEDY))  # 40 + 12 tokens: 4 blocks of 16
    run_sync(engine.step())
    assert engine.rebuild(CpuBackend(tiny_weights, num_blocks=2, block_size=16)) == []
    assert req.finish_reason == "error" and not engine.has_unfinished


def test_rebuild_switches_the_kv_dtype_of_a_live_engine(tiny_weights, tiny_model, tokenizer):
    # Changing the KV dtype needs a new pool: requests in flight re-prefill their token history in int8.
    engine = make_engine(tiny_weights, tokenizer)
    rid = engine.add_request(PROMPTS[1], GREEDY)
    for _ in range(4):
        run_sync(engine.step())
    partial = list(engine.request(rid).output_ids)
    assert engine.stats()["kv_dtype"] == "f32" and len(partial) >= 2
    assert engine.rebuild(CpuBackend(tiny_weights, num_blocks=32, block_size=16, kv_dtype="int8")) == [rid]
    req = engine.request(rid)
    while engine.has_unfinished:
        run_sync(engine.step())
    assert engine.stats()["kv_dtype"] == "int8" and engine.kv.config.kv_dtype == "int8"
    assert req.output_ids[:len(partial)] == partial and len(req.output_ids) == 12


@pytest.mark.parametrize("kw,message", [
    ({"priority": "high"}, "priority must be of type int, got str 'high'"),
    ({"priority": True}, "priority must be of type int, got bool True"),
    ({"session": 7}, "session must be of type str, got int 7"),
    ({"request_id": 5}, "request_id must be of type str, got int 5"),
])
def test_add_request_refuses_wrong_types_up_front(tiny_weights, tiny_model, tokenizer, kw, message):
    # Accepted, a str priority broke every later step (the queues sort by it) with a TypeError.
    engine = make_engine(tiny_weights, tokenizer)
    with pytest.raises(ValueError, match=message):
        engine.add_request(PROMPTS[0], GREEDY, **kw)
    with pytest.raises(ValueError, match="params must be of type SamplingParams, got dict"):
        engine.add_request(PROMPTS[0], {"max_tokens": 3})
    assert not engine.has_unfinished
    (out,), _ = run_all(engine, [PROMPTS[0]])
    assert out == reference_greedy(tiny_model, PROMPTS[0], 12)
