"""harness/chromium.py: the browser the browser tests and the benchmarks drive, and what to do when it is missing."""
from __future__ import annotations

import pytest

from harness.chromium import find_chromium


def test_missing_chromium_message(monkeypatch, tmp_path):
    monkeypatch.setenv("CHROME_PATH", str(tmp_path / "no-such-chrome"))
    with pytest.raises(FileNotFoundError) as err:
        find_chromium()
    assert "apt-get install chromium" in str(err.value)
