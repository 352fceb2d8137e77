"""The disk tier's flush in the chat page (tiny model, CPU path, OPFS `kv/`), with two tabs of the origin sharing
the directory: the page leaving (pagehide) posts `flush-disk`, and every full block of the chat's turns is on disk
afterwards, also the files the other tab deleted meanwhile; a reload then restores all of them."""
from __future__ import annotations

import json

from browser_pages import open_app
from test_kv_disk_page import REMOVE_KV, reload, settled_memory, turn

QUERY = "?model=tiny-random&backend=cpu"

# Block files only: not the LRU order (<key>.lru) nor a write's swap file in flight (<name>.crswap).
BLOCK_FILES = """async () => {
  const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("kv");
  const names = [];
  for await (const [name, handle] of dir.entries()) {
    if (/^[0-9a-f]{16}-[0-9a-f]{32}$/.test(name) && (await handle.getFile()).size) names.push(name);
  }
  return names.sort();
}"""

DELETE_FILES = """async (names) => {
  const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("kv");
  for (const name of names) await dir.removeEntry(name);
}"""


def flushed_after_pagehide(page) -> dict:
    """Dispatch pagehide (what a reload or a closed tab sends) and wait for the worker's `disk-flushed`."""
    before = page.evaluate("document.documentElement.dataset.diskFlushed || ''")
    page.evaluate("window.dispatchEvent(new PageTransitionEvent('pagehide', {persisted: false}))")
    for _ in range(600):
        raw = page.evaluate("document.documentElement.dataset.diskFlushed || ''")
        if raw and raw != before:
            return json.loads(raw)
        page.wait_for_timeout(100)
    raise AssertionError("no disk-flushed after pagehide")


def test_pagehide_flush_writes_every_full_block_also_what_another_tab_deleted(browser, base_url):
    context = browser.new_context()  # one profile: both tabs share the origin's OPFS and IndexedDB
    try:
        a, _ = open_app(context, base_url + QUERY, 60_000)
        a.page.evaluate(REMOVE_KV)  # nothing left from another test of this profile (none share it today)
        first = turn(a.page, "Hello there!", max_tokens=12)
        second = turn(a.page, "And then?", max_tokens=12)
        full = (second["history_tokens"] - 1) // 16  # every full block the two turns computed
        assert full >= 2
        files = a.page.evaluate(BLOCK_FILES)
        assert len(files) == full  # write-behind: on disk by the reply's end
        assert first["history_tokens"] < second["history_tokens"]

        b, _ = open_app(context, base_url + QUERY, 60_000)  # the second tab, its own disk tier over `kv/`
        b.page.evaluate(DELETE_FILES, files[::2])  # ... which deletes half of the first tab's files
        assert len(a.page.evaluate(BLOCK_FILES)) == full - len(files[::2])

        flushed = flushed_after_pagehide(a.page)
        assert flushed["written"] == len(files[::2])
        assert a.page.evaluate(BLOCK_FILES) == files  # every full block on disk again, the same files
        assert settled_memory(a.page, "disk_blocks", full)["disk_blocks"] == full
        assert flushed_after_pagehide(a.page)["written"] == 0  # nothing written twice
        assert flushed_after_pagehide(b.page)["written"] == 0  # the other tab follows: nothing of its own to write
        for tab in (a, b):
            assert "chatError" not in tab.dataset(), tab.dataset()["chatError"]

        b.page.close()
        reload(a.page)  # its pagehide flushes too: nothing is missing, so nothing is written
        third = turn(a.page, "Why?", max_tokens=4)
        assert third["cached_tokens"] == full * 16
        assert settled_memory(a.page, "restored", full * 16)["restored"] == full * 16  # the panel follows the turn
        a.page.evaluate(REMOVE_KV)
    finally:
        context.close()
