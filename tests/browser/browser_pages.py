"""What browser tests import by name (pytest's `conftest` module name is shared by every directory's
conftest.py, so tests never import from it): booting the page, waiting for the model, installing test
modules in the worker, opening the chat app."""
from __future__ import annotations

import time

import pytest

import build
from harness import page as harness
from harness.page import BootedPage

BOOT_TIMEOUT_MS = 240_000
PY_TIMEOUT_MS = 600_000
ROOT = build.ROOT


def open_and_boot(browser, url: str) -> BootedPage:
    return harness.open_and_boot(browser, url, BOOT_TIMEOUT_MS, PY_TIMEOUT_MS)


def wait_model(booted: BootedPage) -> dict:
    """Wait until the page's model is loaded; returns the model-ready message."""
    try:
        return harness.wait_model(booted, BOOT_TIMEOUT_MS)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


def install_modules(booted: BootedPage, *names: str) -> BootedPage:
    """Make tests/browser/<name>.py importable in the page's worker (the cases run in Pyodide)."""
    return booted.install_test_modules(*names)


def open_app(browser, url: str, timeout_ms: int) -> tuple[BootedPage, dict]:
    """Boot the page, wait for its model, open the generation settings; returns the page and model-ready info."""
    booted = open_and_boot(browser, url)
    assert booted.state == "ready", booted.dataset()
    info = wait_model(booted)
    booted.page.set_default_timeout(timeout_ms)
    show_settings(booted.page)
    return booted, info


def wait_until(what: str, check, state=lambda: None, timeout_s: float = 60.0):
    """Poll `check()` (every 50 ms) until it returns something true, and return that; the page's CSP forbids
    wait_for_function's eval. A test waits on what the page does, never for a fixed time: a bound, not a pace."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"never: {what}: {state()}")


def show_settings(page) -> None:
    """Open the generation settings (<details id="settings">) whatever their state: a click on the summary
    toggles them, so a click that lands on already open settings would hide the fields a test fills next."""
    page.evaluate("document.getElementById('settings').open = true")
