"""Per-tab engines against one engine per origin (issue 49's two designs), measured: what two tabs of the chat cost
and how fast a turn reaches the other tab, and the SharedWorker facts that rule out one shared engine in Chromium.

    python3 -m bench.tab_engines [--turns N]

- Two tabs of the app (the tiny model, WebGPU, a 16 MiB budget: harness.soak.MODEL_QUERY) on one chat: each tab's
  GPU ledger (its own weights and KV pool: per-tab engines hold two of each), and for each of N turns sent in tab
  a the time from a's turn-end to tab b showing the reply (store.js writes the record and announces it on a
  BroadcastChannel; b reads it from IndexedDB and renders it), stamped in each page on the same clock
  (performance.timeOrigin + now()).
- A probe page (bench/tab_probe/, served with the app's COOP/COEP/CSP headers): what a SharedWorker and a dedicated
  Worker can use (cross-origin isolation, SharedArrayBuffer, a nested Worker, a WebGPU adapter and device), and a
  bare BroadcastChannel message's delivery time between two pages.

Prints JSON (bench/results/tab_engines.json). Figures of this machine's Chromium (SwiftShader WebGPU).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import serve
from bench import emit
from harness.page import BrowserSession, open_and_boot, serve_dist, wait_model
from harness.soak import MODEL_QUERY

PROBE = Path(__file__).resolve().parent / "tab_probe"
# The tab's GPU ledger (gpu_budget.GpuLedger.snapshot: its engine's buffers, by kind), read in its worker.
LEDGER = """
import json
from pagedkv_app.main import state
json.dumps(state["service"].ledger_snapshot())
"""
STAMP_TURN_ENDS = """() => {
  window.benchTurnEnds = [];
  new MutationObserver(() => window.benchTurnEnds.push([performance.timeOrigin + performance.now(),
                                                        document.documentElement.dataset.lastTurn]))
    .observe(document.documentElement, { attributes: true, attributeFilter: ["data-last-turn"] });
}"""
STAMP_SHOWN = """() => {
  window.benchShown = [];
  const box = document.getElementById("messages");
  new MutationObserver(() => {
    const msgs = box.querySelectorAll(".msg");
    const last = msgs[msgs.length - 1];
    window.benchShown.push([performance.timeOrigin + performance.now(), msgs.length,
                            last && !last.classList.contains("pending") ? last.dataset.text || "" : null]);
  }).observe(box, { childList: true, subtree: true, attributes: true, characterData: true });
}"""


def summary(ms: list[float]) -> dict:
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1),
            "max_ms": round(max(ms), 1)}


def wait(page, expr: str, timeout_s: float = 120.0):
    """Poll a page expression until it is truthy (the page's CSP forbids wait_for_function's eval)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = page.evaluate(expr)
        if value:
            return value
        page.wait_for_timeout(20)
    raise AssertionError(f"never: {expr}")


def two_tabs(session: BrowserSession, turns: int) -> dict:
    a = session.page
    b = open_and_boot(session.context, session.url, session.TIMEOUT_MS)
    wait_model(b, session.TIMEOUT_MS)
    b = b.page
    ledgers = [json.loads(tab.evaluate("code => window.pagedkv.exec(code)", LEDGER)) for tab in (a, b)]
    chat = a.evaluate("document.documentElement.dataset.chat")
    b.locator(f'#chat-list button[data-chat="{chat}"]').click()
    b.wait_for_selector(f'html[data-chat="{chat}"]', state="attached")
    a.evaluate(STAMP_TURN_ENDS)
    b.evaluate(STAMP_SHOWN)
    if not a.locator("#settings[open]").count():
        a.locator("#settings summary").click()
    a.fill("#set-max-tokens", "4")
    a.fill("#set-temperature", "0")
    delivered = []
    for k in range(turns):
        a.fill("#prompt", f"turn {k}: tell me about the sea")
        a.press("#prompt", "Enter")
        ended = wait(a, f"window.benchTurnEnds.length > {k} && window.benchTurnEnds[{k}]")
        content = json.loads(ended[1])["content"]
        shown = wait(b, f"window.benchShown.find(([t, n, text]) => n >= {2 * (k + 1)} && "
                        f"text === {json.dumps(content)})")
        delivered.append(shown[0] - ended[0])
    return {"ledger_bytes": [ledger["used_bytes"] for ledger in ledgers],
            "ledger_by_kind": [ledger["by_kind"] for ledger in ledgers],
            "turn_delivery": summary(delivered), "turn_delivery_ms": [round(x, 1) for x in delivered]}


def probe(browser, messages: int) -> dict:
    with serve_dist(lambda host, port: serve.make_server(host, port, dist=PROBE)) as origin:
        context = browser.new_context()
        try:
            sender, listener = context.new_page(), context.new_page()
            listener.goto(origin + "/index.html?role=listen")
            wait(listener, "document.documentElement.dataset.listening")
            sender.goto(origin + "/index.html")
            facts = json.loads(wait(sender, "document.documentElement.dataset.facts || ''", 60))
            for i in range(messages):
                sender.evaluate("window.probeSend(1)")
                wait(listener, f"JSON.parse(document.documentElement.dataset.received || '[]').length > {i}")
            got = json.loads(listener.evaluate("document.documentElement.dataset.received"))
        finally:
            context.close()
    return {"facts": facts, "broadcast_delivery": summary(got)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--messages", type=int, default=50, help="bare BroadcastChannel messages timed")
    args = parser.parse_args(argv)
    with BrowserSession(MODEL_QUERY) as session:
        result = {"benchmark": "tab_engines", "query": MODEL_QUERY, "two_tabs": two_tabs(session, args.turns),
                  **probe(session.browser, args.messages)}
    emit(result, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
