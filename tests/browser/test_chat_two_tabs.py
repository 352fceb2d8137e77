"""One chat open in two tabs (two engines, one IndexedDB): a turn made in one shows in the other, and when both
send at once neither turn is lost: the record holds both, in order, with a token history that renders them."""
from __future__ import annotations

import pytest

from browser_pages import open_app, wait_until
from test_chat_records import records, reload_app

QUERY = "?model=tiny-random&backend=cpu"

# Both tabs' Sends as close together as two tabs allow: each a keydown in its own page.
SEND = """(text) => {
  const box = document.getElementById("prompt");
  box.value = text;
  box.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
}"""

# The worker's session of a chat: its messages, and whether its text is what the template renders for them
# (a merged token history must be the exact history of both tabs' turns).
SESSION = """import json
from pagedkv_app.main import state
_c = state["service"].sessions[%r].conversation
json.dumps({"messages": [[m["role"], m["content"]] for m in _c.messages],
            "renders": _c.template.render(_c.messages, add_generation_prompt=False) == _c.checkpoint()[2],
            "tokens": len(_c.ids)})"""


LAST_START = "document.documentElement.dataset.lastStart"


def shown(page) -> list[list[str]]:
    return page.eval_on_selector_all("#messages .msg", "els => els.map(e => [e.classList.contains('user') ? "
                                     "'user' : 'assistant', e.dataset.text])")


def settled(page, chat: str, n: int):
    rec = records(page).get(chat)
    return rec if rec and len(rec["messages"]) == n and not rec.get("streaming") else None


@pytest.fixture()
def tabs(browser, base_url):
    context = browser.new_context()
    first, _ = open_app(context, base_url + QUERY, 60_000)
    # The first tab's chat is written before the second tab opens, so both open the same chat.
    chat = first.page.evaluate("document.documentElement.dataset.chat")
    wait_until("the first tab's chat is saved", lambda: chat in records(first.page))
    second, _ = open_app(context, base_url + QUERY, 60_000)
    yield first, second
    context.close()


def test_two_tabs_on_one_chat_keep_both_turns_and_show_each_others(tabs):
    a, b = tabs
    chat = a.page.evaluate("document.documentElement.dataset.chat")
    assert b.page.evaluate("document.documentElement.dataset.chat") == chat
    for tab in (a, b):
        tab.page.fill("#set-temperature", "0")
        tab.page.fill("#set-max-tokens", "4")
    # A turn made in the first tab shows in the second (BroadcastChannel), and the second's engine goes on from it.
    a.page.evaluate(SEND, "hello from a")
    a.page.wait_for_selector("html[data-last-turn]", state="attached")
    first = wait_until("the first turn saved", lambda: settled(a.page, chat, 2))["messages"]
    turn1 = [[m["role"], m["text"]] for m in first]
    wait_until("the second tab shows the first's turn", lambda: shown(b.page) == turn1, lambda: shown(b.page))
    assert b.py(SESSION % chat)["messages"] == turn1
    # Both send at once.
    a.page.evaluate(SEND, "second from a")
    b.page.evaluate(SEND, "second from b")
    rec = wait_until("both turns in the record", lambda: settled(a.page, chat, 6),
                     lambda: (records(a.page).get(chat), shown(a.page), shown(b.page)))
    got = [[m["role"], m["text"]] for m in rec["messages"]]
    assert got[:2] == turn1 and sorted(got[2::2]) == [["user", "second from a"], ["user", "second from b"]]
    assert [m[0] for m in got] == ["user", "assistant"] * 3
    # Each tab shows both (the one that wrote first takes the merge from the other's write).
    for tab in (a, b):
        wait_until("both turns shown in each tab", lambda: shown(tab.page) == got, lambda: shown(tab.page))
    # After a reload both are there, and the engine's history is exactly both turns, as the template renders them.
    reload_app(a.page)
    a.page.locator(f'#chat-list button[data-chat="{chat}"]').click()
    assert shown(a.page) == got
    session = a.py(SESSION % chat)
    assert session["messages"] == [[r, t] for r, t in got] and session["renders"] is True
    # The settings both tabs set are the chat's, after the merges and the reload.
    assert [a.page.input_value(f) for f in ("#set-temperature", "#set-max-tokens")] == ["0", "4"]
    # And the next turn follows all three.
    a.page.evaluate(SEND, "third")
    rec = wait_until("the next turn saved", lambda: settled(a.page, chat, 8),
                     lambda: (records(a.page).get(chat), shown(a.page), a.page.evaluate(LAST_START)))
    assert [[m["role"], m["text"]] for m in rec["messages"]][:6] == got
