"""device_draws.py under CPython: the rows a shaped draw hands sample_shape.wgsl (exact words), the counts slots of
the requests whose penalties read them (given once, written from the output ids, taken back from finished
requests, else from a request outside the step), and DrawnTokens read back as logprobs.token_logprob's entries."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from pagedkv.device_draws import LP_STRIDE, NONE, DeviceDraws, DrawnTokens
from pagedkv.sampling import Sampler, SamplingParams
from pagedkv.sequence import SequenceStatus


def request(*output_ids: int):
    return SimpleNamespace(output_ids=list(output_ids), status=SequenceStatus.RUNNING)


def f32_bits(*values: float) -> list[int]:
    return np.array(values, np.float32).view(np.uint32).tolist()


def test_plain_rows_get_draws_only():
    draws, shaping = DeviceDraws(2, 10).draws([(request(), Sampler(SamplingParams()), True),
                                               (request(), Sampler(SamplingParams(temperature=0.5, top_p=0.9,
                                                                                  seed=1)), False)])
    assert shaping is None
    assert draws.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]  # a row still in prefill draws nothing


def test_shaped_rows_their_bias_pairs_and_counts_slots():
    dd = DeviceDraws(2, 10)
    a, b, c = request(3, 3, 7), request(), request(1)
    sa = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((2, 1.5), (9, -100.0)),
                                logprobs=4))
    sb = Sampler(SamplingParams(temperature=0.8, top_k=5, min_p=0.125, seed=3))
    sc = Sampler(SamplingParams(frequency_penalty=1.0, logit_bias=((4, 2.0),)))
    draws, shaping = dd.draws([(a, sa, True), (b, sb, True), (c, sc, False)])
    assert draws[:, :2].tolist() == [[0.0, 1.0], [0.800000011920929, 1.0], [0.0, 0.0]]
    assert shaping.rows.tolist() == [
        [0, *f32_bits(0.0, 0.5, 0.25), 0, 0, 2, 4],  # counts slot 0, bias pairs 0..1, 4 best ids
        [5, *f32_bits(0.125, 0.0, 0.0), NONE, 2, 0, NONE],  # no output penalty: no slot
        [0, *f32_bits(0.0, 0.0, 1.0), NONE, 2, 1, NONE]]  # in prefill: nothing counted, no log-probs
    assert shaping.bias.tolist() == [[2, *f32_bits(1.5)], [9, *f32_bits(-100.0)], [4, *f32_bits(2.0)]]
    assert [(slot, counts.tolist()) for slot, counts in shaping.counts] == [(0, [0, 0, 0, 2, 0, 0, 0, 1, 0, 0])]
    assert shaping.logprobs
    # the next step: a keeps its slot (its counts live on the device now), c gets slot 1 with its counts
    _, shaping = dd.draws([(a, sa, True), (c, sc, True)])
    assert shaping.rows[:, 4].tolist() == [0, 1] and [s for s, _ in shaping.counts] == [1]
    assert shaping.counts[0][1].tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    # every slot taken: a finished request's goes first, else one of a request outside the step
    d = request(5)
    a.status = SequenceStatus.FINISHED
    _, shaping = dd.draws([(c, sc, True), (d, sc, True)])
    assert shaping.rows[:, 4].tolist() == [1, 0] and shaping.counts[0][0] == 0
    e = request()
    _, shaping = dd.draws([(e, sc, True)])
    assert shaping.rows[:, 4].tolist() == [1] and dd.slots.keys() == {id(d), id(e)}  # c's slot went to e
    _, shaping = dd.draws([(c, sc, True), (e, sc, True)])
    assert shaping.rows[:, 4].tolist() == [0, 1] and shaping.counts[0][1].tolist()[1] == 1  # c's counts again


def test_drawn_tokens_read_back_as_token_logprob_entries():
    words = np.zeros((2, LP_STRIDE), np.uint32)
    f32 = words.view(np.float32)
    f32[1, 0] = -1.25  # the chosen token's
    words[1, 2:5] = [7, 3, 9]
    f32[1, 22:25] = [-0.5, -1.25, -2.0]
    drawn = DrawnTokens(np.array([4, 3], np.int32), words)
    entry = drawn.entry(1, 2)
    assert (entry.token_id, entry.logprob, entry.top) == (3, -1.25, ((7, -0.5), (3, -1.25)))
    assert drawn.entry(1, 0).top == () and len(drawn) == 2
