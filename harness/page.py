"""The one browser harness: serve dist/, boot the page in the system Chromium (harness.chromium), run Python in
its worker, install modules into the page. Used by tests/browser/conftest.py, the browser benchmarks (through
bench.harness) and `npm run generate` (pagedkv.generate).
"""
from __future__ import annotations

import json
import os
import sys
import threading
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import build
import serve
from harness.chromium import find_chromium, launch

ROOT = Path(__file__).resolve().parent.parent
BUILT_ENV = "PAGEDKV_BENCH_BUILT"  # set by `python3 -m bench` after it built dist/ once for the whole run
INSTALL_DIR = "/installed"  # in the worker's file system; on its sys.path once something is installed

INSTALL = """
import importlib, os, sys
for _path, _text in {files!r}.items():
    os.makedirs(os.path.dirname({root!r} + "/" + _path), exist_ok=True)
    with open({root!r} + "/" + _path, "w") as f:
        f.write(_text)
    # The next import reads the new source, as in a page that never imported it.
    sys.modules.pop(_path[:-3].replace("/", ".").removesuffix(".__init__"), None)
if {root!r} not in sys.path:
    sys.path.insert(0, {root!r})
importlib.invalidate_caches()
None
"""


def ensure_built() -> None:
    """Build dist/ (shaders, wheels, models), unless `python3 -m bench` already did for this run. The build's
    progress lines go to stderr: a benchmark's --json stdout stays one JSON document."""
    if os.environ.get(BUILT_ENV) != "1" or not (build.DIST / "index.html").exists():
        with redirect_stdout(sys.stderr):
            build.build()


@contextmanager
def serve_dist(make_server=None):
    """dist/ served on a free port of 127.0.0.1; yields the origin. make_server(host, port) -> an HTTP server
    (default serve.make_server; bench.wllama's adds the peer's page)."""
    os.environ["PAGEDKV_QUIET_SERVER"] = "1"
    server = (make_server or serve.make_server)("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class BootedPage:
    """A page that reached a final boot state, with the log of every response and console message it received.
    py_timeout_ms: how long py() waits for one call by default (None: as long as it takes)."""

    def __init__(self, page, responses: list, console: list, py_timeout_ms: int | None) -> None:
        self.page = page
        self.responses = responses
        self.console = console
        self.py_timeout_ms = py_timeout_ms

    @property
    def state(self) -> str:
        return self.page.evaluate("document.documentElement.dataset.state")

    def dataset(self) -> dict:
        return self.page.evaluate("Object.assign({}, document.documentElement.dataset)")

    def py(self, code: str, timeout_ms: int | None = None):
        """Run Python in the page's worker; returns the JSON-decoded value of its last expression."""
        timeout_ms = timeout_ms or self.py_timeout_ms
        if timeout_ms is None:
            return json.loads(self.page.evaluate("code => window.pagedkv.exec(code)", code))
        text = self.page.evaluate(
            "([code, timeout]) => Promise.race([window.pagedkv.exec(code),"
            " new Promise((_, reject) => setTimeout(() => reject(new Error('timeout')), timeout))])",
            [code, timeout_ms],
        )
        return json.loads(text)

    def install(self, files: dict[str, str]) -> None:
        """Write files (path relative to the install root -> source) into the worker and make them importable
        there: {"kernel_calls.py": ...} as `kernel_calls`, {"bench/page/x.py": ...} as `bench.page.x`."""
        self.py(INSTALL.format(files=files, root=INSTALL_DIR))

    def install_package(self, package: str, *paths: str) -> "BootedPage":
        """Install <package>/<path> of the repository for each path with the package files above it, so page code
        imports them as in CPython: ("bench", "page/ttft_turns.py") as bench.page.ttft_turns."""
        names = ["__init__.py"]
        for path in paths:
            if "/" in path:
                names.append(f"{path.rsplit('/', 1)[0]}/__init__.py")
            names.append(path)
        self.install({f"{package}/{name}": (ROOT / package / name).read_text() for name in dict.fromkeys(names)})
        return self

    def install_test_modules(self, *names: str) -> "BootedPage":
        """Make tests/browser/<name>.py importable in the worker as the module `name` (cases and single kernel
        calls, run in Pyodide by tests and benchmarks alike)."""
        here = ROOT / "tests" / "browser"
        self.install({f"{name}.py": (here / f"{name}.py").read_text() for name in names})
        return self


def open_and_boot(browser, url: str, timeout_ms: int, py_timeout_ms: int | None = None) -> BootedPage:
    """A new page at url (of a browser or a browser context), once it has left the booting state (ready or
    error)."""
    page = browser.new_page()
    page.set_default_timeout(timeout_ms)
    responses, console = [], []
    page.on("response", lambda r: responses.append((r.status, r.url)))
    page.on("console", lambda m: console.append(m.text))
    page.goto(url)
    # A CSS selector, not wait_for_function: the page's CSP forbids eval, and we keep it on in tests.
    page.wait_for_selector("html:not([data-state=booting])", state="attached", timeout=timeout_ms)
    return BootedPage(page, responses, console, py_timeout_ms)


def wait_model(booted: BootedPage, timeout_ms: int) -> dict:
    """Wait until the page's model is loaded; returns the model-ready info. RuntimeError when it did not load."""
    booted.page.wait_for_selector("html[data-model=ready], html[data-model=error]", state="attached",
                                  timeout=timeout_ms)
    data = booted.dataset()
    if data.get("model") != "ready":
        raise RuntimeError(f"model did not load: {booted.page.locator('#model-detail').inner_text()}")
    return json.loads(data["modelInfo"])


class BrowserSession(BootedPage):
    """`with BrowserSession(query) as s: s.py(code)`: its own server, Chromium and booted page, model loaded."""

    TIMEOUT_MS = 900_000

    def __init__(self, query: str = "", *, build_first: bool = True, make_server=None) -> None:
        self.query = query
        self.build_first = build_first
        self.make_server = make_server

    def __enter__(self) -> "BrowserSession":
        from playwright.sync_api import sync_playwright

        if self.build_first:
            ensure_built()
        self._server = serve_dist(self.make_server)
        self.origin = self._server.__enter__()
        self.url = f"{self.origin}/{self.query}"
        self._pw = sync_playwright().start()
        self.browser = launch(self._pw, find_chromium())
        # A context of its own, not browser.new_page()'s: a page-owned context takes no second page (the soak's
        # second tab on the same storage).
        self.context = self.browser.new_context()
        booted = open_and_boot(self.context, self.url, self.TIMEOUT_MS)
        super().__init__(booted.page, booted.responses, booted.console, None)
        if self.state == "error":
            raise RuntimeError(f"page failed to boot: {self.dataset().get('error')}")
        self.model_info = wait_model(self, self.TIMEOUT_MS)
        return self

    def __exit__(self, *exc) -> None:
        self.browser.close()
        self._pw.stop()
        self._server.__exit__(*exc)

