"""The chat page's soak (harness/soak.py) as a benchmark: seeded random Send / Stop / Regenerate / Delete /
New chat / switch / reload, two quick Sends and a Delete as a reply starts, two tabs on one chat sending at once,
a full storage quota, and a reload under CPU load, on the tiny model, then what was lost or left behind.

    python3 -m bench.soak [--quick] [--turns N] [--seed S ...] [--reload-every K]

--quick: 40 turns (default 200). Each --seed is a soak of its own in a fresh browser context (a fresh page and
storage); issue 49's run is `python3 -m bench.soak --seed 0 --seed 1 --seed 2` (200 turns each). Prints JSON: the
one seed's figures, or with several a "runs" list and the figures summed over them ("totals"); `python3 -m bench`
writes bench/results/soak.json.
"""
from __future__ import annotations

import argparse

from bench import emit
from harness.page import BrowserSession, open_and_boot, wait_model
from harness.soak import MODEL_QUERY, run_soak

# Figures summed over the seeds: each must be 0 for a clean soak, but the last two, which count what was checked
# and what the page said it did not save under a full quota.
SUMMED = ("errors", "chats_lost", "history_mismatches", "blocks_leaked", "turns_lost", "disk_blocks_missed",
          "turns", "disk_blocks_checked", "turns_unsaved_under_full_quota")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--seed", type=int, action="append", help="repeat for several soaks (default: 0)")
    parser.add_argument("--reload-every", type=int, default=8,
                        help="turns between two actions that boot a page (a reload, a second tab)")
    parser.add_argument("--quick", action="store_true", help="40 turns")
    args = parser.parse_args(argv)
    seeds = args.seed or [0]
    turns = 40 if args.quick else args.turns
    runs = []
    with BrowserSession(MODEL_QUERY) as session:
        for i, seed in enumerate(seeds):
            if i == 0:
                page = session.page
            else:  # a fresh context: its own IndexedDB and OPFS, as the first seed had
                session.context.close()
                session.context = session.browser.new_context()
                booted = open_and_boot(session.context, session.url, session.TIMEOUT_MS)
                wait_model(booted, session.TIMEOUT_MS)
                page = booted.page
            runs.append(run_soak(page, turns=turns, seed=seed, reload_every=args.reload_every))
    if len(runs) == 1:
        result = runs[0]
    else:
        result = {"benchmark": "soak", "seeds": seeds, "turns_each": turns, "query": MODEL_QUERY,
                  "totals": {k: sum(r[k] for r in runs) for k in SUMMED}, "runs": runs}
    result["quick"] = args.quick
    result["reload_every"] = args.reload_every
    emit(result, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
