"""Fixtures for browser tests: dist/ served on a free port, system Chromium with real WebGPU; the page, the
server and the browser come from harness/, the harness the benchmarks use too."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import build
from harness import chromium, page as harness
from harness.page import BootedPage
from browser_pages import open_and_boot


@pytest.fixture(scope="session")
def base_url():
    if not (build.DIST / "index.html").exists() or os.environ.get("PAGEDKV_REBUILD"):
        build.build()
    with harness.serve_dist() as origin:
        yield origin + "/"


@pytest.fixture(scope="session")
def playwright_instance():
    try:
        executable = chromium.find_chromium()
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        yield pw, executable


@pytest.fixture(scope="session")
def browser(playwright_instance):
    b = chromium.launch(*playwright_instance, webgpu=True)
    yield b
    b.close()


@pytest.fixture(scope="session")
def browser_without_webgpu(playwright_instance):
    b = chromium.launch(*playwright_instance, webgpu=False)
    yield b
    b.close()


@pytest.fixture(scope="session")
def ready_page(browser, base_url) -> BootedPage:
    # The tiny model keeps the background model load light; tests here exercise the runtime, not the model.
    booted = open_and_boot(browser, base_url + "?model=tiny-random")
    if booted.state != "ready":
        pytest.fail(f"page did not boot: {booted.dataset()}", pytrace=False)
    yield booted
    booted.page.close()


def pytest_collection_modifyitems(config, items):
    """Deselect (never skip) the native_matrix cases collected from tests/browser: tests/native runs them."""
    here = Path(__file__).resolve().parent
    native_only = [item for item in items
                   if item.get_closest_marker("native_matrix") and Path(str(item.fspath)).resolve().parent == here]
    if native_only:
        config.hook.pytest_deselected(items=native_only)
        items[:] = [item for item in items if item not in native_only]
