"""The seed's experiment in the real tab: kv_sim's multi-session workload against real GPU buffers.

    python3 -m bench.kv_browser [--budget-mib 1024 2048] [--kv-dtypes f16 int8] [--all-rows] [--quick]

In headless Chromium (WebGPU; SwiftShader on this machine) the worker loads SmolLM2-135M through
WebGpuBackend under each byte budget and KV dtype: weights, scratch, staging and the KV pool are real GPU
buffers, each reserved in the GpuLedger first. The KV pool's size (and bytes per token, from the real layout
of the dtype, scales included) then sizes the allocators replaying the same sessions as bench/kv_sim.py:
contiguous, paged without prefix caching, paged with prefix caching (the four system prompts are shared)
and the latter waiting / preempting instead of failing. f16 runs all four; other dtypes (and --quick) run
the contiguous baseline and the preempting row (the engine's configuration) unless --all-rows.
Every slot a token gets is written by the engine's kv_write kernel with synthetic K/V (one layer per
tick, round-robin; see bench/page/kv_browser.py's GpuWriter). A capacity probe grows one conversation alone
until its allocation is refused, against (budget - weights - scratch - staging) / bytes_per_token.

Prints JSON (`python3 -m bench` files it). Figures only.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from bench import emit
from bench.harness import install_bench, session
from harness.page import BootedPage
from pagedkv.kv.dtypes import KV_DTYPES

# (label, allocator, prefix caching, preempt): the last row waits / preempts by recompute instead of failing.
ROWS = (("contiguous", "contiguous", False, False), ("paged", "paged", False, False),
        ("paged+prefix", "paged", True, False), ("paged+prefix+preempt", "paged", True, True))
# Rows of a dtype other than f16 without --all-rows: the baseline and the engine's own configuration.
SHORT_ROWS = ("contiguous", "paged+prefix+preempt")
# --quick: arrivals end at ~3 s x sessions, so the sampled stretch (warm-up to last arrival) is ~160 s.
QUICK_SESSIONS, QUICK_WARMUP_S = 80, 80

SCALAR_KEYS = ("max_context_tokens", "utilization_mean", "utilization_p5", "token_utilization_mean",
               "slot_efficiency", "oom_rate", "turns_started", "turns_failed", "sessions", "sessions_served",
               "prefix_hit_rate", "sharing_factor", "realloc_copied_tokens", "kv_write_dispatches",
               "kv_write_tokens", "wall_s", "preemptions", "deferred_ticks")


def run(budgets_mib: list[int], kv_dtypes: list[str], sessions: int, seed: int, layers_per_tick: int,
        all_rows_dtypes: tuple[str, ...] = ("f16",), warmup_s: int = 300) -> dict:
    """Every budget under every dtype; the dtypes in `all_rows_dtypes` run all ROWS, the others SHORT_ROWS."""
    report = {"benchmark": "kv_browser", "kv_dtypes": kv_dtypes, "sessions": sessions, "seed": seed,
              "warmup_s": warmup_s, "layers_written_per_tick": layers_per_tick, "budgets": []}
    with session() as page:
        install_bench(page, "kv_sim.py", "page/webgpu_engine.py", "page/kv_browser.py")
        page.py("from bench.page.kv_browser import *\nNone")
        for kv_dtype in kv_dtypes:
            rows = [r for r in ROWS if kv_dtype in all_rows_dtypes or r[0] in SHORT_ROWS]
            for mib in budgets_mib:
                report["budgets"].append(run_budget(page, mib, kv_dtype, rows, sessions, seed, layers_per_tick,
                                                    warmup_s))
        report["adapter"] = json.loads(page.dataset()["adapter"])["name"]
        page.py("release()\nNone")  # the page may go on to other benchmarks
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return report


def run_budget(page: BootedPage, mib: int, kv_dtype: str, rows: list[tuple], sessions: int, seed: int,
               layers_per_tick: int, warmup_s: int) -> dict:
    """One budget and KV dtype: the ledger, both capacity probes and the replay `rows`."""
    ledger = page.py(f"import json\njson.dumps(await load_backend({mib}, {kv_dtype!r}))")
    print(json.dumps(ledger), file=sys.stderr)
    entry = {"budget_mib": mib, "kv_dtype": kv_dtype, "ledger": ledger, "rows": {}, "capacity": {}}
    for kind in ("contiguous", "paged"):
        probe = page.py(f"import json\njson.dumps(await capacity_probe({kind!r}))")
        probe["fraction_of_formula"] = probe["max_context_tokens"] / ledger["formula_tokens"]
        entry["capacity"][kind] = probe
        print(json.dumps(probe), file=sys.stderr)
    for label, kind, prefix, preempt in rows:
        row = page.py(f"import json\njson.dumps(await replay({kind!r}, {sessions}, {seed}, "
                      f"enable_prefix_caching={prefix}, layers_per_tick={layers_per_tick}, "
                      f"preempt={preempt}, warmup_s={warmup_s}))")
        entry["rows"][label] = row
        print(kv_dtype, mib, label, json.dumps({k: row[k] for k in SCALAR_KEYS}), file=sys.stderr)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-mib", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--kv-dtypes", nargs="+", default=["f16", "int8"], choices=sorted(KV_DTYPES),
                        help="KV cache dtypes of the backend, each under every budget")
    parser.add_argument("--all-rows", action="store_true", help="all four rows for every dtype, not only f16")
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers-per-tick", type=int, default=1)
    parser.add_argument("--warmup-s", type=int, default=300, help="simulated seconds before sampling utilization")
    parser.add_argument("--quick", action="store_true", help=f"1 GiB only, {QUICK_SESSIONS} sessions, "
                                                             f"{QUICK_WARMUP_S} s warm-up, short rows only")
    args = parser.parse_args(argv)
    all_rows_dtypes = tuple(args.kv_dtypes) if args.all_rows else ("f16",)
    if args.quick:
        args.budget_mib, args.sessions, args.warmup_s, all_rows_dtypes = [1024], QUICK_SESSIONS, QUICK_WARMUP_S, ()
    if min(args.budget_mib) <= 0 or args.sessions < 1 or args.layers_per_tick < 1 or args.warmup_s < 0:
        parser.error("budgets, --sessions and --layers-per-tick must be positive, --warmup-s not negative")
    report = run(args.budget_mib, args.kv_dtypes, args.sessions, args.seed, args.layers_per_tick, all_rows_dtypes,
                 args.warmup_s)
    emit(report, indent=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
