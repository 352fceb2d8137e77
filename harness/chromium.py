"""The browser tests, the benchmarks and `npm run generate` drive: the system Chromium, found here and launched
through Playwright with these flags; it never downloads a browser. Standard library only at import time
(bootstrap.py checks for the browser before anything is installed)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

INSTALL_HINT = (
    "Install it with `sudo apt-get install chromium` (Debian/Ubuntu; `npm test` does this when run as root), "
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


def launch(pw, executable: str, webgpu: bool = True):
    """Headless Chromium from the Playwright instance `pw`, with real WebGPU unless webgpu=False."""
    return pw.chromium.launch(executable_path=executable, args=BASE_ARGS + (WEBGPU_ARGS if webgpu else []),
                              headless=True)
