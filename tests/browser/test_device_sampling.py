"""The next token drawn on the GPU (shaders/sample.wgsl), in headless Chromium (SwiftShader) and natively
(tests/native: lavapipe): a sampled step reads back token ids, not (S, vocab) logits.

- The kernel against pagedkv.sampling.Sampler (the numpy draw, f64): the same random number u (Sampler.device_draw
  consumes it as sample() would) gives the same token for greedy, temperature and top-p rows, at SmolLM2's
  vocabulary and with ties at the top and across the top-p cut (the lower id first, as the stable sort).
- The engine (LLMEngine on WebGPU, both kernel families): seeded requests drawn on the device give the tokens
  the same engine gives when the host samples from the logits; a step whose rows cannot all be drawn there
  (the fork of n = 2 samples) falls back to the host.
- Shaped draws (device_draws.py): sample_shape.wgsl, sample.wgsl and sample_post.wgsl against the numpy Sampler
  for presence / frequency penalties (their counts kept on the device across draws), logit bias, top-k with ties
  at its cut, min-p, greedy with penalties and log-probs (within 1e-4); and the engine keeping such requests
  on the device and pipelined, with the host's tokens and log-probs.
"""
from __future__ import annotations

import pytest

from browser_pages import install_modules


@pytest.fixture(scope="module")
def worker(ready_page):
    return install_modules(ready_page, "engine_cases", "sample_cases")


def run(worker, call: str):
    return worker.py(f"import json, sample_cases as sc\njson.dumps(await sc.{call})")


def test_sample_kernel_draws_what_the_numpy_sampler_draws(worker):
    rows = [(0.7, 0.95), (1.0, 1.0), (0.0, 1.0), (0.3, 0.5), (2.0, 0.8)]
    r = run(worker, f"case_sample(1000, {rows}, 12, seed=3, scale=1.5)")
    assert r["got"] == r["want"]
    assert r["distinct"] >= 20  # the draws spread over many ids, so equality says something
    r = run(worker, "case_sample(49152, [(0.7, 0.95), (1.5, 0.9), (0.0, 1.0)], 4, seed=4, ties=True)")
    assert r["got"] == r["want"]
    assert all(row[2] == 5 for row in r["got"])  # greedy: the lowest of the four ids holding the max


def test_top_p_cut_found_digit_by_digit_matches_numpy_at_every_mass(worker):
    # kappa is found 4 bits a pass: cuts from one token (top_p 0.05 at a low temperature) to nearly the whole
    # row, with 5,000 ids (the digit passes' four-token trips and their tail)
    rows = [(t, p) for t in (0.2, 0.7, 1.5) for p in (0.05, 0.5, 0.9, 0.99)]
    r = run(worker, f"case_sample(5000, {rows}, 3, seed=5, scale=2.0)")
    assert r["got"] == r["want"]
    assert r["distinct"] >= 15


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_engine_draws_on_the_device_what_the_host_draws(worker, kernels):
    r = run(worker, f"engine_device_vs_host({kernels!r})")
    assert r["device"] == r["host"]
    assert [len(s) for s in r["device"]] == [1, 1, 1, 2]
    assert r["drawn_steps_host"] == 0 and r["drawn_steps_device"] == r["steps"] - 1  # the fork step: host


def test_shaped_draws_match_the_numpy_sampler_with_counts_kept_on_the_device(worker):
    # penalties over the ids drawn so far (counted by sample_post.wgsl across rounds), a logit bias banning the
    # best ids and pushing others, top-k and min-p (with ties at the top-k cut), greedy with penalties, log-probs
    rows = [{"presence_penalty": 1.5, "frequency_penalty": 0.5, "logprobs": 5},
            {"temperature": 0.8, "top_k": 7, "frequency_penalty": 1.0},
            {"temperature": 1.3, "min_p": 0.2, "top_p": 0.9, "logit_bias": ((3, 6.0), (10, -100.0), (11, 2.5))},
            {"temperature": 0.7, "top_k": 40, "min_p": 0.05, "presence_penalty": -0.5, "logprobs": 20},
            {"temperature": 1.0, "logprobs": 0}]
    r = run(worker, f"case_shaped(3000, {rows}, 10, seed=21)")
    assert r["got"] == r["want"]
    assert r["distinct"] >= 20 and r["tops_equal"] and r["lp_err"] < 1e-4
    # ties: top-k 7 cuts inside ten equal values (the lowest ids kept), the log-probs list equal values by id
    r = run(worker, f"case_shaped(3000, {rows}, 6, seed=22, ties=True)")
    assert r["got"] == r["want"] and r["tops_equal"] and r["lp_err"] < 1e-4


def test_engine_shapes_on_the_device_what_the_host_samples_pipelined(worker):
    r = run(worker, "engine_shaped_device_vs_host()")
    assert r["device"] == r["host"]
    assert [len(ids) for ids in r["device"]] == [12, 12, 12]
    assert [len(lp) for lp in r["logprobs_device"]] == [12, 0, 12]  # the second asked for none
    for dev, host in zip(r["logprobs_device"], r["logprobs_host"]):
        assert [(t, top) for t, _, top, _ in dev] == [(t, top) for t, _, top, _ in host]
        values = [(a, b) for d, h in zip(dev, host) for a, b in zip([d[1], *d[3]], [h[1], *h[3]])]
        assert max((abs(a - b) for a, b in values), default=0.0) < 1e-4
    # every step shaped on the device, 10 of its 13 submitted before the step before them was read (fed the drawn
    # ids on the GPU, the penalties reading counts sample_post.wgsl kept); the host's: logits rows, never chained
    assert (r["shaped_device"], r["fed_device"], r["shaped_host"], r["fed_host"]) == (13, 10, 0, 0)
