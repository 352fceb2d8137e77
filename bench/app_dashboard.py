"""The chat app in headless Chromium: dashboard overhead on decode speed, and a screenshot mid-conversation.

    python3 -m bench.app_dashboard [--model tiny-random] [--backend cpu] [--tokens 96] [--rounds 3]

Decode tok/s through the app's own chat service with the memory dashboard on
(a snapshot posted every 0.5 s, rendered by the page) and off, after one
warm-up run, in alternating order for `--rounds` rounds; then two chats answer at once and the page is captured.
Prints JSON, the screenshot in it as a file (`python3 -m bench` writes it next to app_dashboard.json as
app_screenshot.png).
"""
from __future__ import annotations

import argparse
import base64
import json
import statistics

from bench import emit
from harness.page import BrowserSession


MEASURE = """
import json, time
import pagedkv_app.chat_service as cs
from pagedkv_app.main import state
svc = state["service"]
cs.STATS_INTERVAL_S = {interval}
chat = svc.open_session("bench")
t0 = time.perf_counter()
svc.send(chat.session_id, "Write a short story about a robot learning to paint.", {{"temperature": 0, "max_tokens": {tokens}}})
await svc._loop_task
elapsed = time.perf_counter() - t0
svc.forget_session(chat.session_id)
cs.STATS_INTERVAL_S = 0.5
json.dumps({{"seconds": elapsed}})
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--backend", default="cpu", choices=("cpu", "webgpu"))
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="--rounds 1 --tokens 32")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.tokens = 1, 32
    on, off = [], []
    with BrowserSession(f"?model={args.model}&backend={args.backend}") as s:
        s.page.set_viewport_size({"width": 1400, "height": 900})
        s.py(MEASURE.format(interval=0.5, tokens=args.tokens))  # warm-up (first-run caches), not counted
        for r in range(args.rounds):
            order = ((0.5, on), (1e9, off)) if r % 2 == 0 else ((1e9, off), (0.5, on))
            for interval, sink in order:
                secs = s.py(MEASURE.format(interval=interval, tokens=args.tokens))["seconds"]
                sink.append(args.tokens / secs)
        # A picture of two chats answering at once, with the block map.
        s.page.locator("#settings summary").click()
        s.page.fill("#set-max-tokens", "230")
        for text in ("Tell me about the moon.", "List three colours."):
            s.page.locator("#new-chat").click()
            s.page.wait_for_timeout(100)
            s.page.fill("#prompt", text)
            s.page.press("#prompt", "Enter")
        s.page.wait_for_selector("#chat-list li:nth-last-child(1) button.busy", state="attached")
        for _ in range(1200):  # until the reply shows words and the block map shows the chats' blocks
            memory = json.loads(s.page.evaluate("document.documentElement.dataset.memory || 'null'") or "null")
            text = s.page.locator("#messages .msg.assistant").last.get_attribute("data-text") or ""
            if memory and memory["used"] > 0 and len(text) > 30:
                break
            s.page.wait_for_timeout(100)
        shot = s.page.screenshot(full_page=False)
    result = {
        "benchmark": "app_dashboard", "model": args.model, "backend": args.backend, "tokens": args.tokens,
        "decode_tok_s_dashboard_on": on, "decode_tok_s_dashboard_off": off,
        "median_on": statistics.median(on), "median_off": statistics.median(off),
        "overhead_pct": round(100 * (1 - statistics.median(on) / statistics.median(off)), 2),
        "screenshot": "app_screenshot.png", "files": {"app_screenshot.png": base64.b64encode(shot).decode()},
    }
    emit(result, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
