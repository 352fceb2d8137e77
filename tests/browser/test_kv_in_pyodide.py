"""The KV controller is the same code in both worlds: run the seeded workload under Pyodide in the tab."""
from __future__ import annotations

import json

from browser_pages import ROOT

import kv_invariants

SEEDS = (0, 1, 2)
STEPS = 300


def test_random_workload_matches_cpython_exactly(ready_page):
    source = (ROOT / "tests" / "kv_invariants.py").read_text()
    code = (
        "import json, sys, types\n"
        "mod = types.ModuleType('kv_invariants')\n"
        f"exec(compile({source!r}, 'kv_invariants.py', 'exec'), mod.__dict__)\n"
        "sys.modules['kv_invariants'] = mod\n"
        f"json.dumps([mod.run_random_workload(seed, {STEPS}) for seed in {SEEDS!r}] + [sys.platform])"
    )
    *in_browser, platform = ready_page.py(code)
    assert platform == "emscripten"
    in_cpython = [json.loads(json.dumps(kv_invariants.run_random_workload(seed, STEPS))) for seed in SEEDS]
    assert in_browser == in_cpython
    # Pinned counts for seed 0: the workload really exercised every operation.
    assert in_browser[0] == {
        "new": 40, "append": 83, "fork": 24, "free": 44, "lookup": 27, "hit_blocks": 24, "swap_out": 14,
        "swap_in": 6, "truncate": 26, "cow_copies": 5, "out_of_blocks": 51, "never_fits": 0,
        "rejected_bad_input": 23, "checks": 301, "seed": 0, "num_steps": 300,
    }
