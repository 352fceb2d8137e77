"""No lost input and no lost chat: a message sent while the model loads, unreadable saved records, and chats
another model made."""
from __future__ import annotations

import json

from browser_pages import BOOT_TIMEOUT_MS, open_app, show_settings, wait_until
from test_chat_app import raw_last_turn, send_and_wait, wait_next_turn

QUERY = "?model=tiny-random&backend=cpu"

PUT_RECORDS = """async (records) => {
  const db = await new Promise((ok, fail) => {
    const r = indexedDB.open("pagedkv", 1); r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error); });
  await new Promise((ok, fail) => {
    const tx = db.transaction("chats", "readwrite");
    for (const rec of records) tx.objectStore("chats").put(rec);
    tx.oncomplete = ok; tx.onerror = () => fail(tx.error); });
  db.close();
}"""

ALL_RECORDS = """async () => {
  const db = await new Promise((ok, fail) => {
    const r = indexedDB.open("pagedkv", 1); r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error); });
  const all = await new Promise((ok, fail) => {
    const r = db.transaction("chats").objectStore("chats").getAll(); r.onsuccess = () => ok(r.result);
    r.onerror = () => fail(r.error); });
  db.close();
  return all;
}"""


def records(page) -> dict:
    return {rec["id"]: rec for rec in page.evaluate(ALL_RECORDS)}


def reload_app(page) -> None:
    page.reload()
    page.wait_for_selector("html[data-model=ready][data-restored]", state="attached", timeout=BOOT_TIMEOUT_MS)
    page.wait_for_selector("#chat-list li", state="attached")  # drawn once the model is in (or before, when saved)
    show_settings(page)


def wait_for_record(page, chat: str) -> None:
    """A chat's record is written to IndexedDB a moment after the chat appears; a reload before that loses it."""
    for _ in range(100):
        if chat in records(page):
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"{chat} was never saved")


def wait_turn_saved(page, chat: str, history_tokens: int) -> dict:
    """The record of `chat` once it holds the finished turn (its IndexedDB write follows the turn's end): no
    reply streaming, and the token history the turn-end reported."""
    def saved():
        rec = records(page).get(chat)
        return rec if rec and not rec.get("streaming") and rec["checkpoint"] and \
            len(rec["checkpoint"][1]) == history_tokens else None
    return wait_until(f"{chat}'s finished turn saved", saved, lambda: records(page).get(chat))


def titles(page) -> list[str]:
    return page.locator("#chat-list li").all_inner_texts()


def test_a_message_sent_while_the_model_loads_waits_and_is_answered(browser, base_url):
    page = browser.new_page()
    page.set_default_timeout(BOOT_TIMEOUT_MS)
    held, released = [], []
    # The model's files are held back until the message is typed.
    page.route("**/models/tiny-random/**", lambda route: route.continue_() if released else held.append(route))
    try:
        page.goto(base_url + QUERY)
        page.wait_for_selector("html[data-state=ready]", state="attached")
        for _ in range(600):
            if held:
                break
            page.wait_for_timeout(100)
        assert held and page.evaluate("document.documentElement.dataset.model") == "loading"
        show_settings(page)
        page.fill("#set-temperature", "0")
        page.fill("#set-max-tokens", "4")
        page.fill("#prompt", "Hello there!")
        page.press("#prompt", "Enter")
        pending = page.locator("#messages .msg.user.pending")
        assert pending.get_attribute("data-text", timeout=10_000) == "Hello there!"
        assert page.input_value("#prompt") == "" and page.locator("#send").is_disabled()
        assert page.evaluate("document.documentElement.dataset.model") == "loading"
        released.append(True)
        for route in held:
            route.continue_()
        turn = wait_next_turn(page, "")
        assert turn["reason"] == "length" and turn["tokens"] == 4
        assert page.evaluate("document.documentElement.dataset.model") == "ready"
        assert page.locator("#messages .msg.user").all_inner_texts() == ["Hello there!"]
        assert page.locator("#messages .msg.pending").count() == 0
        assert page.locator("#messages .msg.assistant").get_attribute("data-text") == turn["content"]
    finally:
        page.close()


BROKEN = [
    {"id": "chat-zz", "title": "Broken", "checkpoint": [[], []], "messages": "zzz", "partial_ids": [1]},
    {"id": "chat-7", "title": "Half", "checkpoint": [[], []], "messages": []},
]


def test_unreadable_records_are_skipped_with_a_note_and_never_written_over(browser, base_url):
    booted, _ = open_app(browser, base_url + QUERY, 60_000)
    page = booted.page
    try:
        turn = send_and_wait(page, "Remember me.", 4)
        good = wait_turn_saved(page, "chat-1", turn["history_tokens"])
        assert len(good["checkpoint"][1]) == turn["history_tokens"] > 0
        page.evaluate(PUT_RECORDS, BROKEN)
        reload_app(page)
        assert titles(page) == ["Chat 1"]
        note = page.locator("#store-note")
        assert note.is_visible() and note.inner_text() == "2 saved chats could not be read (left as stored)"
        assert page.locator("#messages .msg.user").all_inner_texts() == ["Remember me."]
        # A new chat takes an id no saved record holds, and the good chat still answers from its history.
        page.locator("#new-chat").click()
        page.wait_for_selector("#chat-list li:nth-child(2) button[aria-current=true]", state="attached")
        assert page.evaluate("document.documentElement.dataset.chat") == "chat-8"
        page.locator("#chat-list li:nth-child(1) button").click()
        again = send_and_wait(page, "Again.", 4)
        assert again["tokens"] == 4 and again["history_tokens"] > turn["history_tokens"]
        wait_turn_saved(page, "chat-1", again["history_tokens"])
        saved = records(page)
        assert {k: saved[k] for k in ("chat-zz", "chat-7")} == {rec["id"]: rec for rec in BROKEN}
        assert saved["chat-1"]["checkpoint"][1][:len(good["checkpoint"][1])] == good["checkpoint"][1]
        assert sorted(saved) == ["chat-1", "chat-7", "chat-8", "chat-zz"]
    finally:
        page.close()


OTHER_MODELS = [
    {"id": "chat-5", "title": "Elsewhere", "model": "other-model", "checkpoint": [[{"role": "user", "content": "hi"}],
     [1, 2, 3], "hi"], "messages": [{"role": "user", "text": "hi"}, {"role": "assistant", "text": "hello"}]},
    # Written before chats recorded their model: the default model's.
    {"id": "chat-6", "title": "Old", "checkpoint": [[], [], ""], "messages": [{"role": "user", "text": "old"}]},
]


def test_a_chat_of_another_model_opens_read_only(browser, base_url):
    booted, _ = open_app(browser, base_url + QUERY, 60_000)
    page = booted.page
    try:
        page.evaluate(PUT_RECORDS, OTHER_MODELS)
        wait_for_record(page, "chat-1")
        reload_app(page)
        assert titles(page) == ["Chat 1", "Elsewhere", "Old"]
        assert booted.py("import json\nfrom pagedkv_app.main import state\njson.dumps(list(state['service'].sessions))") \
            == ["chat-1"]
        page.locator("#chat-list li:nth-child(2) button").click()
        note = page.locator("#chat-note")
        assert note.is_visible() and "made with other-model" in note.inner_text() and "read-only" in note.inner_text()
        assert note.locator("a").get_attribute("href") == "?model=other-model&backend=cpu"
        assert page.locator("#messages .msg").all_inner_texts() == ["hi", "hello"]
        assert page.locator("#send").is_disabled() and page.locator("#regenerate").is_disabled()
        previous = raw_last_turn(page)
        page.fill("#prompt", "Go on.")
        page.press("#prompt", "Enter")  # nothing is sent with this model's template and token ids
        page.wait_for_timeout(500)
        assert page.input_value("#prompt") == "Go on." and raw_last_turn(page) == previous
        page.locator("#chat-list li:nth-child(3) button").click()
        assert "made with smollm2-135m-instruct" in note.inner_text()
        page.fill("#prompt", "")
        page.locator("#new-chat").click()
        page.wait_for_selector("#chat-list li:nth-child(2) button[aria-current=true]", state="attached")
        assert page.evaluate("document.documentElement.dataset.chat") == "chat-7"
        saved = records(page)
        assert saved["chat-1"]["model"] == "tiny-random"
        assert {k: saved[k] for k in ("chat-5", "chat-6")} == {rec["id"]: rec for rec in OTHER_MODELS}
    finally:
        page.close()


WORKER_SESSIONS = ("import json\nfrom pagedkv_app.main import state\n"
                   "json.dumps({k: s.conversation.ids for k, s in state['service'].sessions.items()})")


def test_the_page_makes_names_and_keeps_a_chat_the_worker_only_has_a_session_of(browser, base_url):
    booted, _ = open_app(browser, base_url + QUERY, 60_000)
    page = booted.page
    try:
        page.wait_for_selector("#chat-list li", state="attached")
        send_and_wait(page, "Hello there.", 3)
        wait_for_record(page, "chat-1")
        page.locator("#new-chat").click()  # made by the page, with no word to the worker
        page.wait_for_selector("#chat-list li:nth-child(2) button[aria-current=true]", state="attached")
        assert page.evaluate("document.documentElement.dataset.chat") == "chat-2"
        wait_for_record(page, "chat-2")
        assert records(page)["chat-2"]["checkpoint"] is None
        assert list(booted.py(WORKER_SESSIONS)) == ["chat-1"]
        page.once("dialog", lambda dialog: dialog.accept("Renamed here"))
        page.locator("#rename-chat").click()
        page.wait_for_selector("#chat-title:text('Renamed here')")
        assert titles(page) == ["Chat 1", "Renamed here"]
        for _ in range(50):
            if records(page)["chat-2"]["title"] == "Renamed here":
                break
            page.wait_for_timeout(100)
        assert records(page)["chat-2"]["title"] == "Renamed here"
        first = booted.py(WORKER_SESSIONS)["chat-1"]
        assert records(page)["chat-1"]["checkpoint"][1] == first
        reload_app(page)
        assert titles(page) == ["Chat 1", "Renamed here"]
        # The reloaded worker opened a session per record: chat-1's exact ids, chat-2 empty until its first turn.
        sessions = booted.py(WORKER_SESSIONS)
        assert list(sessions) == ["chat-1", "chat-2"] and sessions["chat-1"] == first
        page.locator("#chat-list li:nth-child(2) button").click()
        send_and_wait(page, "A first message.", 3)
        for _ in range(50):
            if records(page)["chat-2"]["checkpoint"]:
                break
            page.wait_for_timeout(100)
        assert records(page)["chat-2"]["checkpoint"][1] == booted.py(WORKER_SESSIONS)["chat-2"]
        assert records(page)["chat-2"]["title"] == "Renamed here"
    finally:
        page.close()


# The page reloads in the very task that shows the reply's end (data-last-turn): no worker message and no
# IndexedDB callback can land in between. The end it showed is kept in sessionStorage for the test.
RELOAD_AT_TURN_END = """() => new MutationObserver((_, seen) => {
  seen.disconnect();
  sessionStorage.setItem("end", document.documentElement.dataset.lastTurn);
  location.reload();
}).observe(document.documentElement, { attributes: true, attributeFilter: ["data-last-turn"] })"""


# What a page that goes while its write is on its way leaves when that write lands all the same (its commit had
# begun): a pagehide in the task of the reply's end keeps the write in localStorage (copied to sessionStorage
# here, as the page's own landing of the write takes it out again), put back before a reload.
KEEP_AT_TURN_END = """() => new MutationObserver((_, seen) => {
  seen.disconnect();
  window.dispatchEvent(new PageTransitionEvent("pagehide"));
  const kept = Object.keys(localStorage).filter((k) => k.startsWith("pagedkv-unwritten:"));
  sessionStorage.setItem("kept", JSON.stringify(kept.map((k) => [k, localStorage.getItem(k)])));
  sessionStorage.setItem("end", document.documentElement.dataset.lastTurn);
}).observe(document.documentElement, { attributes: true, attributeFilter: ["data-last-turn"] })"""

PUT_BACK_KEPT = """() => {
  const kept = JSON.parse(sessionStorage.getItem("kept"));
  for (const [k, v] of kept) localStorage.setItem(k, v);
  return kept.length;
}"""

UNWRITTEN_KEYS = "Object.keys(localStorage).filter((k) => k.startsWith('pagedkv-unwritten:'))"


def shown_messages(page) -> list[list[str]]:
    return page.eval_on_selector_all("#messages .msg", "els => els.map(e => [e.className, e.dataset.text])")


def test_a_reload_in_the_task_a_reply_ends_keeps_the_whole_reply(browser, base_url):
    """A reload (or a close) the moment a reply ends keeps the whole reply and its token history, not the
    interrupted start that the record held while the write of the end was on its way (store.js keeps at
    pagehide in localStorage the writes that had not landed; the next page writes them first), and a kept write
    that landed all the same is not written twice."""
    booted, _ = open_app(browser, base_url + QUERY, 60_000)
    page = booted.page
    try:
        page.wait_for_selector("#chat-list li", state="attached")
        page.fill("#set-temperature", "0")
        page.fill("#set-max-tokens", "6")
        page.evaluate(RELOAD_AT_TURN_END)
        page.fill("#prompt", "Hello there.")
        with page.expect_navigation(timeout=120_000):
            page.press("#prompt", "Enter")
        page.wait_for_selector("html[data-model=ready][data-restored]", state="attached", timeout=BOOT_TIMEOUT_MS)
        end = json.loads(page.evaluate("sessionStorage.getItem('end')"))
        assert end["tokens"] == 6 and end["reason"] == "length"
        page.wait_for_selector("#messages .msg.assistant", state="attached")
        assert shown_messages(page) == [["msg user", "Hello there."], ["msg assistant", end["content"]]]
        rec = records(page)["chat-1"]
        ids = booted.py(WORKER_SESSIONS)["chat-1"]
        assert (rec["streaming"], rec["partial_ids"], rec["checkpoint"][1]) == (False, [], ids)
        assert len(ids) == end["history_tokens"]
        assert rec["checkpoint"][0][-1] == {"role": "assistant", "content": end["content"]}
        assert page.evaluate(UNWRITTEN_KEYS) == []
        # A second turn whose write is kept at a pagehide and lands too: the next page writes the kept record
        # over the one that landed (its own), not merged with it as another tab's: no turn twice.
        first = shown_messages(page)
        page.evaluate(KEEP_AT_TURN_END)
        previous = raw_last_turn(page)
        page.fill("#prompt", "And then?")
        page.press("#prompt", "Enter")
        end = wait_next_turn(page, previous)
        two_turns = first + [["msg user", "And then?"], ["msg assistant", end["content"]]]
        wait_until("the second turn's record", lambda: (len(records(page)["chat-1"]["messages"]),
                                                        records(page)["chat-1"]["streaming"]) == (4, False))
        assert page.evaluate(UNWRITTEN_KEYS) == []  # landed: the page took its kept copy out
        assert page.evaluate(PUT_BACK_KEPT) == 1
        reload_app(page)
        page.wait_for_selector("#messages .msg.assistant", state="attached")
        assert shown_messages(page) == two_turns
        rec = records(page)["chat-1"]
        assert [[m["role"], m["text"]] for m in rec["messages"]] == [[c.split()[-1], t] for c, t in two_turns]
        assert rec["checkpoint"][1] == booted.py(WORKER_SESSIONS)["chat-1"] and len(rec["checkpoint"][1]) == \
            end["history_tokens"]
        assert page.evaluate(UNWRITTEN_KEYS) == []
    finally:
        page.close()
