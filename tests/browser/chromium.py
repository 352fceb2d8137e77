"""Where the system Chromium is and how we launch it (Playwright never downloads a browser here)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

INSTALL_HINT = (
    "Install it with `sudo apt-get install chromium` (Debian/Ubuntu; `bash .ci/run` does this), "
    "or point CHROME_PATH at a Chrome/Chromium 113+ binary."
)

BASE_ARGS = [
    "--no-sandbox",  # tests run as root in CI
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
WEBGPU_ARGS = ["--enable-unsafe-webgpu"]


def find_chromium() -> str:
    """Path of the browser to drive: $CHROME_PATH, else /usr/bin/chromium, else chromium on PATH."""
    configured = os.environ.get("CHROME_PATH")
    if configured:
        if not Path(configured).is_file():
            raise FileNotFoundError(f"CHROME_PATH={configured} does not exist. {INSTALL_HINT}")
        return configured
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"),
                      shutil.which("google-chrome")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise FileNotFoundError(f"No Chromium found for the browser tests. {INSTALL_HINT}")
