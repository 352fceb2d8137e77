"""Sampling: exact ids and probabilities for greedy, filters, penalty, seeds and stop conditions."""

from __future__ import annotations

import numpy as np
import pytest

from pagedkv.sampling import Sampler, SamplingParams, apply_repetition_penalty, filtered_probs

LOGITS = np.array([1.0, 3.0, 2.0, 0.5, 3.0])  # ids 1 and 4 tie for best


def test_greedy_takes_the_lowest_id_among_ties():
    sampler = Sampler(SamplingParams())
    assert sampler.params.greedy
    assert sampler.sample(LOGITS) == 1
    assert sampler.sample(np.array([0.0, -1.0, 5.0, 4.9])) == 2


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    out = apply_repetition_penalty(np.array([2.0, -2.0, 1.0, 0.5]), [0, 1, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]
    assert Sampler(SamplingParams(repetition_penalty=2.0)).sample(np.array([2.0, -2.0, 1.5, 0.5]), [0]) == 2
    assert apply_repetition_penalty(LOGITS, [1], 1.0).tolist() == LOGITS.tolist()


def test_top_k_keeps_k_best_with_stable_ties():
    e = np.exp(-1.0)
    np.testing.assert_allclose(filtered_probs(LOGITS, 1.0, 3, 1.0), [0, 1 / (2 + e), e / (2 + e), 0, 1 / (2 + e)], rtol=1e-12)
    assert filtered_probs(LOGITS, 1.0, 1, 1.0).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = filtered_probs(np.log([0.5, 0.3, 0.15, 0.05]), 1.0, 0, 0.75)
    np.testing.assert_allclose(probs, [0.625, 0.375, 0.0, 0.0], rtol=1e-12)
    assert filtered_probs(np.log([0.5, 0.3, 0.2]), 1.0, 0, 0.1).tolist() == [1.0, 0.0, 0.0]


def test_temperature_sharpens_and_flattens():
    sharp = filtered_probs(np.array([0.0, 1.0]), 0.5, 0, 1.0)
    flat = filtered_probs(np.array([0.0, 1.0]), 2.0, 0, 1.0)
    np.testing.assert_allclose(sharp[1], 1 / (1 + np.exp(-2.0)), rtol=1e-12)
    np.testing.assert_allclose(flat[1], 1 / (1 + np.exp(-0.5)), rtol=1e-12)


def test_same_seed_same_tokens_and_exact_frequencies():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    first = Sampler(SamplingParams(temperature=1.0, seed=1234))
    second = Sampler(SamplingParams(temperature=1.0, seed=1234))
    a = [first.sample(logits) for _ in range(12)]
    assert a == [second.sample(logits) for _ in range(12)]
    assert a == [2, 0, 2, 0, 0, 0, 0, 0, 2, 0, 0, 1]
    counts = np.bincount([first.sample(logits) for _ in range(2000)], minlength=3)
    assert counts.tolist() == [970, 620, 410]  # ~ 0.5 / 0.3 / 0.2
    other = Sampler(SamplingParams(temperature=1.0, seed=99))
    assert [other.sample(logits) for _ in range(12)] != a


def test_all_filters_together():
    sampler = Sampler(SamplingParams(temperature=0.7, top_k=2, top_p=0.9, repetition_penalty=1.3, seed=7))
    picks = [sampler.sample(LOGITS, [1, 1, 3]) for _ in range(12)]
    assert picks == [4, 4, 4, 1, 4, 4, 1, 4, 4, 4, 4, 4]  # only ids 4 and 1 survive top-k


def test_finish_reasons():
    sampler = Sampler(SamplingParams(max_tokens=3, stop_token_ids=(2,)))
    assert sampler.finish_reason(5, 1) is None
    assert sampler.finish_reason(2, 1) == "stop"
    assert sampler.finish_reason(5, 3) == "length"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": -0.1}, "temperature must be a finite number >= 0"),
        ({"top_k": -1}, "top_k must be an int >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be a finite number in \[1e-06, 1e\+06\]"),
        ({"seed": -3}, "seed must be a non-negative int or None"),
        ({"max_tokens": 0}, "max_tokens must be an int >= 1"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids must be non-negative ints"),
    ],
)
def test_invalid_params_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"temperature": 1e-320}, "temperature must be a finite number >= 0: 0 for greedy, else at least 1e-06"),
    ({"temperature": 5e-7}, "temperature must be a finite number >= 0: 0 for greedy, else at least 1e-06"),
    ({"repetition_penalty": 1e-320}, r"repetition_penalty must be a finite number in \[1e-06, 1e\+06\]"),
    ({"repetition_penalty": 2e6}, r"repetition_penalty must be a finite number in \[1e-06, 1e\+06\]"),
])
def test_values_that_overflow_the_probabilities_are_rejected(kwargs, message):
    # Accepted, 1e-320 turned every probability into NaN and the sampler always drew the last id.
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_the_extreme_accepted_values_give_finite_probabilities():
    f32_max = float(np.finfo(np.float32).max)
    logits = np.array([f32_max, -f32_max, 0.0, f32_max / 2], dtype=np.float32)
    for penalty in (1e-6, 1e6):
        penalised = apply_repetition_penalty(logits, [0, 1], penalty)
        probs = filtered_probs(penalised, 1e-6, 0, 1.0)
        assert np.isfinite(probs).all() and probs.sum() == 1.0
        assert int(np.argmax(probs)) == (0 if penalty < 1 else 3)
        assert Sampler(SamplingParams(temperature=1e-6, repetition_penalty=penalty, seed=0)).sample(
            logits, [0, 1]) == (0 if penalty < 1 else 3)


def test_logits_must_be_one_dimensional():
    with pytest.raises(ValueError, match=r"logits must be 1-D \(vocab,\), got shape \(1, 5\)"):
        Sampler(SamplingParams()).sample(LOGITS[None, :])
