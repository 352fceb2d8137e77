"""Run files of web/ under Node for a CPython test: a module fixture copies them into a directory of their own with
a runner script (an ES module, `run.mjs`), and `run(*args)` runs it and returns the JSON it printed."""
from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable

import pytest

import build


def node_runner(tmp_path_factory, web_files: list[str], runner: str, *, npm_page_files: bool = False,
                timeout_s: float = 60) -> Callable[..., object]:
    """`run(*args)`: `node run.mjs *args` beside copies of `web_files` (and, with npm_page_files, the npm files
    build.py ships to the page); what it printed, parsed as JSON. Fails the test when node is not on PATH."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH (npm test needs it anyway)", pytrace=False)
    page = tmp_path_factory.mktemp("node")
    for name in web_files:
        shutil.copy(build.ROOT / "web" / name, page / name)
    if npm_page_files:
        build.copy_npm_page_files(build.NODE_MODULES, page)
    (page / "package.json").write_text('{"type": "module"}\n')
    (page / "run.mjs").write_text(runner)

    def run(*args: str):
        out = subprocess.run([node, "run.mjs", *args], cwd=page, capture_output=True, text=True, timeout=timeout_s,
                             check=True)
        return json.loads(out.stdout)
    return run
