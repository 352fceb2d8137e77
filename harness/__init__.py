"""The harness tests/ and bench/ share (neither imports the other): the system Chromium and its flags
(harness.chromium), the page served from dist/ and driven through Playwright (harness.page), and the app soak
(harness.soak) that tests/browser/test_soak.py checks and bench/soak.py measures."""
from harness.chromium import BASE_ARGS, WEBGPU_ARGS, find_chromium, launch
from harness.page import BootedPage, BrowserSession, ensure_built, open_and_boot, serve_dist, wait_model

__all__ = ["BASE_ARGS", "WEBGPU_ARGS", "BootedPage", "BrowserSession", "ensure_built", "find_chromium", "launch",
           "open_and_boot", "serve_dist", "wait_model"]
