"""Benchmark drivers, one per benchmark (`python3 -m bench.<name>` prints its JSON; `python3 -m bench` files it).

Importing the package makes py/, app/ and the repo root importable when a driver runs from the repo root, and
gives the drivers emit() and previous_result(): how a benchmark hands over its JSON. It runs in the page too
(bench.harness.install_bench installs it with the modules page code imports).
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "app", ROOT / "py", ROOT):  # py/ for pagedkv, the root for build.py, app/ for pagedkv_app
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# The folder `python3 -m bench` files results in (it points this at results/quick/ for --quick): the reports'
# default input.
RESULTS = Path(os.environ.get("PAGEDKV_BENCH_RESULTS") or ROOT / "bench" / "results")
# The file `python3 -m bench` is about to replace with this benchmark's JSON (unset when it runs alone).
PREVIOUS_ENV = "PAGEDKV_BENCH_PREVIOUS"


def emit(report: dict, indent: int | None = 1) -> None:
    """Print a benchmark's JSON on stdout: `python3 -m bench` files it, a benchmark run alone only prints it."""
    print(json.dumps(report, indent=indent))


def previous_result() -> dict | None:
    """The result this run will replace, for a benchmark that merges one part into it (long_chat); None when
    the benchmark runs alone or has no result yet."""
    path = os.environ.get(PREVIOUS_ENV)
    return json.loads(Path(path).read_text()) if path and Path(path).exists() else None
