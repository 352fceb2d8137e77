"""Sliding window + attention sinks and importance eviction on the WebGPU backend (real headless Chromium, tiny
model): a conversation runs past the model's context in a few blocks and equals the CPU engine token for token;
shaders/attention_mass.wgsl equals its numpy reference; eviction under pressure equals the CPU engine."""
from __future__ import annotations

import pytest

from browser_pages import install_modules


@pytest.fixture(scope="module")
def worker(ready_page):
    return install_modules(ready_page, "engine_cases", "kv_cases", "window_cases")


def run(worker, call: str):
    return worker.py(f"import json, window_cases as wc\njson.dumps(await wc.{call})")


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_window_runs_past_the_context_and_equals_the_cpu_engine(worker, kv_dtype):
    r = run(worker, f"window_past_context({kv_dtype!r})")
    assert r["num_blocks"] == 8
    assert len(r["gpu"]) == 300  # 340 tokens through a 256-token model
    assert r["max_blocks_held"] == r["cpu_held"] == 6  # ceil((4 + 64) / 16) + 1
    assert r["shifted_blocks"] > 0 and r["used_blocks"] == 0
    assert r["gpu"] == r["cpu"]


def test_original_positions_past_the_rope_table_are_refused(worker):
    msg = run(worker, "original_positions_refused()")
    assert msg == ("rotary position 256 is past the RoPE table of the model context (256); run long chats with "
                   "KVRetention(positions='shifted')")


@pytest.mark.parametrize("dtype,bound", [("f32", 1e-5), ("f16", 1e-5)])
def test_attention_mass_kernel_equals_numpy(worker, dtype, bound):
    # Decode (1 new token) and prefill chunks (cached + new), GQA 4 over 2, scattered tables. The f16
    # reference reads the same f16 cache, so both bounds are f32 rounding only.
    chunks = [(0, 1), (37, 1), (20, 5), (50, 14)]
    r = run(worker, f"attention_mass_case(3, {chunks}, {dtype!r}, 4, 2, 16)")
    assert r["shape"] == [4, 4, 5]
    assert r["rel"] <= bound, r
    assert abs(r["total"] - 4 * (1 + 1 + 5 + 14)) < 1e-3  # each head's softmax of each new token sums to 1


def test_importance_eviction_on_webgpu_equals_the_cpu_engine(worker):
    r = run(worker, "eviction_under_pressure()")
    assert r["gpu"]["num_blocks"] == r["cpu"]["num_blocks"] == 10
    assert [len(o) for o in r["gpu"]["out"]] == [60, 60]
    assert r["gpu"]["preemptions"] == {"swap": 0, "recompute": 0} and r["gpu"]["evicted"] > 0
    assert r["gpu"]["used"] == 0
    assert r["gpu"] == r["cpu"]
