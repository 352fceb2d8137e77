import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Unit tests import the engine and build.py straight from the source tree.
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "app"))


def pytest_configure(config):
    config.addinivalue_line("markers", "native_matrix: a case of a tests/browser module that runs only under "
                            "tests/native (wgpu-py); tests/browser/conftest.py deselects it in Chromium")
