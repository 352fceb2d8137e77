"""Fixtures for browser tests: dist/ served on a free port, system Chromium with real WebGPU."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

import build
import serve

from build import BASE_ARGS, WEBGPU_ARGS, find_chromium

BOOT_TIMEOUT_MS = 240_000
ROOT = build.ROOT


@pytest.fixture(scope="session")
def base_url():
    if not (build.DIST / "index.html").exists() or os.environ.get("PAGEDKV_REBUILD"):
        build.build()
    os.environ["PAGEDKV_QUIET_SERVER"] = "1"
    server = serve.make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def playwright_instance():
    try:
        executable = find_chromium()
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        yield pw, executable


def _launch(playwright_instance, webgpu: bool):
    pw, executable = playwright_instance
    args = BASE_ARGS + (WEBGPU_ARGS if webgpu else [])
    return pw.chromium.launch(executable_path=executable, args=args, headless=True)


@pytest.fixture(scope="session")
def browser(playwright_instance):
    b = _launch(playwright_instance, webgpu=True)
    yield b
    b.close()


@pytest.fixture(scope="session")
def browser_without_webgpu(playwright_instance):
    b = _launch(playwright_instance, webgpu=False)
    yield b
    b.close()


class BootedPage:
    """A page that reached a final boot state, with the log of every response it received."""

    def __init__(self, page, responses, console):
        self.page = page
        self.responses = responses
        self.console = console

    @property
    def state(self) -> str:
        return self.page.evaluate("document.documentElement.dataset.state")

    def dataset(self) -> dict:
        return self.page.evaluate("Object.assign({}, document.documentElement.dataset)")

    def py(self, code: str, timeout_ms: int = 600_000):
        """Run Python in the page's worker; returns the JSON-decoded value of the last expression."""
        text = self.page.evaluate(
            "([code, timeout]) => Promise.race([window.pagedkv.exec(code),"
            " new Promise((_, reject) => setTimeout(() => reject(new Error('timeout')), timeout))])",
            [code, timeout_ms],
        )
        return json.loads(text)


def wait_model(booted: BootedPage) -> dict:
    """Wait until the page's model is loaded; returns the model-ready message."""
    booted.page.wait_for_selector("html[data-model=ready], html[data-model=error]", state="attached",
                                  timeout=BOOT_TIMEOUT_MS)
    data = booted.dataset()
    if data.get("model") != "ready":
        pytest.fail(f"model did not load: {booted.page.locator('#model-detail').inner_text()}", pytrace=False)
    return json.loads(data["modelInfo"])


def open_and_boot(browser, url: str) -> BootedPage:
    page = browser.new_page()
    page.set_default_timeout(BOOT_TIMEOUT_MS)
    responses, console = [], []
    page.on("response", lambda r: responses.append((r.status, r.url)))
    page.on("console", lambda m: console.append(m.text))
    page.goto(url)
    # A CSS selector, not wait_for_function: the page's CSP forbids eval, and we keep it on in tests.
    page.wait_for_selector("html:not([data-state=booting])", state="attached", timeout=BOOT_TIMEOUT_MS)
    return BootedPage(page, responses, console)


def install_modules(booted: BootedPage, *names: str) -> BootedPage:
    """Make tests/browser/<name>.py importable in the page's worker (the cases run in Pyodide)."""
    here = Path(__file__).parent
    for name in names:
        source = (here / f"{name}.py").read_text()
        booted.py(
            "import json, sys, types\n"
            f"_mod = types.ModuleType({name!r})\n"
            f"sys.modules[{name!r}] = _mod\n"
            f"exec(compile({json.dumps(source)}, {name + '.py'!r}, 'exec'), _mod.__dict__)\n"
            "json.dumps(True)"
        )
    return booted


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
