"""Make `py/` importable when a bench module runs from the repo root."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "py", ROOT):  # py/ for pagedkv, the root for build.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# Where benchmarks write their JSON and plots; `python3 -m bench --quick` points it at results/quick/.
RESULTS = Path(os.environ.get("PAGEDKV_BENCH_RESULTS") or ROOT / "bench" / "results")
