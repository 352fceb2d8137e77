"""Make `py/` importable when a bench module runs from the repo root."""

import sys
from pathlib import Path

PY = Path(__file__).resolve().parent.parent / "py"
if str(PY) not in sys.path:
    sys.path.insert(0, str(PY))
