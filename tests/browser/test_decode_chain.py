"""The pipelined decode (pagedkv/decode_chain.py) in headless Chromium (SwiftShader) and natively (tests/native:
lavapipe): step n + 1 is submitted, its token ids fed on the GPU, before step n's ids are read back.

- The same ids as the engine without the chain: greedy and seeded samples to max_tokens, and greedy requests
  that stop on a drawn id where its slot opens a new block and mid-block (seen one step late); the same
  finish reasons, token histories and pool at the end (the extra step's slots released exactly).
- A request aborted while a step runs for it: the others' ids unchanged, its history without the
  placeholder, every block back.
"""
from __future__ import annotations

import pytest

from browser_pages import install_modules


@pytest.fixture(scope="module")
def worker(ready_page):
    return install_modules(ready_page, "engine_cases", "chain_cases")


def run(worker, call: str):
    return worker.py(f"import json, chain_cases as cc\njson.dumps(await cc.{call})")


def _same(r: dict, chained_at_least: int) -> None:
    plain, piped = r["plain"], r["piped"]
    assert piped["ids"] == plain["ids"]
    assert piped["reasons"] == plain["reasons"]
    assert piped["histories"] == plain["histories"]
    assert piped["end"] == plain["end"] and piped["end"]["used"] == 0
    assert plain["in_flight_steps"] == plain["fed_submits"] == 0
    assert piped["fed_submits"] == piped["in_flight_steps"] >= chained_at_least
    assert piped["submits"] == plain["submits"]  # no step more: a stopped row rides in a step that runs anyway


# The gpu family's pipelined run is tests/native's (lavapipe); in Chromium the cpu family's shows the same host-side
# pipelining over Chromium's buffer mapping, and the gpu family's kernels run in the other engine tests here.
@pytest.mark.parametrize("kernels", ["cpu", pytest.param("gpu", marks=pytest.mark.native_matrix)])
def test_pipelined_decode_draws_what_the_plain_engine_draws(worker, kernels):
    r = run(worker, f"pipelined_vs_plain({kernels!r})")
    _same(r["sampled"], 30)
    assert [len(i) for i in r["sampled"]["piped"]["ids"]] == [40] * 4
    assert len({t for ids in r["sampled"]["piped"]["ids"] for t in ids}) >= 20
    stopped = r["stopped"]
    assert sorted(stopped["stops"]) == ["0", "1", "3"]  # JSON keys
    assert stopped["piped"]["reasons"] == ["stop", "stop", "length", "stop"]
    _same(stopped, 20)
    for i, k in stopped["stops"].items():  # the stop id is the last of the output, one step after it was drawn
        assert len(stopped["piped"]["ids"][int(i)]) == k + 1


@pytest.mark.parametrize("kernels", ["gpu"])
def test_a_request_aborted_while_its_next_step_runs_loses_nothing_else(worker, kernels):
    r = run(worker, f"abort_in_flight({kernels!r})")
    _same(r, 15)
    assert r["piped"]["reasons"][2] == "abort" and len(r["piped"]["ids"][2]) < 24
    assert r["piped"]["histories"][2] == r["piped"]["ids"][2]  # no placeholder left behind
