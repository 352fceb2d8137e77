"""The benchmarks' own tests: the runner, the report, and the logic of drivers (workload replay, the long chat's
worker, the policies a quality benchmark compares, the ledger a model leaves). tests/ never imports bench; these
check bench itself. They use tests/'s model fixtures (model_fixtures.py)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
for path in (ROOT / "tests", ROOT / "app", ROOT / "py", ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
