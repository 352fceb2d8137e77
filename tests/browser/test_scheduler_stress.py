"""The scheduler under pressure in real headless Chromium on WebGPU (tiny model): six two-turn conversations
in a pool of a few dozen blocks, and n = 3 parallel samples on forked blocks. Cases run in the page's worker
(tests/browser/sched_cases.py, on top of engine_cases.py)."""
from __future__ import annotations

import json

import pytest

from browser_pages import install_modules


@pytest.fixture(scope="module")
def worker(ready_page):
    return install_modules(ready_page, "engine_cases", "sched_cases")


def run(worker, call: str):
    return worker.py(f"import json, sched_cases as sc\njson.dumps(await sc.{call})")


@pytest.mark.parametrize("preemption", ["auto", "recompute"])
def test_six_conversations_in_24_blocks_finish_without_failure_or_leak(worker, preemption):
    # Victims of up to 4 blocks swap (the CPU tier's promotions shape this schedule: its victims have 4 blocks).
    r = run(worker, f"stress(seed=7, num_blocks=24, preemption={preemption!r}, swap_max_blocks=4)")
    assert r["num_blocks"] == 24 and r["ledger"]["num_blocks"] == 24
    assert r["failures"] == [] and r["turns"] == 12
    assert sum(r["preemptions"].values()) >= 1 and r["preempted_turns"] >= 1, r
    if preemption == "auto":  # small victims swap; swap-in shares blocks still in the GPU prefix cache
        assert r["preemptions"]["swap"] >= 1 and 1 <= r["swap_in_blocks"] <= r["swap_out_blocks"], r
    else:
        # Every copy to the CPU pool was a demotion of an evicted cached block (kv_cpu_tier), none a swap-out.
        assert r["preemptions"]["swap"] == 0 and r["swap_out_blocks"] <= r["demoted"]
    assert r["used"] == 0 and r["free"] + r["cached"] == r["num_blocks"] == 24  # no leaked block
    # The CPU tier keeps demoted and swapped-out full blocks as cache (findable by their prefix); none stays in use.
    assert r["cpu_free"] + r["cpu_cached"] == r["cpu_total"] == 32
    assert r["peak_used_blocks"] == 24 and r["ledger"]["peak"] <= r["ledger"]["budget"]  # the pool ran full
    print(json.dumps({k: r[k] for k in ("preemptions", "preempted_turns", "swap_out_blocks", "steps",
                                        "peak_used_blocks", "tokens", "replies")}))


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_three_samples_share_the_prompt_blocks_and_equal_lone_runs_on_webgpu(worker, kv_dtype):
    r = run(worker, f"parallel_samples({kv_dtype!r})")
    assert r["after_prefill"] == [[0, 1, 2]] * 3 and r["refs"] == [3, 3, 3]
    assert r["after_cow"] == [[0, 1, 3], [0, 1, 4], [0, 1, 2]] and r["copy_ops"] == 2
    assert r["prefill_tokens"] == 40 and r["used_blocks"] == 0
    assert r["samples"] == r["lone"] and len({tuple(s) for s in r["samples"]}) == 3
