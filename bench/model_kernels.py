"""Model kernel timings in headless Chromium with WebGPU: streaming-read bandwidth of the adapter and the
fused-dequant matvec / tiled matmul at SmolLM2-135M shapes (median of several runs).

    python3 -m bench.model_kernels [--runs 5] [--repeats 5]

Prints JSON; writes bench/results/model_kernels.json. A figure, never a pass/fail.
The measuring code is pagedkv.backends.webgpu_ops.bench_model_kernels, run inside the page's worker.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import build

RESULTS = Path(__file__).resolve().parent / "results"


def measure(runs: int, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    build.build()
    server = build.make_server("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    code = (
        "import json\n"
        "from pagedkv.backends.webgpu import GpuContext\n"
        "from pagedkv.backends.webgpu_ops import bench_model_kernels\n"
        f"json.dumps(await bench_model_kernels(await GpuContext.create(), runs={runs}, repeats={repeats}))"
    )
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=build.find_chromium(),
                                         args=build.BASE_ARGS + build.WEBGPU_ARGS, headless=True)
            page = browser.new_page()
            page.goto(url)
            page.wait_for_selector("html[data-state=ready]", state="attached", timeout=300_000)
            text = page.evaluate("(code) => window.pagedkv.exec(code)", code)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    result = json.loads(text)
    result.update({"benchmark": "model_kernels", "chromium": build.find_chromium(),
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result = measure(args.runs, args.repeats)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "model_kernels.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
