"""A full storage quota (CDP Storage.overrideQuotaForOrigin) never hangs the page: before boot the model loads,
the chats are kept in the tab with a note naming the quota, and the disk tier is off saying why; after boot
the disk tier stops with a note and every turn still ends. Neither raises an uncaught error in the page (the
browser's QuotaExceededError once reached a Pyodide future: "TypeError: invalid exception object")."""
from __future__ import annotations

import json
import time

from browser_pages import BOOT_TIMEOUT_MS, show_settings

QUERY = "?model=tiny-random&backend=cpu"
QUOTA_BYTES = 30_000  # the figure: less than one KV block file of the tiny model


def squeeze(context, page, origin: str) -> None:
    context.new_cdp_session(page).send("Storage.overrideQuotaForOrigin", {"origin": origin, "quotaSize": QUOTA_BYTES})


def dataset(page) -> dict:
    return page.evaluate("({...document.documentElement.dataset})")


def turn(page, text: str) -> dict:
    previous = dataset(page).get("lastTurn")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        last = dataset(page).get("lastTurn")
        if last and last != previous:
            return json.loads(last)
        time.sleep(0.05)
    raise AssertionError(f"the turn never ended: {dataset(page)}")


def open_squeezed(browser, base_url, before: bool):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(BOOT_TIMEOUT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    origin = base_url.rstrip("/")
    if before:
        squeeze(context, page, origin)
    page.goto(base_url + QUERY)
    page.wait_for_selector("html[data-model=ready], html[data-model=error]", state="attached")
    if not before:
        squeeze(context, page, origin)
    show_settings(page)
    page.fill("#set-max-tokens", "4")
    # Greedy: the page's default temperature samples, and a sampled end-of-text cut a 4-token turn to 1 under load
    page.fill("#set-temperature", "0")
    return context, page, errors


def test_a_full_quota_before_boot_loads_the_model_and_says_which_stores_are_full(browser, base_url):
    context, page, errors = open_squeezed(browser, base_url, before=True)
    try:
        data = dataset(page)
        assert data["model"] == "ready", page.locator("#model-detail").inner_text()
        kv_disk = json.loads(data["modelInfo"])["kv_disk"]
        assert kv_disk == ("off: QuotaExceededError: the browser's storage quota for this site is full (opening kv): "
                           "remove saved models or chats to free it")
        page.wait_for_selector("html[data-store=full]", state="attached", timeout=30_000)
        notice = page.locator("#save-notice").inner_text()
        assert notice.startswith("Chats are kept in this tab only, not saved: the browser's storage quota for this "
                                 "site is full (IndexedDB: ") and "Remove saved models" in notice
        first = turn(page, "hello")
        assert first["reason"] == "length" and first["tokens"] == 4
        second = turn(page, "again")
        assert second["reason"] == "length" and second["tokens"] == 4
        assert errors == []
    finally:
        context.close()


def test_a_full_quota_after_boot_stops_the_disk_tier_with_a_note_and_chats_go_on(browser, base_url):
    context, page, errors = open_squeezed(browser, base_url, before=False)
    try:
        assert turn(page, "hello")["tokens"] == 4
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the tier writes after the turn, is refused, then notes it
            memory = json.loads(dataset(page).get("memory") or "{}")
            if memory.get("disk_note"):
                break
            time.sleep(0.1)
        note = memory.get("disk_note") or ""
        assert note.startswith("disk full (QuotaExceededError: the browser's storage quota for this site is full "
                               "(creating "), note
        assert note.endswith("): remove saved models or chats to free it); KV on disk capped at 0 bytes, the rest is "
                             "recomputed after a reload"), note
        assert memory["disk_blocks"] == 0
        assert turn(page, "and again")["tokens"] == 4
        assert errors == []
    finally:
        context.close()
