"""The WebGPU backend (whole forward over the paged KV cache, one submit per step) vs the numpy reference,
in real headless Chromium with real WebGPU. Cases run in the page's worker (tests/browser/engine_cases.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("engine_cases.py")


@pytest.fixture(scope="module")
def worker(ready_page):
    ready_page.py(
        "import json, sys, types\n"
        "_mod = types.ModuleType('engine_cases')\n"
        f"exec(compile({json.dumps(CASES.read_text())}, 'engine_cases.py', 'exec'), _mod.__dict__)\n"
        "sys.modules['engine_cases'] = _mod\n"
        "json.dumps(True)"
    )
    return ready_page


def run(worker, call: str):
    return worker.py(f"import json, engine_cases as ec\njson.dumps(await ec.{call})")


@pytest.mark.parametrize("block_size,kv_dtype", [(8, "f16"), (16, "f32"), (32, "f16")])
def test_tiny_greedy_through_engine_equals_numpy(worker, block_size, kv_dtype):
    r = run(worker, f"tiny_greedy({block_size}, {kv_dtype!r})")
    assert r["gpu"] == r["ref"]
