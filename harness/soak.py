"""A soak of the chat page: seeded random Send / Stop / Regenerate / Delete / New chat / switch / reload on the tiny
model over a few chats, plus two Sends in one task (the second must stay in the box), a Delete the moment a reply
starts (its chat-saved then reaches the page after the delete), a reload the moment a reply ends, and three actions
of issue 49: two tabs on one chat sending at once, a full storage quota, and a reload under CPU load; then checks
that nothing was lost or left behind.

The three:
- two_tabs: a second tab (same browser context, so the same IndexedDB and OPFS) opens the chat in view, and both
  tabs press Enter at once. Both turns must reach the chat's record, and both tabs must show the record's messages;
  a turn missing from the record counts in `turns_lost`. The second tab is closed after.
- full_quota: the origin's quota is set to what it uses now (CDP Storage.overrideQuotaForOrigin with
  navigator.storage.estimate()'s usage), so a write that adds bytes may be refused, and a long turn is sent: it
  must end, with no error. Where a store was refused the page says which (the chats kept in this tab only,
  data-store=full, or the disk tier's note): counted in `full_quota_notes_shown`. The quota is then given back
  and the page reloaded, as its note asks; the chat's record must be exactly what it was before the quota filled
  where the page said the chats were not saved (that turn counts in `turns_unsaved_under_full_quota`, not as
  lost: the page said so), else what it was after the turn.
- reload_under_load: with a busy loop in a second process, a turn is sent and the page reloaded the moment it
  ends; the chat's next turn must take every full block the engine computed (computed_blocks: not the closing
  tokens the template adds after the reply) from the disk tier (`cached_tokens`), and each full block it does not
  counts in `disk_blocks_missed`.

Every action waits for its visible effect (a selector, the page-state dataset, an exec result), never for a
fixed time. Replies stream while the soak goes on: Stop, Delete and reload land mid-reply. At the end, with every
reply finished, it checks: page errors (pageerror events, console errors, the status line's chat errors, an
error state), for every chat the IndexedDB record's token history equal to the worker's conversation and its
messages equal to what the page shows (before and after a final reload), every chat the soak made and did not
delete listed after that reload (and no deleted one back), and the KV pool back at its free count (free +
cached-free blocks == total). tests/browser/test_soak.py runs its short form and asserts it clean;
bench/soak.py runs it as a benchmark (bench/results/soak.json).
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from urllib.parse import urlsplit

KINDS = ("send", "stop", "regenerate", "delete", "new_chat", "switch", "reload", "double_send", "delete_while_saving",
         "reload_after_reply", "two_tabs", "full_quota", "reload_under_load")
ISSUE_49 = ("two_tabs", "full_quota", "reload_under_load")  # each boots a second page or reloads
# The last three boot a page (a second tab, or a reload), as slow as a reload: as rare.
WEIGHTS = {"send": 40, "stop": 12, "regenerate": 10, "delete": 6, "new_chat": 8, "switch": 12, "reload": 3,
           "double_send": 6, "delete_while_saving": 4, "reload_after_reply": 2, "two_tabs": 2, "full_quota": 1,
           "reload_under_load": 2}
WORDS = ("hello", "tell", "me", "about", "the", "sea", "why", "café", "naïve", "🙂", "ok", "more", "stop", "and",
         "then", "blocks", "cache", "über", "日本", "x")
FULL_TOKENS = 190  # no send to a chat this long: the tiny model's context is 256 tokens
TWO_TURNS_TOKENS = 160  # no action of two short turns (two tabs, a reload between two) to a chat longer than this
# A full quota: the origin's quota set to what it uses now, so a write that adds bytes is refused (not always: see
# full_quota). Issue 49's fixed 30,000 bytes is more than a fresh context of the soak uses early on.
USAGE = "navigator.storage.estimate().then((e) => e.usage)"
BLOCK_SIZE = 16  # MODEL_QUERY's (the page's default ?block_size=)
# WebGPU, the tiny model, a 16 MiB GPU budget: ~3,900 KV blocks, room for every chat many times over. With the
# default 1 GiB the tiny model's pool has 262k blocks, and the memory panel's block map of them costs the worker
# 0.6 s every 0.5 s while a reply streams.
MODEL_QUERY = "?model=tiny-random&backend=webgpu&budget_mib=16"

# Read from the worker: each chat session's exact history and whether it is answering, and the KV pool's counts
# (a new chat has no session until its first message).
WORKER_STATE = """
import json
from pagedkv_app.main import state
_svc, _pool = state["service"], state["engine"].kv.pool
json.dumps({"chats": {c.session_id: {"ids": c.conversation.ids, "messages": c.conversation.messages,
                                     "busy": c.request_id is not None} for c in _svc.sessions.values()},
            "unfinished": state["engine"].has_unfinished,
            "pool": {"total": _pool.num_blocks, "free": _pool.num_free, "cached": _pool.num_cached}})
"""

READ_RECORDS = """() => new Promise((resolve, reject) => {
  const open = indexedDB.open("pagedkv", 1);
  open.onerror = () => reject(open.error);
  open.onsuccess = () => {
    const get = open.result.transaction("chats").objectStore("chats").getAll();
    get.onerror = () => reject(get.error);
    get.onsuccess = () => { open.result.close(); resolve(get.result); };
  };
})"""

# Two presses of Enter in one task of the page: no worker message (the first one's turn-start) lands between them.
TWO_QUICK_SENDS = """([first, second]) => {
  const box = document.getElementById("prompt");
  for (const text of [first, second]) {
    box.value = text;
    box.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
  }
}"""

# Delete the chat in view the moment its reply starts: the worker's chat-saved for that turn, posted right after its
# turn-start, reaches the page after the delete. confirm() is answered by the soak's dialog handler.
DELETE_WHEN_IT_STARTS = """(chat) => {
  const seen = window.soakDeleteWhenItStarts = new MutationObserver(() => {
    if (JSON.parse(document.documentElement.dataset.lastStart || "{}").chat !== chat) return;
    seen.disconnect();
    document.getElementById("delete-chat").click();
  });
  seen.observe(document.documentElement, { attributes: true, attributeFilter: ["data-last-start"] });
}"""

# One press of Enter in a tab (each tab's own page): two tabs sending as close together as two pages allow.
SEND_NOW = """(text) => {
  const box = document.getElementById("prompt");
  box.value = text;
  box.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
}"""

LIST_CHATS = "bs => bs.map(b => [b.dataset.chat, b.classList.contains('busy'), b.classList.contains('foreign')])"
SHOWN_MESSAGES = ("els => els.map(e => [e.classList.contains('user') ? 'user' : 'assistant', e.dataset.text || '',"
                  " e.classList.contains('pending')])")


class Soak:
    """One soak over a booted page of the app; `run` performs the actions, `check` reports what held."""

    def __init__(self, page, *, seed: int, chats: int, reload_every: int, timeout_ms: int,
                 boot_timeout_ms: int, kinds: tuple[str, ...] = KINDS) -> None:
        self.page, self.rng, self.max_chats, self.reload_every = page, random.Random(seed), chats, reload_every
        self.kinds = kinds
        self.reloaded_at = 0  # turns started at the last reload
        self.timeout_ms, self.boot_timeout_ms = timeout_ms, boot_timeout_ms
        page.set_default_timeout(timeout_ms)
        self.actions: Counter = Counter()
        self.seconds: Counter = Counter()  # wall time per action kind
        self.turns = self.stops_cut = 0
        self.turns_lost = self.unsaved_turns = self.disk_blocks = self.disk_missed = self.quota_said = 0
        self.errors: list[str] = []
        self.deleted: set[str] = set()
        self.created: set[str] = set()
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", lambda m: self.errors.append(f"console error: {m.text}") if m.type == "error" else None)

    # ------------------------------------------------------------------ reading the page

    def dataset(self) -> dict:
        return self.page.evaluate("Object.assign({}, document.documentElement.dataset)")

    def worker(self) -> dict:
        return json.loads(self.page.evaluate("code => window.pagedkv.exec(code)", WORKER_STATE))

    def listed(self) -> list[tuple[str, bool, bool]]:
        return [tuple(row) for row in self.page.eval_on_selector_all("#chat-list button", LIST_CHATS)]

    def shown(self) -> list[list]:
        return self.page.eval_on_selector_all("#messages .msg", SHOWN_MESSAGES)

    def records(self) -> dict:
        return {rec["id"]: rec for rec in self.page.evaluate(READ_RECORDS)}

    def poll(self, ready, what: str, timeout_ms: int | None = None):
        """Poll `ready()` until it returns something truthy; AssertionError naming `what` after the timeout."""
        deadline = time.monotonic() + (timeout_ms or self.timeout_ms) / 1000
        while True:
            value = ready()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"soak: timed out waiting for {what}")
            self.page.wait_for_timeout(20)

    def note_errors(self) -> None:
        """Collect a chat error from the status line (then clear its dataset key, so a repeat is seen) and an
        error state of the page or its model."""
        data = self.dataset()
        if "chatError" in data:
            self.errors.append(f"chat error: {data['chatError']}")
            self.page.evaluate("delete document.documentElement.dataset.chatError")
        if data.get("state") == "error" or data.get("model") == "error":
            raise AssertionError(f"soak: the page is in an error state: {data.get('error') or data}")

    # ------------------------------------------------------------------ actions

    def feasible(self, worker: dict) -> list[str]:
        listed = self.listed()
        current = self.dataset().get("chat")
        fresh = {"ids": [], "messages": [], "busy": False}  # a listed chat without a session: no message yet
        mine = worker["chats"].get(current, fresh if any(cid == current for cid, _, _ in listed) else None)
        idle_here = mine is not None and not mine["busy"]
        room = idle_here and len(mine["ids"]) < FULL_TOKENS
        last = mine["messages"][-1]["role"] if mine and mine["messages"] else None
        kinds = {"send": room, "stop": any(c["busy"] for c in worker["chats"].values()),
                 "regenerate": room and last == "assistant" and not self.page.locator("#regenerate").is_disabled(),
                 "delete": len(listed) > 1, "new_chat": len(listed) < self.max_chats, "switch": len(listed) > 1,
                 "reload": self.turns - self.reloaded_at >= self.reload_every, "double_send": room,
                 "delete_while_saving": room and len(listed) > 1,
                 "reload_after_reply": room and self.turns - self.reloaded_at >= self.reload_every}
        two_room = idle_here and len(mine["ids"]) < TWO_TURNS_TOKENS
        slow = self.turns - self.reloaded_at >= self.reload_every
        kinds["two_tabs"] = two_room and bool(mine["messages"]) and slow  # a saved turn: both tabs open one chat
        kinds["full_quota"] = room and slow
        kinds["reload_under_load"] = two_room and slow
        return [k for k in self.kinds if kinds[k]]

    def choose(self, kinds: list[str]) -> str:
        never = [k for k in kinds if not self.actions[k]]  # every kind early, so a short soak covers them all
        if never:
            return self.rng.choice(never)
        return self.rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]

    def fill_settings(self, long: bool, page=None) -> None:
        page = page or self.page
        if not page.locator("#settings[open]").count():
            page.locator("#settings summary").click()
        page.fill("#set-max-tokens", str(self.rng.randint(40, 80) if long else self.rng.randint(1, 10)))
        page.fill("#set-temperature", str(self.rng.choice((0, 0.7, 1.1))))
        page.fill("#set-seed", str(self.rng.randrange(1000)))

    def start_turn(self, trigger) -> None:
        """Trigger a reply and wait for its turn-start (or a refusal, noted as an error)."""
        before = self.dataset().get("lastStart")
        trigger()
        self.poll(lambda: self.dataset().get("lastStart") != before or "chatError" in self.dataset(), "a reply to start")
        if self.dataset().get("lastStart") != before:
            self.turns += 1

    def words(self) -> str:
        return " ".join(self.rng.choices(WORDS, k=self.rng.randint(1, 5))) + self.rng.choice(("", ".", "?", "!"))

    def send(self) -> None:
        self.fill_settings(long=self.rng.random() < 0.4)
        self.page.fill("#prompt", self.words())
        self.start_turn(lambda: self.page.press("#prompt", "Enter"))

    def double_send(self) -> None:
        """A second Send before the first reply starts: the first is answered, the second stays in the box."""
        self.fill_settings(long=self.rng.random() < 0.4)
        first, second = self.words(), self.words() + " again"
        self.start_turn(lambda: self.page.evaluate(TWO_QUICK_SENDS, [first, second]))
        box = self.page.input_value("#prompt")
        if box != second:
            self.errors.append(f"double send: the box holds {box!r}, not the second text {second!r}")
        self.page.fill("#prompt", "")

    def delete_while_saving(self) -> None:
        """Send, and delete the chat the moment its reply starts (before its chat-saved arrives)."""
        target = self.dataset()["chat"]
        self.fill_settings(long=self.rng.random() < 0.4)
        self.page.fill("#prompt", self.words())
        self.page.evaluate(DELETE_WHEN_IT_STARTS, target)
        accept = lambda d: d.accept()  # noqa: E731
        self.page.once("dialog", accept)
        turns = self.turns
        self.start_turn(lambda: self.page.press("#prompt", "Enter"))
        if self.turns == turns:  # refused (an error already noted): nothing to delete
            self.page.evaluate("window.soakDeleteWhenItStarts.disconnect()")
            self.page.remove_listener("dialog", accept)
            return
        self.page.wait_for_selector(f'#chat-list button[data-chat="{target}"]', state="detached")
        self.deleted.add(target)
        self.created.discard(target)

    def regenerate(self) -> None:
        self.fill_settings(long=self.rng.random() < 0.4)
        self.start_turn(lambda: self.page.locator("#regenerate").click())

    def stop(self, worker: dict) -> None:
        busy = sorted(cid for cid, c in worker["chats"].items() if c["busy"])
        target = self.rng.choice(busy)
        self.select(target)
        # force: the reply may have ended since; then the click lands on a disabled button and does nothing.
        self.page.locator("#stop").click(force=True)
        self.poll(lambda: not self.worker()["chats"].get(target, {}).get("busy"), f"{target} to stop")
        self.poll(lambda: not any(busy and cid == target for cid, busy, _ in self.listed()), f"{target} shown idle")
        if "interrupted" in (self.page.locator("#messages .msg").last.get_attribute("class") or ""):
            self.stops_cut += 1

    def select(self, chat_id: str) -> None:
        if self.dataset().get("chat") != chat_id:
            self.page.locator(f'#chat-list button[data-chat="{chat_id}"]').click()
            self.page.wait_for_selector(f'html[data-chat="{chat_id}"]', state="attached")

    def delete(self) -> None:
        target = self.dataset()["chat"]
        self.page.once("dialog", lambda d: d.accept())
        self.page.locator("#delete-chat").click()
        self.page.wait_for_selector(f'#chat-list button[data-chat="{target}"]', state="detached")
        self.deleted.add(target)
        self.created.discard(target)

    def new_chat(self) -> None:
        before = {cid for cid, _, _ in self.listed()}
        self.page.locator("#new-chat").click()
        new = self.poll(lambda: {cid for cid, _, _ in self.listed()} - before, "a new chat to be listed")
        (cid,) = new
        self.page.wait_for_selector(f'html[data-chat="{cid}"]', state="attached")
        self.created.add(cid)
        self.deleted.discard(cid)  # after a reload the worker may hand out a deleted chat's id again

    def switch(self) -> None:
        current = self.dataset().get("chat")
        self.select(self.rng.choice(sorted(cid for cid, _, _ in self.listed() if cid != current)))

    def reload(self) -> None:
        self.reloaded_at = self.turns
        self.page.reload()
        self.page.wait_for_selector("html[data-model=ready][data-restored]", state="attached",
                                    timeout=self.boot_timeout_ms)
        self.page.wait_for_selector("#chat-list button[aria-current=true]", state="attached")

    def reload_after_reply(self) -> None:
        """A Send, and a reload the moment its reply ends (the page's pagehide flushes the disk tier then)."""
        target = self.dataset()["chat"]
        self.fill_settings(long=False)
        self.page.fill("#prompt", self.words())
        turns = self.turns
        self.start_turn(lambda: self.page.press("#prompt", "Enter"))
        if self.turns == turns:  # refused (an error already noted)
            return
        self.poll(lambda: not self.worker()["chats"].get(target, {}).get("busy"), f"{target}'s reply to end")
        self.reload()

    def saved(self, chat: str) -> dict:
        """The chat's record once it holds the worker's history of it, not streaming (the page writes after the
        worker's chat-saved)."""
        def caught_up():
            held = self.worker()["chats"].get(chat)
            rec = self.records().get(chat)
            ok = held is not None and not held["busy"] and rec is not None and not rec.get("streaming") \
                and (rec["checkpoint"] or [[], [], ""])[1] == held["ids"]
            return rec if ok else None
        return self.poll(caught_up, f"{chat}'s record to hold its history")

    def two_tabs(self) -> None:
        """A second tab opens the chat in view; both press Enter at once; both turns must reach the record, and
        each tab must show what the record holds."""
        target = self.dataset()["chat"]
        before = len(self.saved(target)["messages"])
        other = self.page.context.new_page()
        other.set_default_timeout(self.timeout_ms)
        other.on("pageerror", lambda exc: self.errors.append(f"second tab pageerror: {exc}"))
        other.on("console", lambda m: self.errors.append(f"second tab console error: {m.text}")
                 if m.type == "error" else None)
        try:
            other.goto(self.page.url)
            other.wait_for_selector("html[data-model=ready][data-restored]", state="attached",
                                    timeout=self.boot_timeout_ms)
            other.locator(f'#chat-list button[data-chat="{target}"]').click()
            other.wait_for_selector(f'html[data-chat="{target}"]', state="attached")
            for tab in (self.page, other):
                self.fill_settings(long=False, page=tab)
            texts = [f"{self.words()} (tab {n})" for n in (1, 2)]
            self.page.evaluate(SEND_NOW, texts[0])
            other.evaluate(SEND_NOW, texts[1])

            def both_in_record():
                rec = self.records().get(target)
                if rec is None or rec.get("streaming") or len(rec["messages"]) < before + 4:
                    return None
                return rec
            try:
                rec = self.poll(both_in_record, "both tabs' turns in the record")
            except AssertionError:
                rec = self.records().get(target) or {"messages": []}
            users = [m["text"] for m in rec["messages"][before:] if m["role"] == "user"]
            lost = [t for t in texts if t not in users]
            self.turns += 2 - len(lost)
            self.turns_lost += len(lost)
            if lost:
                self.errors.append(f"two tabs: {target}'s record lacks {lost!r}: {rec['messages'][before:]!r}")
            want = [[m["role"], m["text"]] for m in rec["messages"]]
            for n, tab in ((1, self.page), (2, other)):
                try:
                    self.poll(lambda t=tab: [[r, x] for r, x, _ in
                                             t.eval_on_selector_all("#messages .msg", SHOWN_MESSAGES)] == want,
                              f"tab {n} to show the record of {target}")
                except AssertionError:
                    self.errors.append(f"two tabs: tab {n} does not show {target}'s record")
        finally:
            other.close()
        self.reloaded_at = self.turns  # a page booted: the slow actions wait as after a reload

    def full_quota(self) -> None:
        """A turn under a full quota ends (a note of the page saying which store the quota refused, the chats'
        data-store=full or the disk tier's disk_note, is counted). With the quota back and a reload (as
        the page's note asks), the chat's record is what it was before the quota filled when the page said the
        chats were not saved, else what it was after the turn."""
        target = self.dataset()["chat"]
        before = self.saved(target) if self.worker()["chats"].get(target, {}).get("messages") else \
            self.records().get(target)
        parts = urlsplit(self.page.url)
        origin = f"{parts.scheme}://{parts.netloc}"
        cdp = self.page.context.new_cdp_session(self.page)
        cdp.send("Storage.overrideQuotaForOrigin", {"origin": origin, "quotaSize": self.page.evaluate(USAGE)})
        chats_full = False
        # Full blocks of the history before the turn (the record's: after a reload the worker opens the chat's
        # session only at its next turn).
        blocks = (len(((before or {}).get("checkpoint") or [[], [], ""])[1]) - 1) // BLOCK_SIZE
        try:
            self.fill_settings(long=True)  # a long reply: a new full block for the disk tier to write
            self.page.fill("#prompt", self.words())
            turns = self.turns
            self.start_turn(lambda: self.page.press("#prompt", "Enter"))
            if self.turns == turns:  # refused (an error already noted)
                return
            self.poll(lambda: not self.worker()["chats"].get(target, {}).get("busy"),
                      f"{target}'s reply under a full quota to end")

            def said():
                data = self.dataset()
                disk = json.loads(data.get("memory") or "{}").get("disk_note") or ""
                return data.get("store") == "full" or disk.startswith("disk full (") and "quota" in disk
            # Where the reply filled a new block, the disk tier writes it at the reply's end; the quota may refuse
            # it, and the page then says so. Not always: in the soak, with the quota at the usage estimate() gave,
            # a fresh chat's blocks were once written all the same (why is not pinned down). So counted, not
            # required here: tests/browser/test_storage_quota.py checks the notes.
            grew = (len(self.worker()["chats"][target]["ids"]) - 1) // BLOCK_SIZE > blocks
            try:
                self.poll(said, "the page to say which store is full", timeout_ms=10_000 if grew else 1)
                self.quota_said += 1
            except AssertionError:
                pass
            chats_full = self.dataset().get("store") == "full"
            kept = before if chats_full else self.saved(target)
        finally:
            cdp.send("Storage.overrideQuotaForOrigin", {"origin": origin})  # no quotaSize: the default again
            cdp.detach()
        self.unsaved_turns += chats_full
        self.reload()
        after = self.records().get(target)
        keys = ("messages", "checkpoint")
        if (kept is None) != (after is None) or \
                (kept is not None and [kept.get(k) for k in keys] != [after.get(k) for k in keys]):
            self.errors.append(f"full quota: {target}'s record after the reload is not the one kept "
                               f"({'before' if chats_full else 'after'} the turn): {kept!r} -> {after!r}")
            self.turns_lost += 1

    def reload_under_load(self) -> None:
        """With a busy loop beside the browser: a turn, a reload the moment it ends, and the chat's next turn,
        whose prompt must take every full block of the history from disk."""
        target = self.dataset()["chat"]
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            self.fill_settings(long=False)
            self.page.fill("#prompt", self.words())
            ended = self.dataset().get("lastTurn")
            turns = self.turns
            self.start_turn(lambda: self.page.press("#prompt", "Enter"))
            if self.turns == turns:  # refused (an error already noted)
                return
            turn = self.poll(lambda: (t := self.dataset().get("lastTurn")) != ended and
                             (j := json.loads(t))["chat"] == target and j, f"{target}'s reply to end")
            start = json.loads(self.dataset()["lastStart"])  # this turn's (start_turn waited for it)
            self.reload()  # at once: the disk tier writes as the reply ends
            self.select(target)
            full = computed_blocks(start, turn)
            self.fill_settings(long=False)
            self.page.fill("#prompt", self.words())
            ended = self.dataset().get("lastTurn")
            turns = self.turns
            self.start_turn(lambda: self.page.press("#prompt", "Enter"))
            if self.turns == turns:
                return
            after = self.poll(lambda: (t := self.dataset().get("lastTurn")) != ended and
                              (j := json.loads(t))["chat"] == target and j, f"{target}'s next reply to end")
            self.disk_blocks += full
            self.disk_missed += max(0, full - after["cached_tokens"] // BLOCK_SIZE)
        finally:
            hog.kill()
            hog.wait()

    def act(self) -> None:
        worker = self.worker()
        feasible = self.feasible(worker)
        if not feasible:
            raise AssertionError(f"soak: none of {self.kinds} can run now: chat {self.dataset().get('chat')}, "
                                 f"listed {self.listed()}, worker {json.dumps(worker)[:1500]}")
        kind = self.choose(feasible)
        t0 = time.perf_counter()
        if kind == "stop":
            self.stop(worker)
        else:
            getattr(self, kind)()
        self.seconds[kind] += time.perf_counter() - t0
        self.actions[kind] += 1
        self.note_errors()

    def run(self, turns: int) -> None:
        self.page.wait_for_selector("#chat-list button[aria-current=true]", state="attached")
        self.created.update(cid for cid, _, _ in self.listed())
        while self.turns < turns:
            self.act()

    # ------------------------------------------------------------------ checks

    def idle(self) -> dict:
        """Wait until every reply is over, in the worker and on the page; returns the worker's state."""
        worker = self.poll(lambda: (w := self.worker()) and not w["unfinished"] and
                           not any(c["busy"] for c in w["chats"].values()) and w, "every reply to finish")
        self.poll(lambda: not any(busy for _, busy, _ in self.listed()), "the page to show every chat idle")
        return worker

    def mismatches(self, worker: dict, records: dict) -> list[str]:
        """Chats whose saved record, worker history and shown messages disagree (one line each)."""
        found = []
        for cid, chat in sorted(worker["chats"].items()):
            rec = records.get(cid)
            said = [[m["role"], m["content"]] for m in chat["messages"] if m["role"] != "system"]
            self.select(cid)
            shown = [[role, text] for role, text, _ in self.shown()]
            if rec is None:
                found.append(f"{cid}: no saved record")
                continue
            saved = [[m["role"], m["text"]] for m in rec.get("messages") or []]
            if rec["checkpoint"] is None and not chat["messages"]:  # a session opened, no turn taken yet
                pass
            elif rec["checkpoint"] is None or rec["checkpoint"][1] != chat["ids"]:
                kept = (rec["checkpoint"] or [[], [], ""])[1]
                found.append(f"{cid}: saved {len(kept)} token ids, the worker holds "
                             f"{len(chat['ids'])} (first difference at {_first_difference(kept, chat['ids'])})")
            if rec.get("partial_ids") or rec.get("streaming"):
                found.append(f"{cid}: saved as still streaming ({len(rec.get('partial_ids') or [])} partial ids)")
            if not saved == shown == said:
                found.append(f"{cid}: messages differ: saved {saved!r}, shown {shown!r}, worker {said!r}")
        return found

    def settled_records(self, worker: dict) -> dict:
        """The IndexedDB records once the page has written the worker's last saves (or what is there after the
        timeout: a record that never catches up is then a mismatch)."""
        def caught_up():
            recs = self.records()
            ok = all(cid in recs and (recs[cid]["checkpoint"] or [[], [], ""])[1] == (c["ids"] if c["messages"] else [])
                     and not recs[cid].get("streaming")
                     for cid, c in worker["chats"].items())
            return recs if ok else None
        try:
            return self.poll(caught_up, "the saved records", timeout_ms=5_000)
        except AssertionError:
            return self.records()

    def check(self) -> dict:
        worker = self.idle()
        pool = worker["pool"]
        leaked = pool["total"] - pool["free"] - pool["cached"]
        before = self.mismatches(worker, self.settled_records(worker))
        expected = set(self.created)
        self.reload()
        self.note_errors()
        listed = {cid for cid, _, _ in self.listed()}
        restored = self.idle()
        after = self.mismatches(restored, self.records())
        return {"blocks_leaked": leaked, "pool": pool, "chats_lost": sorted(expected - listed),
                "chats_back_after_delete": sorted(listed & self.deleted), "mismatches_before_reload": before,
                "mismatches_after_reload": after, "chats_at_end": sorted(listed)}


def computed_blocks(start: dict, end: dict) -> int:
    """Full blocks of KV the engine computed in a turn (its turn-start and turn-end messages): the prompt and every
    token generated but the last, which no step fed back. Not the history's (`history_tokens`): it ends with the
    template's closing of the reply (`<|im_end|>` and a newline for ChatML), which no step has computed yet (the
    next turn's prefill does); counting them took a block those tokens complete for one the disk missed (in a probe
    of 16 turns under a CPU hog, the history's count showed 2 such misses where every computed block was on disk;
    the 2 of 8 in bench/results/soak_issue49_quick.json were counted that way, and were not told apart)."""
    return (start["prompt_tokens"] + end["tokens"] - 1) // BLOCK_SIZE


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_soak(page, *, turns: int, chats: int = 4, seed: int, reload_every: int = 8, timeout_ms: int = 60_000,
             boot_timeout_ms: int = 240_000, kinds: tuple[str, ...] = KINDS) -> dict:
    """Drive a booted page of the app (MODEL_QUERY, model ready) through seeded random actions (of `kinds`) over
    at most `chats` chats until `turns` replies have started, then check it (module docstring). An action that
    boots a page (a reload, a second tab: the slowest) comes at most once per `reload_every` turns. Returns the
    figures."""
    t0 = time.perf_counter()
    soak = Soak(page, seed=seed, chats=chats, reload_every=reload_every, timeout_ms=timeout_ms,
                boot_timeout_ms=boot_timeout_ms, kinds=kinds)
    soak.run(turns)
    end = soak.check()
    return {"benchmark": "soak", "seed": seed, "chats": chats, "turns": soak.turns, "query": MODEL_QUERY,
            "actions": {k: soak.actions[k] for k in kinds},
            "action_s": {k: round(soak.seconds[k], 1) for k in kinds}, "stops_cut_a_reply": soak.stops_cut,
            "errors": len(soak.errors), "error_messages": soak.errors[:20], "chats_lost": len(end["chats_lost"]),
            "history_mismatches": len(end["mismatches_before_reload"]) + len(end["mismatches_after_reload"]),
            "blocks_leaked": end["blocks_leaked"], "turns_lost": soak.turns_lost,
            "turns_unsaved_under_full_quota": soak.unsaved_turns, "full_quota_notes_shown": soak.quota_said,
            "disk_blocks_checked": soak.disk_blocks,
            "disk_blocks_missed": soak.disk_missed, "details": end, "wall_s": round(time.perf_counter() - t0, 1)}

