"""Fixtures for browser tests: dist/ served on a free port, system Chromium with real WebGPU; the page, the
server and the browser come from bench.harness, the harness the benchmarks use too."""
from __future__ import annotations

import os

import pytest

import build
from bench.harness import browser as harness
from bench.harness.browser import BootedPage

BOOT_TIMEOUT_MS = 240_000
PY_TIMEOUT_MS = 600_000
ROOT = build.ROOT


@pytest.fixture(scope="session")
def base_url():
    if not (build.DIST / "index.html").exists() or os.environ.get("PAGEDKV_REBUILD"):
        build.build()
    with harness.serve_dist() as origin:
        yield origin + "/"


@pytest.fixture(scope="session")
def playwright_instance():
    try:
        executable = build.find_chromium()
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        yield pw, executable


@pytest.fixture(scope="session")
def browser(playwright_instance):
    b = harness.launch(*playwright_instance, webgpu=True)
    yield b
    b.close()


@pytest.fixture(scope="session")
def browser_without_webgpu(playwright_instance):
    b = harness.launch(*playwright_instance, webgpu=False)
    yield b
    b.close()


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
    booted.page.locator("#settings summary").click()
    return booted, info


@pytest.fixture(scope="session")
def ready_page(browser, base_url) -> BootedPage:
    # The tiny model keeps the background model load light; tests here exercise the runtime, not the model.
    booted = open_and_boot(browser, base_url + "?model=tiny-random")
    if booted.state != "ready":
        pytest.fail(f"page did not boot: {booted.dataset()}", pytrace=False)
    yield booted
    booted.page.close()
