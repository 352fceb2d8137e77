"""Run browser benchmarks one after another in one headless Chromium page: what `python3 -m bench` does with
them, so that the page boots (Pyodide, packages, the app's tiny model) once per run instead of once each.

    python3 -m bench.harness.one_page '[["roofline", ["bench.roofline", "--quick"], PREVIOUS_JSON_PATH], ...]'

Each benchmark's main(argv) runs in this process with bench.harness.session() handing it the shared page,
whose server also serves the wllama harness. Every benchmark frees what it put on the GPU before it returns.
Prints one JSON line per benchmark: {"name", "result" (the JSON the benchmark printed) or "error", "wall_s"}.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import time
import traceback

# Before numpy loads: the CPU columns of ttft and wllama use one BLAS thread, as when each runs alone.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from bench import PREVIOUS_ENV  # noqa: E402
from bench.harness import SHARED, QUERY  # noqa: E402
from harness.page import BrowserSession  # noqa: E402


def run(jobs: list[tuple[str, list[str], str]]) -> None:
    from bench.wllama import make_server  # dist/ plus the wllama harness under /bench/

    with BrowserSession(QUERY, make_server=make_server) as page:
        SHARED.append(page)
        try:
            for name, (module, *argv), previous in jobs:
                t0 = time.perf_counter()
                os.environ[PREVIOUS_ENV] = previous
                out = io.StringIO()
                try:
                    with contextlib.redirect_stdout(out):
                        importlib.import_module(module).main(argv)
                    text = out.getvalue()
                    line = {"name": name, "result": json.loads(text[text.index("{"):])}
                except (Exception, SystemExit):  # noqa: BLE001  (reported; the other benchmarks still run)
                    line = {"name": name, "error": traceback.format_exc()[-4000:]}
                line["wall_s"] = round(time.perf_counter() - t0, 2)
                print(json.dumps(line), flush=True)
        finally:
            SHARED.clear()


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
