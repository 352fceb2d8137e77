"""The seed's experiment in the real tab: kv_sim's multi-session workload against real GPU buffers.

    python3 -m bench.kv_browser [--budget-mib 1024 2048] [--kv-dtype f16] [--quick]

In headless Chromium (WebGPU; SwiftShader on this machine) the worker loads SmolLM2-135M through
WebGpuBackend under each byte budget: weights, scratch, staging and the KV pool are real GPU buffers,
each reserved in the GpuLedger first. The KV pool's size (and bytes per token, from the real layout of
`--kv-dtype`) then sizes three allocators replaying the same sessions as bench/kv_sim.py: contiguous,
paged without prefix caching, and paged with prefix caching (the four system prompts are shared).
Every slot a token gets is written by the engine's kv_write kernel with synthetic K/V (one layer per
tick, round-robin; see kv_browser_worker.GpuWriter). A capacity probe grows one conversation alone
until its allocation is refused, against (budget - weights - scratch - staging) / bytes_per_token.

Prints JSON; writes bench/results/kv_browser.json (with --quick: kv_browser_quick.json). Figures only.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.browser import BrowserSession
from bench._path import RESULTS

HERE = Path(__file__).resolve().parent
WORKER = HERE / "kv_browser_worker.py"
# (label, allocator, prefix caching, preempt): the last row waits / preempts by recompute instead of failing.
ROWS = (("contiguous", "contiguous", False, False), ("paged", "paged", False, False),
        ("paged+prefix", "paged", True, False), ("paged+prefix+preempt", "paged", True, True))

SCALAR_KEYS = ("max_context_tokens", "utilization_mean", "utilization_p5", "token_utilization_mean",
               "slot_efficiency", "oom_rate", "turns_started", "turns_failed", "sessions", "sessions_served",
               "prefix_hit_rate", "sharing_factor", "realloc_copied_tokens", "kv_write_dispatches",
               "kv_write_tokens", "wall_s", "preemptions", "deferred_ticks")


def run(budgets_mib: list[int], kv_dtype: str, sessions: int, seed: int, layers_per_tick: int) -> dict:
    report = {"benchmark": "kv_browser", "kv_dtype": kv_dtype, "sessions": sessions, "seed": seed,
              "layers_written_per_tick": layers_per_tick, "budgets": []}
    with BrowserSession("?model=tiny-random&backend=cpu") as page:
        page.install_bench("kv_sim.py", "webgpu_engine_worker.py")
        page.py(WORKER.read_text() + "\nNone")
        for mib in budgets_mib:
            ledger = page.py(f"import json\njson.dumps(await load_backend({mib}, {kv_dtype!r}))")
            print(json.dumps(ledger), file=sys.stderr)
            entry = {"budget_mib": mib, "ledger": ledger, "rows": {}, "capacity": {}}
            for kind in ("contiguous", "paged"):
                probe = page.py(f"import json\njson.dumps(await capacity_probe({kind!r}))")
                probe["fraction_of_formula"] = probe["max_context_tokens"] / ledger["formula_tokens"]
                entry["capacity"][kind] = probe
                print(json.dumps(probe), file=sys.stderr)
            for label, kind, prefix, preempt in ROWS:
                row = page.py(f"import json\njson.dumps(await replay({kind!r}, {sessions}, {seed}, "
                              f"enable_prefix_caching={prefix}, layers_per_tick={layers_per_tick}, "
                              f"preempt={preempt}))")
                entry["rows"][label] = row
                print(label, json.dumps({k: row[k] for k in SCALAR_KEYS}), file=sys.stderr)
            report["budgets"].append(entry)
        report["adapter"] = json.loads(page.dataset()["adapter"])["name"]
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-mib", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--kv-dtype", default="f16", help="KV cache dtype of the backend (f16; int8 once merged)")
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers-per-tick", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="1 GiB only, 200 sessions")
    args = parser.parse_args(argv)
    if args.quick:
        args.budget_mib, args.sessions = [1024], 200
    if min(args.budget_mib) <= 0 or args.sessions < 1 or args.layers_per_tick < 1:
        parser.error("budgets, --sessions and --layers-per-tick must be positive")
    report = run(args.budget_mib, args.kv_dtype, args.sessions, args.seed, args.layers_per_tick)
    text = json.dumps(report)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "kv_browser.json" if args.kv_dtype == "f16" else f"kv_browser_{args.kv_dtype}.json"
    (RESULTS / name).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
