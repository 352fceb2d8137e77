"""The native runner of the browser tests: NativeWorker runs the page's Python snippets in this process, and
browser_tests() hands a tests/native module the test functions and fixtures of a tests/browser module."""
from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import json
import sys
from pathlib import Path

from _pytest.fixtures import getfixturemarker

BROWSER_TESTS = Path(__file__).resolve().parent.parent / "browser"
if str(BROWSER_TESTS) not in sys.path:
    sys.path.insert(0, str(BROWSER_TESTS))  # the cases import each other by module name, as in the page
BROWSER_ONLY = {"browser", "browser_without_webgpu", "base_url"}  # fixtures of tests that drive the page's UI


class NativeWorker:
    """Runs code as the page's worker does (Pyodide's runPythonAsync): top-level await allowed, globals kept
    between calls, the last expression's value returned, JSON-decoded when it is JSON text."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
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

        value = self.loop.run_until_complete(run())
        return json.loads(value) if isinstance(value, str) else value

    def install_test_modules(self, *names: str) -> "NativeWorker":
        """What the harness's install_test_modules does in the page: tests/browser/<name>.py, freshly read,
        importable as the module `name`."""
        for name in names:
            spec = importlib.util.spec_from_file_location(name, BROWSER_TESTS / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        return self


def browser_module(name: str):
    """tests/browser/<name>.py, imported against tests/browser/conftest.py (which its `from conftest import`
    means), once per process: pytest may have imported it already when it collected tests/browser."""
    module = sys.modules.get(name)
    if module is not None and Path(module.__file__).parent == BROWSER_TESTS:
        return module
    spec = importlib.util.spec_from_file_location("conftest", BROWSER_TESTS / "conftest.py")
    browser_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(browser_conftest)
    saved = sys.modules.get("conftest")
    sys.modules["conftest"] = browser_conftest
    try:
        spec = importlib.util.spec_from_file_location(name, BROWSER_TESTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["conftest"]
        else:
            sys.modules["conftest"] = saved
    return module


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
