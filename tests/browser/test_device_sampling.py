"""The next token drawn on the GPU (shaders/sample.wgsl), in headless Chromium (SwiftShader) and natively
(tests/native: lavapipe): a sampled step reads back token ids, not (S, vocab) logits.

- The kernel against pagedkv.sampling.Sampler (the numpy draw, f64): the same random number u (Sampler.device_draw
  consumes it as sample() would) gives the same token for greedy, temperature and top-p rows, at SmolLM2's
  vocabulary and with ties at the top and across the top-p cut (the lower id first, as the stable sort).
- The engine (LLMEngine on WebGPU, both kernel families): seeded requests drawn on the device give the tokens
  the same engine gives when the host samples from the logits; a step whose rows cannot all be drawn there
  (the fork of n = 2 samples) falls back to the host.
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
