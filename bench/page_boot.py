"""Page boot time to `ready` in headless Chromium with WebGPU: cold (fresh profile) and warm (reload).

    python3 -m bench.page_boot [--runs 3] [--json]

Prints JSON; writes bench/results/page_boot.json. A figure, never a pass/fail.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import serve
from bench import emit
from harness.chromium import BASE_ARGS, WEBGPU_ARGS, find_chromium
from harness.page import ensure_built



def _boot_ms(page) -> float:
    page.wait_for_selector("html:not([data-state=booting])", state="attached", timeout=300_000)
    state = page.evaluate("document.documentElement.dataset.state")
    if state != "ready":
        raise RuntimeError(f"page ended in state {state}: {page.evaluate('document.documentElement.dataset.error')}")
    return float(page.evaluate("document.documentElement.dataset.bootMs"))


def measure(runs: int) -> dict:
    from playwright.sync_api import sync_playwright

    ensure_built()
    server = serve.make_server("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    cold, warm = [], []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=find_chromium(),
                                         args=BASE_ARGS + WEBGPU_ARGS, headless=True)
            for _ in range(runs):
                context = browser.new_context()  # empty HTTP cache: a cold boot
                page = context.new_page()
                page.goto(url)
                cold.append(_boot_ms(page))
                page.reload()  # same context: files come from the HTTP cache (revalidated)
                warm.append(_boot_ms(page))
                context.close()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return {
        "benchmark": "page_boot",
        "runs": runs,
        "cold_ms": cold,
        "warm_ms": warm,
        "cold_median_ms": statistics.median(cold),
        "warm_median_ms": statistics.median(warm),
        "chromium": find_chromium(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print only the JSON")
    parser.add_argument("--quick", action="store_true", help="--runs 1")
    args = parser.parse_args()
    if args.quick:
        args.runs = 1
    result = measure(args.runs)
    emit(result, indent=2)


if __name__ == "__main__":
    main()
