"""The disk tier in the chat page (tiny model, OPFS): chat, reload, and the next turn restores the history's
blocks from disk instead of prefilling them, replying exactly what a page without the disk tier replies; a
corrupted block file is detected and recomputed (on the CPU path). On WebGPU and on the CPU path (?backend=cpu)."""
from __future__ import annotations

import json
import re

import pytest

from browser_pages import open_app, show_settings

CORRUPT_ALL = """async () => {
  const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("kv");
  let n = 0;
  for await (const [name, handle] of dir.entries()) {
    // Block files only: not the LRU order (<key>.lru) nor a write's swap file in flight (<name>.crswap).
    if (!/^[0-9a-f]{16}-[0-9a-f]{32}$/.test(name)) continue;
    const data = new Uint8Array(await (await handle.getFile()).arrayBuffer());
    data[data.length - 1] ^= 0x40;  // one bit of the payload's last byte
    const w = await handle.createWritable();
    await w.write(data);
    await w.close();
    n += 1;
  }
  return n;
}"""


# The origin's OPFS outlives a page (and a failed test): every run starts and ends without block files.
# A file the page's disk tier is writing (a writable open: its write-behind, its LRU index) refuses removal until
# the write closes: tried again then, for at most 5 s (the CPU busy beside the browser once made a test's last
# cleanup meet the index write of its last turn).
REMOVE_KV = """async () => {
  for (let tries = 1; ; tries++) {
    try { await (await navigator.storage.getDirectory()).removeEntry("kv", {recursive: true}); return; }
    catch (err) {
      if (err.name === "NotFoundError") return;
      if (err.name !== "NoModificationAllowedError" || tries === 100) throw err;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}"""


def memory(page) -> dict:
    return json.loads(page.evaluate("document.documentElement.dataset.memory || 'null'") or "null")


def turn(page, text: str, max_tokens: int = 8) -> dict:
    previous = page.evaluate("document.documentElement.dataset.lastTurn || ''")
    page.fill("#set-max-tokens", str(max_tokens))
    page.fill("#set-temperature", "0")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    for _ in range(3000):  # poll: the page's CSP forbids wait_for_function's eval
        raw = page.evaluate("document.documentElement.dataset.lastTurn || ''")
        if raw != previous:
            return json.loads(raw)
        page.wait_for_timeout(100)
    raise AssertionError("no turn ended")


def settled_memory(page, key: str, want) -> dict:
    """The panel once `key` reads `want` (snapshots follow the turn's end by a moment)."""
    for _ in range(100):
        mem = memory(page)
        if mem is not None and mem[key] == want:
            return mem
        page.wait_for_timeout(100)
    return memory(page)


def changed_memory(page, key: str, old) -> dict:
    """The panel once `key` no longer reads `old` (the snapshot after a turn's end)."""
    for _ in range(100):
        mem = memory(page)
        if mem is not None and mem[key] != old:
            return mem
        page.wait_for_timeout(100)
    raise AssertionError(f"the memory panel's {key} stayed {old}")


def reload(page) -> None:
    page.reload()
    page.wait_for_selector("html[data-model=ready][data-restored]", state="attached", timeout=240_000)
    show_settings(page)


TURNS = ("Hello there!", "And then?", "Why?")


# The check of block files is the disk tier's, whatever the backend: the corruption half runs on the CPU path.
@pytest.mark.parametrize("query,corrupt", [("?model=tiny-random&backend=webgpu", False),
                                           ("?model=tiny-random&backend=cpu", True)])
def test_reload_restores_from_disk_and_replies_the_same(browser, base_url, query, corrupt):
    # never reloads, no disk tier; a 1 MiB CPU tier for swapped chats (?cpu_mib=, the memory setting)
    ref, _ = open_app(browser, base_url + query + "&kv_disk=0&cpu_mib=1", 60_000)
    refs, prefilled = [], [0]  # the turns, and the engine's prefill counter after each
    for text in TURNS if corrupt else TURNS[:2]:
        refs.append(turn(ref.page, text))
        prefilled.append(changed_memory(ref.page, "prefill_tokens", prefilled[-1])["prefill_tokens"])
    facts = ref.page.locator("#memory-facts").inner_text()
    assert "off (?kv_disk=0)" in facts
    per_token = int(re.search(r"([\d,]+) B \(", facts).group(1).replace(",", ""))  # "KV bytes / token"
    cpu_blocks = (1 << 20) // (16 * per_token)
    assert (memory(ref.page)["cpu_blocks"], memory(ref.page)["cpu_used"], memory(ref.page)["cpu_cached"]) == \
        (cpu_blocks, 0, 0)
    assert f"0 of {cpu_blocks} blocks (0 swapped, 0 cached)" in facts
    ref.page.evaluate(REMOVE_KV)  # this page has no disk tier: nothing holds the directory
    ref.page.close()

    booted, _ = open_app(browser, base_url + query, 60_000)
    page = booted.page
    first = turn(page, "Hello there!")
    assert first["content"] == refs[0]["content"] and first["cached_tokens"] == 0
    on_disk = (first["history_tokens"] - 1) // 16  # every full block the first turn computed
    # the page's tier writes once the engine is idle, not in the reply's steps (kv/disk_cache.py)
    assert booted.py("import json\nfrom pagedkv_app.main import state\n"
                     "json.dumps(state['engine'].lane().disk.background)") is True
    assert settled_memory(page, "disk_blocks", on_disk)["disk_blocks"] == on_disk > 0
    reload(page)
    second = turn(page, "And then?")
    assert second["content"] == refs[1]["content"]
    mem = settled_memory(page, "restored", on_disk * 16)
    assert second["cached_tokens"] == mem["restored"] == on_disk * 16
    prompt_tokens = prefilled[2] - prefilled[1] + refs[1]["cached_tokens"]  # turn 2's prompt
    assert mem["prefill_tokens"] == prompt_tokens - on_disk * 16
    assert f"{on_disk * 16} tokens (last turn)" in page.locator("#memory-facts").inner_text()

    if corrupt:
        # the second turn's own full blocks too: the snapshot above may precede the last one's write
        written = (second["history_tokens"] - 1) // 16
        assert settled_memory(page, "disk_blocks", written)["disk_blocks"] == written
        corrupt_files_are_recomputed(page, written, refs[2])
    page.evaluate(REMOVE_KV)
    page.close()


def corrupt_files_are_recomputed(page, disk_blocks: int, ref: dict) -> None:
    """Every block file corrupted: the next reload finds the first one bad and recomputes the whole history."""
    assert page.evaluate(CORRUPT_ALL) == disk_blocks
    reload(page)
    third = turn(page, TURNS[2])
    mem = settled_memory(page, "disk_corrupt", 1)
    assert (mem["disk_corrupt"], mem["restored"], third["cached_tokens"]) == (1, 0, 0)
    assert third["content"] == ref["content"]
    assert "payload fails its sha256 check; recomputing it" in page.locator("#memory-facts").inner_text()
