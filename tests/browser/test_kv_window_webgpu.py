"""Sliding window + attention sinks on the WebGPU backend (real headless Chromium, tiny model): a conversation
runs past the model's context in a few blocks and equals the CPU engine token for token."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def worker(ready_page):
    for name in ("engine_cases", "window_cases"):
        source = (HERE / f"{name}.py").read_text()
        ready_page.py(
            "import json, sys, types\n"
            f"_mod = types.ModuleType({name!r})\n"
            f"sys.modules[{name!r}] = _mod\n"
            f"exec(compile({json.dumps(source)}, {name + '.py'!r}, 'exec'), _mod.__dict__)\n"
            "json.dumps(True)"
        )
    return ready_page


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
