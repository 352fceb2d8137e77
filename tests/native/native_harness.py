"""The native runner of the browser tests: NativeWorker runs the page's Python snippets in this process, and
browser_tests() hands a tests/native module the test functions and fixtures of a tests/browser module."""
from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import json
import sys
import threading
from pathlib import Path

from _pytest.fixtures import getfixturemarker

BROWSER_TESTS = Path(__file__).resolve().parent.parent / "browser"
if str(BROWSER_TESTS) not in sys.path:
    sys.path.insert(0, str(BROWSER_TESTS))  # the cases import each other by module name, as in the page
BROWSER_ONLY = {"browser", "browser_without_webgpu", "base_url"}  # fixtures of tests that drive the page's UI


class LoopThread:
    """An asyncio loop running in a thread of its own; run(coro) waits for the coroutine's result there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="native-loop", daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class NativeWorker:
    """Runs code as the page's worker does (Pyodide's runPythonAsync): top-level await allowed, globals kept
    between calls, the last expression's value returned, JSON-decoded when it is JSON text."""

    def __init__(self, loop: "LoopThread") -> None:
        self.loop = loop
        self.globals: dict = {"__name__": "native_worker"}

    def py(self, code: str, timeout_ms: int | None = None):
        tree = ast.parse(code)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT

        async def run():
            body = eval(compile(ast.Module(tree.body, []), "<worker>", "exec", flags=flags), self.globals)
            if inspect.iscoroutine(body):
                await body
            if last is None:
                return None
            value = eval(compile(ast.Expression(last.value), "<worker>", "eval", flags=flags), self.globals)
            return await value if inspect.iscoroutine(value) else value

        value = self.loop.run(run())
        return json.loads(value) if isinstance(value, str) else value

    def install_test_modules(self, *names: str) -> "NativeWorker":
        """What the harness's install_test_modules does in the page: tests/browser/<name>.py, freshly read,
        importable as the module `name`."""
        for name in names:
            load_browser_module(name)
        return self


def load_browser_module(name: str):
    """tests/browser/<name>.py, read afresh and registered as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, BROWSER_TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def browser_module(name: str):
    """tests/browser/<name>.py, once per process: pytest may have imported it already when it collected
    tests/browser."""
    module = sys.modules.get(name)
    if module is not None and Path(module.__file__).parent == BROWSER_TESTS:
        return module
    return load_browser_module(name)


def browser_tests(name: str, *, except_: tuple[str, ...] = ()) -> dict:
    """The test functions and module fixtures of tests/browser/<name>.py for a native module's globals:
    all but those needing the browser's UI fixtures and the ones named in except_ (replaced natively)."""
    module = browser_module(name)
    out = {}
    for attr, value in vars(module).items():
        if attr.startswith("test_") and attr not in except_:
            if not BROWSER_ONLY & set(inspect.signature(value).parameters):
                out[attr] = value
        elif getfixturemarker(value) is not None:
            out[attr] = value
    return out
