"""Nothing a person does loses their words: a second Send before the first reply starts is handed back in the box
(the page, the worker and IndexedDB agree on the history), a late session-saved does not bring a deleted chat back,
and Delete lands at once while the chat streams and another chat's reply has just ended."""
from __future__ import annotations

import json

import pytest

from browser_pages import open_app, show_settings, wait_until
from test_chat_app import memory_when_idle, raw_last_turn, wait_next_turn
from test_chat_records import records, reload_app

QUERY = "?model=tiny-random&backend=cpu"  # the CPU path: a whole engine step between a Send and its turn-start

# Two Sends in one task of the page, as two quick presses of Enter: no worker message can land between them.
TWO_QUICK_SENDS = """([first, second]) => {
  const box = document.getElementById("prompt");
  for (const text of [first, second]) {
    box.value = text;
    box.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
  }
  // Read in the same task as the two presses: no reply can have started or ended yet (the tiny model's reply
  // may be over before the test's next call reads the page).
  return { shown: [...document.querySelectorAll("#messages .msg")].map((e) => [e.className, e.dataset.text]),
           box: box.value, sendDisabled: document.getElementById("send").disabled };
}"""

# A Send the worker refuses, then more typed before its refusal arrives.
SEND_THEN_TYPE = """([sent, typed]) => {
  const box = document.getElementById("prompt");
  box.value = sent;
  box.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
  const cleared = box.value === "";
  box.value = typed;
  return cleared;
}"""

WORKER_CHATS = """import json
from pagedkv_app.main import state
_pool = state["engine"].kv.pool
json.dumps({"chats": {c.session_id: [[m["role"], m["content"]] for m in c.conversation.messages]
                      for c in state["service"].sessions.values()},
            "unfinished": state["engine"].has_unfinished,
            "leaked": _pool.num_blocks - _pool.num_free - _pool.num_cached})"""


@pytest.fixture(scope="module")
def app(browser, base_url):
    booted, _ = open_app(browser, base_url + QUERY, 60_000)
    yield booted
    booted.page.close()


def new_chat(page) -> str:
    # The page lists a first chat once the model is in and it has opened the saved ones (none here).
    page.wait_for_selector("#chat-list li", state="attached")
    n = page.locator("#chat-list li").count()
    page.locator("#new-chat").click()
    page.wait_for_selector(f"#chat-list li:nth-child({n + 1}) button[aria-current=true]", state="attached")
    return page.evaluate("document.documentElement.dataset.chat")


def shown(page) -> list[list[str]]:
    return page.eval_on_selector_all("#messages .msg", "els => els.map(e => [e.classList.contains('user') ? "
                                     "'user' : 'assistant', e.dataset.text])")


def listed(page) -> list[str]:
    return page.eval_on_selector_all("#chat-list button", "bs => bs.map(b => b.dataset.chat)")


def saved_messages(page, chat: str) -> list[list[str]]:
    return [[m["role"], m["text"]] for m in records(page)[chat]["messages"]]


def delete_current(page) -> str:
    chat = page.evaluate("document.documentElement.dataset.chat")
    page.once("dialog", lambda d: d.accept())
    page.locator("#delete-chat").click()
    return chat


def settled_record(page, chat: str, messages: list) -> None:
    # The IndexedDB write follows the worker's session-saved.
    wait_until(f"{chat}'s record holds {messages}", lambda: chat in records(page) and saved_messages(page, chat) == messages,
               lambda: records(page).get(chat))


def test_a_second_send_before_the_first_starts_is_handed_back_and_every_copy_agrees(app):
    booted, page = app, app.page
    chat = new_chat(page)
    show_settings(page)
    page.fill("#set-temperature", "0")
    page.fill("#set-max-tokens", "4")
    previous = raw_last_turn(page)
    right_after = page.evaluate(TWO_QUICK_SENDS, ["first words", "second words"])
    # The first is shown as pending at once; the second was not taken: it is still in the box.
    assert right_after == {"shown": [["msg user pending", "first words"]], "box": "second words", "sendDisabled": True}
    turn = wait_next_turn(page, previous)
    assert turn["chat"] == chat and turn["tokens"] == 4
    first = [["user", "first words"], ["assistant", turn["content"]]]
    assert shown(page) == first and page.input_value("#prompt") == "second words"
    assert booted.py(WORKER_CHATS)["chats"][chat] == first
    settled_record(page, chat, first)
    # Sent again once the reply is over, it is answered after the first, in order.
    previous = raw_last_turn(page)
    page.press("#prompt", "Enter")
    second = wait_next_turn(page, previous)
    both = first + [["user", "second words"], ["assistant", second["content"]]]
    assert shown(page) == both and booted.py(WORKER_CHATS)["chats"][chat] == both
    settled_record(page, chat, both)
    # A Send the worker refuses (far past the context) comes back in the box, before what was typed since.
    long = "word " * 400
    assert page.evaluate(SEND_THEN_TYPE, [long, "typed since"]) is True
    wait_until("the refused Send back in the box", lambda: page.input_value("#prompt") != "typed since")
    assert page.input_value("#prompt") == long + "\ntyped since"
    assert page.evaluate("document.documentElement.dataset.chatError")
    assert shown(page) == both and booted.py(WORKER_CHATS)["chats"][chat] == both
    reload_app(page)
    page.locator(f'#chat-list button[data-chat="{chat}"]').click()
    assert shown(page) == both == saved_messages(page, chat)
    assert booted.py(WORKER_CHATS)["chats"][chat] == both
    page.fill("#prompt", "")


def test_a_late_session_saved_does_not_bring_a_deleted_chat_back(app):
    booted, page = app, app.page
    chat = new_chat(page)
    show_settings(page)
    page.fill("#set-max-tokens", "3")
    previous = raw_last_turn(page)
    page.fill("#prompt", "soon gone")
    page.press("#prompt", "Enter")
    wait_next_turn(page, previous)
    # The session-saved the worker would post for it now, kept to be posted once more after the delete.
    booted.py("from pagedkv_app.main import state\n"
              f"_c = state['service'].sessions[{chat!r}]\n_m, _i, _t = _c.conversation.checkpoint()\n"
              "state['late'] = dict(chat=_c.session_id, checkpoint=[list(_m), list(_i), _t],"
              " before_reply=None)\n'1'")
    assert delete_current(page) == chat
    page.wait_for_selector(f'#chat-list button[data-chat="{chat}"]', state="detached", timeout=1_000)
    # The late save, through the page's one router (exec-result comes after it, on the same channel).
    booted.py("from pagedkv_app import bridge\nfrom pagedkv_app.main import state\n"
              "bridge.post('session-saved', **state.pop('late'))\n'1'")
    assert chat not in listed(page)
    page.wait_for_timeout(300)
    assert chat not in records(page)
    reload_app(page)
    assert chat not in listed(page) and chat not in records(page)


# The moment `finishing`'s reply ends (its turn-end drawn), `streaming` is opened and deleted: what the page shows
# right after the click (confirm() is answered by the test's dialog handler) is recorded in window.deleteSeen.
DELETE_WHEN_THE_OTHER_ENDS = """([finishing, streaming]) => {
  const button = () => document.querySelector(`#chat-list button[data-chat="${streaming}"]`);
  const seen = new MutationObserver(() => {
    const turn = JSON.parse(document.documentElement.dataset.lastTurn || "{}");
    if (turn.chat !== finishing) return;
    seen.disconnect();
    const busy = !!button()?.classList.contains("busy");
    button().click();
    document.getElementById("delete-chat").click();
    window.deleteSeen = { busy, listed: !!button(), anyBusy: !!document.querySelector("#chat-list button.busy") };
  });
  seen.observe(document.documentElement, { attributes: true, attributeFilter: ["data-last-turn"] });
}"""


# Each engine step of the worker made 20 ms longer (the CPU spent, as a step's products would): the tiny model
# alone streams ~600 tokens a second here, faster than the page can open the second chat and send its prompt.
SLOW_STEPS = """from pagedkv_app.main import state
import time
_engine = state["engine"]
_step = type(_engine).step
async def _slow_step(*args, **kwargs):
    _t = time.perf_counter()
    while time.perf_counter() - _t < 0.02:
        pass
    return await _step(_engine, *args, **kwargs)
_engine.step = _slow_step
'1'"""


def test_delete_while_streaming_as_another_chat_finishes_is_at_once_and_frees_every_block(app):
    booted, page = app, app.page
    booted.py(SLOW_STEPS)
    try:
        delete_while_streaming_as_another_chat_finishes(booted, page)
    finally:
        booted.py("from pagedkv_app.main import state\ndel state['engine'].step\n'1'")


def start_a_long_reply(page) -> str:
    """A new chat asked for a reply that runs to the end of the tiny model's 256-token context; its id."""
    show_settings(page)
    chat = new_chat(page)
    page.fill("#set-temperature", "1.1")  # seed 4 at 1.1: a long reply
    page.fill("#set-seed", "4")
    page.fill("#set-max-tokens", "2000")
    page.fill("#prompt", "a long one")
    page.press("#prompt", "Enter")
    return chat


def delete_while_streaming_as_another_chat_finishes(booted, page):
    streaming = start_a_long_reply(page)
    finishing = new_chat(page)
    page.fill("#set-temperature", "0")
    page.fill("#set-max-tokens", "8")
    page.evaluate(DELETE_WHEN_THE_OTHER_ENDS, [finishing, streaming])
    page.once("dialog", lambda d: d.accept())
    page.fill("#prompt", "a short one")
    page.press("#prompt", "Enter")
    seen = wait_until("the delete as the other chat ends", lambda: page.evaluate("window.deleteSeen || null"))
    # It was streaming when Delete was clicked, and was gone from the list, busy or not, right after the click.
    assert seen == {"busy": True, "listed": False, "anyBusy": False}, seen
    def worker_done():  # the worker: the reply stopped, its chat gone
        state = booted.py(WORKER_CHATS)
        return state if streaming not in state["chats"] and not state["unfinished"] else None
    worker = wait_until("the worker forgets the deleted chat", worker_done, lambda: booted.py(WORKER_CHATS))
    assert streaming not in worker["chats"] and not worker["unfinished"] and worker["leaked"] == 0, worker
    assert memory_when_idle(page)["used"] == 0
    page.wait_for_timeout(300)
    assert streaming not in records(page) and streaming not in listed(page)
    assert page.locator("#chat-list button.busy").count() == 0
    assert json.loads(raw_last_turn(page))["chat"] == finishing  # no turn-end of the deleted chat was shown


# A text pasted into the box and sent, in one task of the page.
PASTE_AND_SEND = """(text) => {
  const box = document.getElementById("prompt");
  box.value = text;
  box.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
  return box.value === "";
}"""

# A task of the worker's own loop noting, each time it runs, whether chat's turn is being prepared (ChatService's
# sliced send) and the engine's steps so far, when either changed; it ends once a preparation has ended (or after
# 120 s). It runs between two slices of the preparation, as the engine's steps do.
WATCH_PREPARING = """import asyncio, time
from pagedkv_app.main import state
state["seen"] = []
async def _watch(chat):
    service, engine, seen, t0 = state["service"], state["engine"], state["seen"], time.monotonic()
    while time.monotonic() - t0 < 120:
        held = service.sessions.get(chat)
        now = [getattr(held, "preparing", None) is not None, engine.stats()["steps"]]
        if not seen or seen[-1] != now:
            seen.append(now)
        if not now[0] and any(p for p, _ in seen):
            return
        await asyncio.sleep(0)
state["watch"] = asyncio.ensure_future(_watch({chat!r}))
'1'"""


def test_a_long_paste_is_prepared_while_another_chat_streams(app):
    """A 300k-character paste (far past the tiny model's 256-token context) sent while another chat streams: the
    worker prepares it in slices, answering other messages and stepping the streaming chat between two, then
    refuses it; the text comes back in the box and the histories are as they were. Before, the send was
    prepared at once: nothing else ran in the worker until its refusal."""
    booted, page = app, app.page
    booted.py(SLOW_STEPS)  # the streaming chat's reply lasts seconds
    try:
        streaming = start_a_long_reply(page)
        page.wait_for_selector("html[data-generating=true]", state="attached")
        pasted = new_chat(page)
        booted.py(WATCH_PREPARING.format(chat=pasted))
        paste = " ".join(f"w{i:06d}x" for i in range(33_000))  # distinct words: none comes from the BPE cache
        assert page.evaluate(PASTE_AND_SEND, paste) is True
        wait_until("the refused paste back in the box", lambda: page.input_value("#prompt") == paste,
                   lambda: page.input_value("#prompt")[:80])
        assert "context is 256" in page.evaluate("document.documentElement.dataset.chatError")
        seen = booted.py("import json\nfrom pagedkv_app.main import state\njson.dumps(state['seen'])")
        steps = [n for preparing, n in seen if preparing]  # the engine's steps while the paste was prepared
        assert len(steps) >= 2 and steps[-1] > steps[0], seen
        assert booted.py(WORKER_CHATS)["chats"].get(pasted, []) == [] and shown(page) == []
        page.fill("#prompt", "")
        # the streaming chat stopped, or over already (its reply runs to the context's end)
        booted.py(f"from pagedkv_app.main import state\nstate['service'].stop({streaming!r})\n'1'")
        wait_until("the streaming chat stopped", lambda: not booted.py(WORKER_CHATS)["unfinished"])
    finally:
        booted.py("from pagedkv_app.main import state\ndel state['engine'].step\n"
                  "if 'watch' in state:\n    state.pop('watch').cancel()\n'1'")
