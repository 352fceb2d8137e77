"""The disk tier durable soon enough, with the CPU busy (a busy loop in a second process beside the tab): a chat's
reply that ends while another chat streams is on disk while that stream still runs, not once the engine is idle
(tiny model, WebGPU on SwiftShader, OPFS `kv/`); a reload a moment later restores its blocks, so the next turn's prompt comes
from disk. A reply that leaves the engine idle is on disk soon enough that a reload the moment it ends restores
every block the engine computed."""
from __future__ import annotations

import json
import subprocess
import sys

from browser_pages import open_app
from test_kv_disk_page import REMOVE_KV, reload

QUERY = "?model=tiny-random&backend=webgpu"  # SwiftShader: steps slow enough that the other chat streams on
# The block files in `kv/` (none before the tier's first write makes the directory).
BLOCK_FILES = """async () => {
  let dir;
  try { dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("kv"); }
  catch (err) { if (err.name === "NotFoundError") return []; throw err; }
  const names = [];
  for await (const [name, handle] of dir.entries()) {
    if (/^[0-9a-f]{16}-[0-9a-f]{32}$/.test(name) && (await handle.getFile()).size) names.push(name);
  }
  return names;
}"""
LONG = "tell me everything about the sea, the ships, the ports, the fish and the storms of the winter"
MAX_TOKENS = 6  # the reply of the reload test (see there)


def send(page, text: str, max_tokens: int) -> None:
    page.fill("#set-max-tokens", str(max_tokens))
    page.fill("#set-temperature", "0")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def turn_end(page, previous: str) -> dict:
    """The next turn-end the page shows (its dataset.lastTurn; the page's CSP forbids wait_for_function's eval,
    so this polls the page's own event)."""
    for _ in range(4800):
        ended = page.evaluate("document.documentElement.dataset.lastTurn || ''")
        if ended != previous:
            return json.loads(ended)
        page.wait_for_timeout(25)
    raise AssertionError("no turn ended")


def new_chat(page) -> None:
    n = page.locator("#chat-list li").count()
    page.locator("#new-chat").click()
    page.wait_for_selector(f"#chat-list li:nth-child({n + 1}) button[aria-current=true]", state="attached")


def test_a_reply_that_ends_while_another_streams_is_on_disk_and_a_reload_restores_it(browser, base_url):
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the CPU busy beside the tab
    context = browser.new_context()  # its own OPFS
    try:
        booted, _ = open_app(context, base_url + QUERY, 120_000)
        page = booted.page
        page.evaluate(REMOVE_KV)
        new_chat(page)
        send(page, "count the waves", 220)  # the other chat: streams on (the tiny model's context is 256)
        page.wait_for_selector("#chat-list button.busy", state="attached")
        new_chat(page)
        previous = page.evaluate("document.documentElement.dataset.lastTurn || ''")
        send(page, LONG, 2)
        turn = turn_end(page, previous)
        full = (turn["history_tokens"] - 1) // 16  # the reply's full blocks: the engine computed all but its end
        assert full >= 3
        files = []
        while page.locator("#chat-list button.busy").count():  # ... while the other chat still streams
            files = page.evaluate(BLOCK_FILES)
            if len(files) >= full:
                break
            page.wait_for_timeout(25)
        # the ended reply's blocks are written first (DiskCache.write_slice): these are its `full` files
        assert len(files) >= full and page.locator("#chat-list button.busy").count() == 1
        chat = turn["chat"]
        reload(page)  # at once: the worker dies with the stream (its pagehide flush need not finish)
        page.locator(f"#chat-list button[data-chat='{chat}']").click()
        page.wait_for_selector(f"html[data-chat='{chat}']", state="attached")
        previous = page.evaluate("document.documentElement.dataset.lastTurn || ''")
        send(page, "and the gulls?", 2)
        after = turn_end(page, previous)
        assert after["chat"] == chat and after["cached_tokens"] == full * 16  # every full block, from disk
        page.evaluate(REMOVE_KV)
    finally:
        hog.kill()
        hog.wait()
        context.close()


def test_a_reload_the_moment_a_reply_ends_under_load_restores_every_block_it_computed(browser, base_url):
    """The engine idle at the reply's end (no other chat streams), the CPU busy, a reload the moment the page shows
    the turn-end: the next turn takes every full block the engine computed from disk. The reply's history ends with
    the template's closing (`<|im_end|>`, a newline), which no step computed: here it completes a block, so the
    history's full blocks are one more than the engine's, and that block is computed by the next turn's prefill."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    context = browser.new_context()
    try:
        booted, _ = open_app(context, base_url + QUERY, 120_000)
        page = booted.page
        page.evaluate(REMOVE_KV)
        previous = page.evaluate("document.documentElement.dataset.lastTurn || ''")
        send(page, LONG, MAX_TOKENS)
        turn = turn_end(page, previous)
        start = json.loads(page.evaluate("document.documentElement.dataset.lastStart"))
        # 74 prompt tokens and 6 generated: the engine computed 79 (all but the last sampled one), 4 full blocks;
        # the history adds the closing's 2 tokens after the 6: 82, whose first 81 tokens would be 5 blocks.
        assert (start["prompt_tokens"], turn["tokens"], turn["history_tokens"], turn["reason"]) == (74, 6, 82, "length")
        # At once: the pagehide flush need not finish before the worker dies. The turn-end came once the disk
        # writer had stored the reply's blocks (chat_service.DISK_SETTLE_S); before, a reload here under the hog
        # restored none of them.
        reload(page)
        previous = page.evaluate("document.documentElement.dataset.lastTurn || ''")
        send(page, "and the gulls?", 2)
        after = turn_end(page, previous)
        assert after["cached_tokens"] == 4 * 16  # every block the engine computed, from disk
        page.evaluate(REMOVE_KV)
    finally:
        hog.kill()
        hog.wait()
        context.close()
