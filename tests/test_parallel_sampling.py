"""Parallel sampling (n > 1) on the CPU backend and the tiny model: the prompt is prefilled once, the
samples share its blocks through fork (ref counts, copy-on-write of the partial last block), and each
sample generates exactly what a lone request with its seed would."""
from __future__ import annotations

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.engine import run_sync
from pagedkv.sampling import SamplingParams
from test_engine import make_engine, tokenizer  # noqa: F401  (fixture)

PROMPT = list(range(3, 43))  # 40 tokens: 2 full blocks of 16 + 8 tokens in a partial third block
SAMPLED = SamplingParams(temperature=0.9, seed=11, max_tokens=12, stop_token_ids=(10_000,))


def run_to_end(engine):
    """Step until idle; returns the largest number of used blocks seen after a step."""
    peak = 0
    while engine.has_unfinished:
        run_sync(engine.step())
        peak = max(peak, engine.stats()["used_blocks"])
    return peak


def lone(weights, tokenizer, seed, **kw):
    engine = make_engine(weights, tokenizer, **kw)
    req = run_sync(engine.generate(PROMPT, SamplingParams(temperature=0.9, seed=seed, max_tokens=12,
                                                          stop_token_ids=(10_000,))))
    return req.output_ids


def test_samples_fork_the_prompt_blocks_once_with_ref_counts(tiny_weights, tokenizer):
    engine = make_engine(tiny_weights, tokenizer, num_blocks=16)
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.9, seed=11, max_tokens=12, n=3,
                                                    stop_token_ids=(10_000,)))
    parent = engine.request(rid)
    outs = run_sync(engine.step())  # the one prefill; the samples fork and draw their first tokens
    assert [(o.request_id, o.index, len(o.token_ids)) for o in outs] == [(rid, 0, 1), (rid, 1, 1), (rid, 2, 1)]
    samples = parent.samples
    assert [s.request_id for s in samples] == [rid, f"{rid}#1", f"{rid}#2"]
    assert [s.seq.block_table for s in samples] == [[0, 1, 2]] * 3
    pool = engine.kv.pool
    assert [pool.ref_count(b) for b in (0, 1, 2)] == [3, 3, 3]
    assert engine.stats()["prefill_tokens"] == 40 and engine.stats()["used_blocks"] == 3

    run_sync(engine.step())  # each appends into the shared partial block 2: the first two copy it
    assert [s.seq.block_table for s in samples] == [[0, 1, 3], [0, 1, 4], [0, 1, 2]]
    assert [pool.ref_count(b) for b in range(5)] == [3, 3, 1, 1, 1]
    assert engine.stats()["copy_ops"] == 2 and engine.stats()["used_blocks"] == 5
    assert engine.stats()["decode_tokens"] == 3

    run_to_end(engine)
    assert [len(s.output_ids) for s in samples] == [12, 12, 12]
    assert engine.stats()["prefill_tokens"] == 40  # the prompt was computed once for the three samples
    assert engine.stats()["used_blocks"] == 0 and engine.stats()["free_blocks"] + engine.stats()["cached_blocks"] == 16


def test_memory_of_n3_vs_three_independent_requests(tiny_weights, tokenizer):
    """The n = 3 saving, in blocks: 2 shared prompt blocks + 3 own tails = 5, vs 3 x 3 = 9 (and 3 prefills)."""
    group = make_engine(tiny_weights, tokenizer, num_blocks=16, enable_prefix_caching=False)
    group.add_request(PROMPT, SamplingParams(temperature=0.9, seed=11, max_tokens=8, n=3, stop_token_ids=(10_000,)))
    group_peak = run_to_end(group)
    alone = make_engine(tiny_weights, tokenizer, num_blocks=16, enable_prefix_caching=False)
    for i in range(3):
        alone.add_request(PROMPT, SamplingParams(temperature=0.9, seed=11 + i, max_tokens=8, stop_token_ids=(10_000,)))
    alone_peak = run_to_end(alone)
    assert (group_peak, alone_peak) == (5, 9)
    assert (group.stats()["prefill_tokens"], alone.stats()["prefill_tokens"]) == (40, 120)


@pytest.mark.parametrize("preemption,num_blocks", [(None, 64), ("swap", 5), ("recompute", 5)])
def test_each_sample_equals_a_lone_request_with_its_seed(tiny_weights, tokenizer, preemption, num_blocks):
    """Batch invariance through forks and copy-on-write; with 5 blocks the samples also preempt each other
    (52 tokens = 4 blocks each at the end) and must still not change."""
    kw = {} if preemption is None else {"preemption": preemption, "cpu_blocks": 16, "enable_prefix_caching": False}
    engine = make_engine(tiny_weights, tokenizer, num_blocks=num_blocks, **kw)
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.9, seed=11, max_tokens=12, n=3,
                                                    stop_token_ids=(10_000,)))
    samples_out: dict[int, list[int]] = {0: [], 1: [], 2: []}
    while engine.has_unfinished:
        for out in run_sync(engine.step()):
            assert out.request_id == rid
            samples_out[out.index] += out.token_ids
    expected = [lone(tiny_weights, tokenizer, 11 + i) for i in range(3)]
    assert [samples_out[i] for i in range(3)] == expected
    assert len({tuple(e) for e in expected}) == 3  # the seeds really differ
    if preemption is not None:
        assert engine.stats()["preemptions"][preemption] >= 1
    assert engine.stats()["used_blocks"] == 0


def test_abort_stops_every_sample_and_frees_their_blocks(tiny_weights, tokenizer):
    engine = make_engine(tiny_weights, tokenizer, num_blocks=16)
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.9, seed=1, max_tokens=12, n=3))
    run_sync(engine.step())
    run_sync(engine.step())
    parent = engine.abort(rid)
    assert [s.finish_reason for s in parent.samples] == ["abort"] * 3
    assert [len(s.output_ids) for s in parent.samples] == [2, 2, 2]
    assert not engine.has_unfinished and engine.stats()["used_blocks"] == 0
    with pytest.raises(KeyError):
        engine.request(rid)


def test_bad_n_and_ids_are_refused(tiny_weights, tokenizer):
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="n \\(parallel samples\\) must be an int >= 1"):
            SamplingParams(n=bad)
    with pytest.raises(ValueError, match="sample index must be in \\[0, 3\\)"):
        SamplingParams(n=3).for_sample(3)
    assert SamplingParams(n=3, seed=7).for_sample(2) == SamplingParams(seed=9)
    assert SamplingParams(n=2).for_sample(1).seed is None
    engine = make_engine(tiny_weights, tokenizer)
    with pytest.raises(ValueError, match="contains '#'"):
        engine.add_request(PROMPT, SamplingParams(n=2), request_id="a#1")
    assert not engine.has_unfinished
