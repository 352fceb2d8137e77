"""Make `py/` importable when a bench module runs from the repo root."""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "py", ROOT):  # py/ for pagedkv, the root for build.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# Where benchmarks write their JSON and plots; `python3 -m bench --quick` points it at results/quick/.
RESULTS = Path(os.environ.get("PAGEDKV_BENCH_RESULTS") or ROOT / "bench" / "results")


def save_result(name: str, report: dict, indent: int | None = 1) -> None:
    """Print a benchmark's JSON on stdout (what `python3 -m bench` reads) and write it to RESULTS/<name>.json."""
    text = json.dumps(report, indent=indent)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(text + "\n")
