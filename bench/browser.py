"""Drive the built page from CPython: serve dist/, launch the system Chromium with WebGPU, run Python in the worker.

Shared by `npm run generate` (bench/generate.py) and the browser benchmarks.
"""
from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

from bench import _path  # noqa: F401  (puts py/ and the repo root on sys.path)
import build
import serve

TIMEOUT_MS = 900_000
# The page most browser benchmarks run in: the app loads only the tiny model, on the CPU, so the benchmark has
# the GPU (and the budget) to itself. `python3 -m bench` runs those benchmarks in one such page (bench/one_page.py).
QUERY = "?model=tiny-random&backend=cpu"
BUILT_ENV = "PAGEDKV_BENCH_BUILT"  # set by `python3 -m bench` after it built dist/ once for the whole run


def ensure_built() -> None:
    """Build dist/ (shaders, wheels, models), unless `python3 -m bench` already did for this run."""
    if os.environ.get(BUILT_ENV) != "1" or not (build.DIST / "index.html").exists():
        build.build()

INSTALL = """
import os, sys
for _path, _text in {files!r}.items():
    os.makedirs(os.path.dirname("/bench_src/" + _path), exist_ok=True)
    with open("/bench_src/" + _path, "w") as f:
        f.write(_text)
if "/bench_src" not in sys.path:
    sys.path.insert(0, "/bench_src")
None
"""


class BrowserSession:
    """`with BrowserSession(query) as s: s.py(code)` — a booted page with its model loaded."""

    def __init__(self, query: str = "", *, build_first: bool = True, make_server=None) -> None:
        self.query = query
        self.build_first = build_first
        self.make_server = make_server or serve.make_server  # (host, port) -> an HTTP server of dist/

    def __enter__(self) -> "BrowserSession":
        from playwright.sync_api import sync_playwright

        if self.build_first:
            ensure_built()
        os.environ["PAGEDKV_QUIET_SERVER"] = "1"
        self.server = self.make_server("127.0.0.1", 0)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.origin}/{self.query}"
        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=build.find_chromium(),
                                                args=build.BASE_ARGS + build.WEBGPU_ARGS, headless=True)
        self.page = self.browser.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.goto(self.url)
        self.page.wait_for_selector("html[data-state=error], html[data-model=ready], html[data-model=error]",
                                    state="attached", timeout=TIMEOUT_MS)
        data = self.dataset()
        if data.get("state") == "error":
            raise RuntimeError(f"page failed to boot: {data.get('error')}")
        if data.get("model") != "ready":
            raise RuntimeError(f"model failed to load: {self.page.locator('#model-detail').inner_text()}")
        self.model_info = json.loads(data["modelInfo"])
        return self

    def dataset(self) -> dict:
        return self.page.evaluate("Object.assign({}, document.documentElement.dataset)")

    def py(self, code: str):
        """Run Python in the page's worker; returns the JSON-decoded value of its last expression."""
        return json.loads(self.page.evaluate("code => window.pagedkv.exec(code)", code))

    def install_bench(self, *names: str) -> None:
        """Copy bench/__init__.py, bench/_path.py and bench/<names> into the worker's file system, importable
        there as the package `bench` (for benchmark code shared between CPython and the page)."""
        here = Path(__file__).resolve().parent
        files = {f"bench/{name}": (here / name).read_text() for name in ("__init__.py", "_path.py", *names)}
        self.py(INSTALL.format(files=files))

    def install_test_module(self, name: str) -> None:
        """Make tests/browser/<name>.py importable in the worker as the module `name` (one copy of the code
        that runs single kernel calls, for tests and benchmarks alike)."""
        source = (Path(__file__).resolve().parents[1] / "tests" / "browser" / f"{name}.py").read_text()
        self.py(INSTALL.format(files={f"{name}.py": source}))

    def __exit__(self, *exc) -> None:
        self.browser.close()
        self._pw.stop()
        self.server.shutdown()
        self.server.server_close()


SHARED: list[BrowserSession] = []  # the one page of bench/one_page.py while it runs benchmarks in it


@contextmanager
def session(**kw):
    """A booted page at QUERY for one benchmark: the shared one when bench/one_page.py runs this benchmark
    (its server also serves the wllama harness), else a BrowserSession(QUERY, **kw) of the benchmark's own."""
    if SHARED:
        yield SHARED[0]
    else:
        with BrowserSession(QUERY, **kw) as s:
            yield s
