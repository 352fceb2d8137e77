"""Beam search through the engine (beams on forked blocks, pruned beams freed at once) vs a brute-force
numpy beam search on the tiny model that recomputes every beam from scratch and ranks candidates with
plain Python sorting."""
from __future__ import annotations

import math

import numpy as np
import pytest

from model_fixtures import tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.model_runner import ForwardBatch
from pagedkv.backends.numpy_ref import PagedKVCache
from pagedkv.beam_search import BeamSearchParams
from pagedkv.engine import run_sync
from pagedkv.kv.manager import NeverFits
from pagedkv.sampling import SamplingParams
from test_engine import make_engine, tokenizer  # noqa: F401  (fixture)

PROMPT = list(range(3, 38))  # 35 tokens: 2 full blocks + 3 tokens


def full_logprobs(model, ids: list[int]) -> list[float]:
    """log softmax of the next-token logits of `ids`, computed from scratch (no cache reuse)."""
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    blocks = -(-len(ids) // 16)
    kv = PagedKVCache.allocate(model.config, blocks, 16)
    batch = ForwardBatch(i32(ids), i32(range(len(ids))), i32(range(len(ids))), i32([0, len(ids)]),
                         i32([range(blocks)]), i32([len(ids)]))
    logits = [float(x) for x in model.forward(batch, kv)[0]]
    top = max(logits)
    log_z = top + math.log(sum(math.exp(x - top) for x in logits))
    return [x - log_z for x in logits]


def brute_force_beams(model, prompt, width, max_tokens, length_penalty, stop_ids):
    """The rules of pagedkv.beam_search written out plainly: (output ids, cum log-prob) best first."""
    live = [((), 0.0)]
    finished = []
    while True:
        candidates = []
        for b, (out, cum) in enumerate(live):
            for t, lp in enumerate(full_logprobs(model, prompt + list(out))):
                candidates.append((-(cum + lp), b, t))
        candidates.sort()
        next_live = []
        for rank, (neg, b, t) in enumerate(candidates[: 2 * width]):
            out = live[b][0] + (t,)
            if t in stop_ids:
                if rank < width:
                    finished.append((out, -neg))
                continue
            if len(out) >= max_tokens:
                finished.append((out, -neg))
            else:
                next_live.append((out, -neg))
            if len(next_live) + sum(1 for o, _ in finished if o[-1] not in stop_ids) >= width:
                break
        if len(finished) >= width or not next_live:
            everything = finished + next_live
            everything.sort(key=lambda h: -h[1] / len(h[0]) ** length_penalty)
            return everything[:width]
        live = next_live


def stop_the_beams_meet(weights, tokenizer) -> int:
    """The 4th token of the best beam when nothing stops: as a stop id, beams finish by "stop" mid-search."""
    engine = make_engine(weights, tokenizer, num_blocks=32)
    return run_sync(engine.beam_search(PROMPT, BeamSearchParams(width=3, max_tokens=6,
                                                                stop_token_ids=(10_000,))))[0].token_ids[3]


@pytest.mark.parametrize("width,length_penalty", [(2, 1.0), (3, 0.0), (3, 1.0), (4, 2.0)])
def test_engine_beams_equal_brute_force(tiny_weights, tiny_model, tokenizer, width, length_penalty):
    stop = stop_the_beams_meet(tiny_weights, tokenizer)
    params = BeamSearchParams(width=width, max_tokens=6, length_penalty=length_penalty, stop_token_ids=(stop,))
    engine = make_engine(tiny_weights, tokenizer, num_blocks=32)
    got = run_sync(engine.beam_search(PROMPT, params))
    want = brute_force_beams(tiny_model, PROMPT, width, 6, length_penalty, {stop})
    assert [h.token_ids for h in got] == [o for o, _ in want]
    assert [h.cum_logprob for h in got] == pytest.approx([s for _, s in want], rel=1e-6, abs=1e-6)
    assert [h.finish_reason for h in got] == [
        "stop" if o[-1] == stop else "length" if len(o) == 6 else "live" for o, _ in want]
    assert engine.stats()["used_blocks"] == 0 and not engine.has_unfinished


def test_finishing_by_stop_and_outputs_carry_rank(tiny_weights, tokenizer):
    stop = stop_the_beams_meet(tiny_weights, tokenizer)
    engine = make_engine(tiny_weights, tokenizer, num_blocks=32)
    rid = engine.add_beam_search(PROMPT, BeamSearchParams(width=3, max_tokens=6, stop_token_ids=(stop,)))
    finals = []
    while engine.has_unfinished:
        finals += [o for o in run_sync(engine.step()) if o.finished]
    results = engine.beam_results(rid)
    assert [(o.request_id, o.index, o.token_ids) for o in finals] == [(rid, i, list(h.token_ids))
                                                                       for i, h in enumerate(results)]
    assert "stop" in {h.finish_reason for h in results}
    with pytest.raises(KeyError):
        engine.beam_results(rid)  # handed over once


def test_beams_share_prompt_blocks_and_pruned_beams_free_at_once(tiny_weights, tokenizer):
    engine = make_engine(tiny_weights, tokenizer, num_blocks=32)
    rid = engine.add_beam_search(PROMPT, BeamSearchParams(width=3, max_tokens=8, stop_token_ids=(10_000,)))
    group = engine.groups.beams[rid]
    run_sync(engine.step())  # prefill once, then the first beam step forks 3 beams from it
    assert len(group.beams) == 3 and engine.stats()["prefill_tokens"] == 35
    assert [engine.kv.pool.ref_count(b) for b in (0, 1, 2)] == [3, 3, 3]
    assert {tuple(b.seq.block_table) for b in group.beams} == {(0, 1, 2)}
    while rid in engine.groups.beams:
        run_sync(engine.step())
        if rid in engine.groups.beams:
            live = {b.seq.seq_id for b in group.beams}
            assert set(engine.kv.live) == live  # pruned beams hold no sequence (their blocks are back)
            held = {blk for b in group.beams for blk in b.seq.block_table}
            assert engine.stats()["used_blocks"] == len(held)
    assert engine.stats()["used_blocks"] == 0 and engine.kv.live == {}
    assert len(engine.beam_results(rid)) == 3


def test_bad_beam_params_and_too_wide_searches_are_refused(tiny_weights, tokenizer):
    for kw, msg in (({"width": 0}, "width must be an int >= 1"), ({"max_tokens": 0}, "max_tokens must be"),
                    ({"length_penalty": float("nan")}, "length_penalty must be a finite number"),
                    ({"stop_token_ids": (-1,)}, "stop_token_ids")):
        with pytest.raises(ValueError, match=msg):
            BeamSearchParams(**kw)
    engine = make_engine(tiny_weights, tokenizer, num_blocks=8)
    with pytest.raises(NeverFits, match="width 3 needs up to 3 x 3 blocks of 16"):
        engine.add_beam_search(PROMPT, BeamSearchParams(width=3, max_tokens=10))
    assert not engine.has_unfinished and engine.stats()["used_blocks"] == 0


@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_beams_preempted_by_a_higher_priority_request_keep_their_results(tiny_weights, tokenizer, preemption):
    """9 blocks: the beams (2 shared prompt blocks + their tails) and an 80-token request (5 blocks, higher
    priority) do not fit together, so beams are preempted mid-search; the search must not change."""
    params = BeamSearchParams(width=3, max_tokens=6, stop_token_ids=(10_000,))
    free = make_engine(tiny_weights, tokenizer, num_blocks=32)
    want = run_sync(free.beam_search(PROMPT, params))
    engine = make_engine(tiny_weights, tokenizer, num_blocks=9, cpu_blocks=16, preemption=preemption,
                         max_num_batched_tokens=32)
    rid = engine.add_beam_search(PROMPT, params)
    run_sync(engine.step())
    run_sync(engine.step())
    other = engine.add_request(list(range(100, 170)), SamplingParams(max_tokens=10, stop_token_ids=(10_000,)),
                               priority=1)
    other_req = engine.request(other)
    while engine.has_unfinished:
        run_sync(engine.step())
    assert engine.stats()["preemptions"][preemption] >= 1
    got = engine.beam_results(rid)
    assert [h.token_ids for h in got] == [h.token_ids for h in want]
    assert [h.cum_logprob for h in got] == pytest.approx([h.cum_logprob for h in want], rel=1e-6, abs=1e-6)
    assert len(other_req.output_ids) == 10
    assert engine.stats()["used_blocks"] == 0 and engine.kv.live == {}
