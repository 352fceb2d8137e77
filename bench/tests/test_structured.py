"""bench/structured.py's decode comparison: the modes interleaved round by round, ms/token from the steps' clock
(first to last new token), the per-round ratios to plain; and its table in the summary."""
import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from bench import structured
from bench.report.summary import structured_table


def run_alone(coro):
    """asyncio.run in a thread of its own: when the browser tests ran first, Playwright's sync API keeps a loop
    running in this thread, where asyncio.run refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()

# ms per step of each mode, round by round: round 2 runs on a machine twice as busy
STEP_MS = {"plain": [100, 200], "json_schema": [150, 300], "tools": [200, 400]}


def mode_of(fields: dict) -> str:
    return "json_schema" if "response_format" in fields else "tools" if "tools" in fields else "plain"


def fake_run(monkeypatch, end_early: str | None = None):
    """A fake engine whose steps each take a mode's STEP_MS on a fake clock and bring one token."""
    now = [0.0]
    monkeypatch.setattr(structured.time, "perf_counter", lambda: now[0])
    calls, current = [], {}

    async def step():
        now[0] += current["ms"] / 1e3
        return [SimpleNamespace(token_ids=[7])]

    llm = SimpleNamespace(step=step)
    clock = structured.StepClock(llm)

    async def create(messages, max_tokens, temperature, **fields):
        mode = mode_of(fields)
        calls.append((mode, max_tokens))
        current["ms"] = STEP_MS[mode][sum(m == mode for m, n in calls if n > 2) - 1] if max_tokens > 2 else 1.0
        tokens = max_tokens - 1 if mode == end_early else max_tokens
        now[0] += 5.0  # the prompt's prefill: not in the figure
        for _ in range(tokens):
            await llm.step()
        return {"usage": {"completion_tokens": tokens, "prompt_tokens": 40 if mode != "tools" else 300},
                "choices": [{"finish_reason": "stop" if mode == end_early else "length"}]}

    return create, clock, calls


def test_modes_take_turns_and_each_round_is_compared_with_its_own_plain_request(monkeypatch):
    create, clock, calls = fake_run(monkeypatch)
    out = run_alone(structured.decode_rounds(create, clock, rounds=2, max_tokens=5))
    assert calls == [("plain", 2)] + [(m, 5) for m in ("plain", "json_schema", "tools")] * 2
    modes = out["modes"]
    assert modes["plain"]["rounds_ms_per_token"] == [100.0, 200.0]
    assert modes["json_schema"]["ms_per_token_median"] == 225.0
    assert modes["json_schema"]["rounds_ratio_to_plain"] == [1.5, 1.5]
    assert modes["tools"]["ratio_to_plain"] == 2.0
    assert modes["tools"]["tok_s_median"] == 3.33
    assert modes["tools"]["prompt_tokens"] == 300
    assert (out["rounds"], out["tokens_per_request"]) == (2, 5)


def test_a_reply_that_ends_before_the_token_count_is_an_error(monkeypatch):
    create, clock, _ = fake_run(monkeypatch, end_early="json_schema")
    with pytest.raises(RuntimeError, match=r"json_schema: 4 tokens \(4 timed\), not 5: its reply ended early \(stop\)"):
        run_alone(structured.decode_rounds(create, clock, rounds=1, max_tokens=5))


def test_the_summary_table_has_a_row_per_backend(monkeypatch):
    create, clock, _ = fake_run(monkeypatch)
    decode = run_alone(structured.decode_rounds(create, clock, rounds=2, max_tokens=5))
    cold = {"median": 0.24, "p95": 11.3, "max": 70.0, "n": 218}
    st = {"model": "smollm2", "decode": decode, "load_average": {"start": [5.0, 6, 7], "end": [8.25, 6, 7]},
          "trie_nodes": 100298, "seeds": {"count": 5}, "tab": None,
          "mask_ms": {"cold": cold, "cached": {"median": 0.006, "p95": 0.007, "max": 0.08, "n": 218}}}
    wgpu = dict(st, adapter="llvmpipe", quick=True)
    lines = structured_table(st, wgpu)
    assert lines[6:8] == ["| CPU backend (numpy) | 2 x 5 | 5.0, 8.2 | 150 | 225 (1.50x; rounds 1.50-1.50) "
                          "| 300 (2.00x; rounds 2.00-2.00) |",
                          "| WebGPU, gpu kernels, llvmpipe (quick) | 2 x 5 | 5.0, 8.2 | 150 | 225 (1.50x; rounds "
                          "1.50-1.50) | 300 (2.00x; rounds 2.00-2.00) |"]
    assert lines[9] == ("The mask alone (GrammarMatcher over the 100,298-node vocabulary trie, 218 tokens of 5 seeded "
                        "replies): cold median 0.24 ms, p95 11.3 ms; cached median 0.006 ms.")
