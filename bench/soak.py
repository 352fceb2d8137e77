"""The chat page's soak (harness/soak.py) as a benchmark: seeded random Send / Stop / Regenerate / Delete /
New chat / switch / reload, two quick Sends and a Delete as a reply starts, on the tiny model, then what was lost or
left behind.

    python3 -m bench.soak [--quick] [--turns N] [--seed S]        (--quick: 40 turns; default 200)

Prints JSON; `python3 -m bench` writes bench/results/soak.json.
"""
from __future__ import annotations

import argparse

from bench import emit
from harness.page import BrowserSession
from harness.soak import MODEL_QUERY, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="40 turns")
    args = parser.parse_args(argv)
    with BrowserSession(MODEL_QUERY) as session:
        result = run_soak(session.page, turns=40 if args.quick else args.turns, seed=args.seed)
    result["quick"] = args.quick
    emit(result, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
