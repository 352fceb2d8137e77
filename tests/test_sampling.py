"""Sampling: exact ids and probabilities for greedy, filters, penalties, logit bias, min-p, seeds, stop conditions and
per-token log-probs."""

from __future__ import annotations

import numpy as np
import pytest

from pagedkv.logprobs import token_logprob
from pagedkv.sampling import Sampler, SamplingParams, apply_penalties, apply_repetition_penalty, filtered_probs

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


# ---------------------------------------------------------------- penalties, bias, min-p, log-probs

def reference_penalties(logits, bias: dict, presence: float, frequency: float, output_ids) -> np.ndarray:
    """The OpenAI rule written out: logit[t] += bias[t]; logit[t] -= presence * (count[t] > 0) + frequency * count[t]."""
    out = np.array(logits, dtype=np.float64)
    for t, b in bias.items():
        out[t] += b
    for t in set(output_ids):
        count = list(output_ids).count(t)
        out[t] -= presence + frequency * count
    return out


def test_presence_frequency_and_bias_follow_the_openai_rule():
    logits = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((0, 2.5), (3, -1.0)))
    out = apply_penalties(logits, params, [4, 1, 1, 2], [1, 1, 2])  # prompt [4]: only output ids count
    assert out.tolist() == [3.5, 1.0, 2.25, 3.0, 5.0]
    assert out.tolist() == reference_penalties(logits, {0: 2.5, 3: -1.0}, 0.5, 0.25, [1, 1, 2]).tolist()
    negative = SamplingParams(presence_penalty=-2.0, frequency_penalty=-1.0)  # negative: encourage repeats
    assert apply_penalties(logits, negative, [], [0, 0, 0]).tolist() == [6.0, 2.0, 3.0, 4.0, 5.0]
    # vLLM's order: bias first, then the repetition penalty (divides the biased logit), then presence / frequency
    both = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0, logit_bias=((1, 2.0),))
    assert apply_penalties(logits, both, [4, 1, 1, 2], [1, 1, 2]).tolist() == [1.0, 0.0, 0.5, 4.0, 2.5]


def test_penalties_steer_greedy_and_sampling():
    logits = np.array([0.0, 3.0, 2.9, 1.0])
    assert Sampler(SamplingParams()).sample(logits, [1], [1]) == 1
    assert Sampler(SamplingParams(presence_penalty=0.2)).sample(logits, [1], [1]) == 2
    assert Sampler(SamplingParams(presence_penalty=0.2)).sample(logits, [1], []) == 1  # prompt ids do not count
    assert Sampler(SamplingParams(logit_bias=((3, 2.5),))).sample(logits) == 3
    assert Sampler(SamplingParams(logit_bias=((1, -100.0), (2, -100.0)))).sample(logits) == 3
    # a sampled draw reads the penalised probabilities: the bias of -100 removes ids 1 and 2 in effect
    drawn = Sampler(SamplingParams(temperature=1.0, seed=3, logit_bias=((1, -100.0), (2, -100.0))))
    picks = [drawn.sample(logits) for _ in range(200)]
    assert set(picks) == {0, 3} and picks.count(3) == 153  # p(3) = e / (1 + e) = 0.73: ~146 of 200
    with pytest.raises(ValueError, match=r"logit_bias names token id 9, outside the vocabulary \(4\)"):
        Sampler(SamplingParams(logit_bias=((9, 1.0),))).sample(logits)


def reference_min_p_top_p(probs, min_p: float, top_p: float) -> np.ndarray:
    """vLLM v1's order written out: min-p over the whole row, renormalise, then the smallest prefix reaching top_p."""
    p = np.array(probs, dtype=np.float64)
    p[p < min_p * p.max()] = 0.0
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    out = np.zeros_like(p)
    total = 0.0
    for t in order:
        out[t] = p[t]
        total += p[t]
        if total >= top_p:
            break
    return out / out.sum()


def test_min_p_keeps_ids_near_the_best_after_temperature():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    np.testing.assert_allclose(filtered_probs(np.log(probs), 1.0, 0, 1.0, 0.35), [0.625, 0.375, 0, 0], rtol=1e-12)
    # temperature 2 flattens: p ~ sqrt(probs), so 0.15 (ratio sqrt(0.3) = 0.548) passes min_p 0.5 now
    flat = np.sqrt(probs) / np.sqrt(probs).sum()
    np.testing.assert_allclose(filtered_probs(np.log(probs), 2.0, 0, 1.0, 0.5),
                               reference_min_p_top_p(flat, 0.5, 1.0), rtol=1e-12)
    assert np.count_nonzero(filtered_probs(np.log(probs), 2.0, 0, 1.0, 0.5)) == 3
    # min-p then top-p on the renormalised rest: 0.526 + 0.316 reaches 0.82 after min-p 0.25 (top-p alone keeps 3)
    np.testing.assert_allclose(filtered_probs(np.log(probs), 1.0, 0, 0.82, 0.25),
                               reference_min_p_top_p(probs, 0.25, 0.82), rtol=1e-12)
    assert np.count_nonzero(filtered_probs(np.log(probs), 1.0, 0, 0.82, 0.25)) == 2
    assert np.count_nonzero(filtered_probs(np.log(probs), 1.0, 0, 0.82)) == 3
    # min-p and top-k keep prefixes of the same order: the shorter wins either way
    assert np.count_nonzero(filtered_probs(np.log(probs), 1.0, 1, 1.0, 0.01)) == 1
    assert filtered_probs(np.log(probs), 1.0, 0, 1.0, 1.0).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_token_logprob_is_log_softmax_of_the_raw_row_best_first():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=40).astype(np.float32)
    logits[[7, 11]] = logits.max() + 1.0  # a tie for best: lower id first
    want = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    entry = token_logprob(logits, 11, 5)
    assert entry.token_id == 11 and entry.logprob == pytest.approx(want[11], abs=1e-12)
    assert [t for t, _ in entry.top] == [7, 11] + np.argsort(-want, kind="stable")[2:5].tolist()
    assert [lp for _, lp in entry.top] == pytest.approx(sorted(want, reverse=True)[:5], abs=1e-12)
    assert token_logprob(logits, 3, 0).top == ()


def test_what_a_sampler_needs_of_the_backend():
    plain, sampled = Sampler(SamplingParams()), Sampler(SamplingParams(temperature=0.7, top_p=0.9))
    assert plain.argmax_only and plain.on_device and not sampled.argmax_only and sampled.on_device
    for extra in ({"presence_penalty": 0.5}, {"frequency_penalty": -0.5}, {"logit_bias": ((1, 1.0),)},
                  {"logprobs": 0}):
        assert not Sampler(SamplingParams(**extra)).argmax_only, extra
    for extra in ({"presence_penalty": 0.5}, {"logit_bias": ((1, 1.0),)}, {"min_p": 0.1}, {"top_k": 4},
                  {"logprobs": 3}):
        assert Sampler(SamplingParams(temperature=0.7, **extra)).on_device, extra  # sample_shape.wgsl's
    assert not Sampler(SamplingParams(temperature=0.7, repetition_penalty=1.1)).on_device
    assert Sampler(SamplingParams(min_p=0.1, top_k=3)).argmax_only  # greedy ignores the filters


@pytest.mark.parametrize("kwargs,message", [
    ({"presence_penalty": 2.5}, r"presence_penalty must be a number in \[-2, 2\]"),
    ({"frequency_penalty": -2.1}, r"frequency_penalty must be a number in \[-2, 2\]"),
    ({"logit_bias": ((3, 1.0), (2, 1.0))}, "ids ascending and distinct"),
    ({"logit_bias": ((3, 101.0),)}, r"each bias in \[-100, 100\]"),
    ({"logit_bias": ((-1, 1.0),)}, "ids ascending and distinct"),
    ({"logit_bias": tuple((i, 1.0) for i in range(301))}, "at most 300"),
    ({"logit_bias": {3: 1.0}}, "must be a tuple"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
    ({"logprobs": 21}, r"logprobs must be None or an int in \[0, 20\]"),
    ({"logprobs": True}, r"logprobs must be None or an int in \[0, 20\]"),
])
def test_invalid_sampling_controls_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
