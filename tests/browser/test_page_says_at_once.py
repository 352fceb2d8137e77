"""The page tells the truth at once: saved chats before Python starts, a notice when chats cannot be saved, a
clear refusal of text that is not text, the chats in the order they were made, the model's state and why its
backend was chosen, and no test model offered to a person."""
from __future__ import annotations

import json
import re

import pytest

from browser_pages import BOOT_TIMEOUT_MS, open_app, show_settings
from test_chat_app import raw_last_turn, send_and_wait, wait_next_turn
from test_chat_records import PUT_RECORDS, records, reload_app, titles, wait_turn_saved

QUERY = "?model=tiny-random&backend=cpu"


def dataset(page) -> dict:
    return page.evaluate("({...document.documentElement.dataset})")


def hold(page, pattern: str) -> list:
    """Hold back requests matching `pattern` until release(held) (a worker's requests too)."""
    held = []
    page.route(pattern, lambda route: route.continue_() if held and held[0] is None else held.append(route))
    return held


def release(held: list) -> None:
    routes = list(held)
    held.insert(0, None)  # later requests go through
    for route in routes:
        route.continue_()


# ------------------------------------------------------------------ saved chats before Python starts


def test_saved_chats_are_listed_and_readable_before_python_starts(browser, base_url):
    booted, _ = open_app(browser, base_url + QUERY, 60_000)
    page = booted.page
    try:
        first = send_and_wait(page, "Remember me.", 4)
        wait_turn_saved(page, "chat-1", first["history_tokens"])
        held = hold(page, "**/pyodide/pyodide.js")  # the worker cannot start Python until it is released
        page.reload(wait_until="commit")
        page.wait_for_selector("#chat-list li", state="attached", timeout=30_000)
        for _ in range(50):
            if held:
                break
            page.wait_for_timeout(100)
        state = dataset(page)
        assert held and state["state"] == "booting" and state["model"] == "loading" and state["saved"] == "1"
        assert page.locator("#chat-app").is_visible() and page.locator("#boot").is_visible()
        assert titles(page) == ["Chat 1"] and page.locator("#chat-title").inner_text() == "Chat 1"
        assert page.locator("#messages .msg").all_inner_texts()[0] == "Remember me."
        assert page.locator("#messages .msg.assistant").get_attribute("data-text") == first["content"]
        assert page.locator("#rename-chat").is_disabled() and page.locator("#regenerate").is_disabled()
        # A message typed now waits in its chat, and is answered there once the model is in.
        show_settings(page)
        page.fill("#set-temperature", "0")
        page.fill("#set-max-tokens", "4")
        page.fill("#prompt", "Still here?")
        page.press("#prompt", "Enter")
        assert page.locator("#messages .msg.user.pending").get_attribute("data-text") == "Still here?"
        release(held)
        turn = wait_next_turn(page, "")
        assert turn["reason"] == "length" and turn["tokens"] == 4 and turn["chat"] == "chat-1"
        assert turn["history_tokens"] > first["history_tokens"]
        assert page.locator("#messages .msg.user").all_inner_texts() == ["Remember me.", "Still here?"]
        saved = wait_turn_saved(page, "chat-1", turn["history_tokens"])
        assert [m["text"] for m in saved["messages"]] == ["Remember me.", first["content"], "Still here?",
                                                          turn["content"]]
        assert len(saved["checkpoint"][1]) == turn["history_tokens"]
    finally:
        page.close()


# ------------------------------------------------------------------ no IndexedDB

NO_INDEXEDDB = """IDBFactory.prototype.open = function () {
  throw new DOMException("access to the Indexed Database API is denied in this context.", "SecurityError");
};"""


def test_a_page_that_cannot_save_chats_says_so_and_still_chats(browser, base_url):
    page = browser.new_page()
    page.set_default_timeout(BOOT_TIMEOUT_MS)
    try:
        page.add_init_script(NO_INDEXEDDB)
        page.goto(base_url + QUERY)
        notice = page.locator("#save-notice")
        notice.wait_for(state="visible", timeout=30_000)
        assert notice.inner_text() == ("Chats cannot be saved in this browser, so they will be lost when this page "
                                       "reloads or closes (IndexedDB: access to the Indexed Database API is denied "
                                       "in this context).")
        assert notice.get_attribute("role") == "alert" and dataset(page)["store"] == "unavailable"
        page.wait_for_selector("html[data-model=ready][data-restored='0']", state="attached")
        page.wait_for_selector("#chat-list li", state="attached")
        assert titles(page) == ["Chat 1"]
        turn = send_and_wait(page, "Hello anyway.", 4)
        assert turn["reason"] == "length" and turn["tokens"] == 4
        assert page.locator("#messages .msg.user").all_inner_texts() == ["Hello anyway."]
        assert notice.is_visible()
    finally:
        page.close()


# ------------------------------------------------------------------ creation order


def test_the_chat_list_keeps_the_order_chats_were_made_after_a_reload(browser, base_url):
    booted, _ = open_app(browser, base_url + QUERY, 60_000)
    page = booted.page
    try:
        made = [{"id": f"chat-{n}", "title": f"Chat {n}", "model": "tiny-random", "checkpoint": [[], [], ""],
                 "messages": []} for n in range(2, 13)]
        page.evaluate(PUT_RECORDS, made)
        for _ in range(100):  # the page's own chat-1 is written a moment after it is listed
            if "chat-1" in records(page):
                break
            page.wait_for_timeout(100)
        reload_app(page)
        order = [f"Chat {n}" for n in range(1, 13)]
        assert titles(page) == order
        assert booted.py("import json\nfrom pagedkv_app.main import state\njson.dumps(list(state['service'].sessions))") \
            == [f"chat-{n}" for n in range(1, 13)]
        page.locator("#new-chat").click()
        page.wait_for_selector("#chat-list li:nth-child(13) button[aria-current=true]", state="attached")
        assert titles(page) == [*order, "Chat 13"]
    finally:
        page.close()


# ------------------------------------------------------------------ one page, the backend auto chose


@pytest.fixture(scope="module")
def app(browser, base_url):
    booted, info = open_app(browser, base_url + "?model=tiny-random", 60_000)
    yield booted, info
    booted.page.close()


def test_model_detail_says_the_model_is_loaded(app):
    page = app[0].page
    detail = page.locator("#model-detail").inner_text()
    assert re.fullmatch(r"tiny-random: loaded in \d+\.\d s", detail), detail
    assert "verifying" not in detail and page.locator("#model-loading").is_hidden()


def test_the_status_line_says_why_the_backend_was_chosen(app):
    booted, info = app
    adapter = json.loads(dataset(booted.page)["adapter"])
    assert info["backend"] == adapter["backend"] and info["backend_reason"] == adapter["backend_reason"]
    status = booted.page.locator("#chat-status").inner_text()
    assert status == (f"tiny-random on the {adapter['backend']} backend ({adapter['backend_reason']}), "
                      f"loaded in {info['load_ms'] / 1000:.1f} s")
    if adapter["backend"] == "cpu":  # auto chose the CPU because it is the faster path on this adapter
        assert adapter["backend_reason"].endswith(": numpy in the tab decodes faster there")
        assert "fallback" not in status and "slow" not in status


def test_the_test_model_is_listed_while_it_runs(app):
    page = app[0].page
    page.wait_for_selector("#model-list button[data-model='tiny-random']", state="attached")
    assert page.locator("#model-list button[data-model='tiny-random']").get_attribute("aria-current") == "true"


def test_a_page_that_can_save_chats_shows_no_notice(app):
    page = app[0].page
    assert page.locator("#save-notice").is_hidden() and dataset(page)["store"] == "open"


def test_a_lone_surrogate_is_refused_clearly_and_the_text_stays_in_the_box(app):
    page = app[0].page
    previous = raw_last_turn(page)
    show_settings(page)
    page.fill("#set-max-tokens", "4")
    page.fill("#set-temperature", "0")
    # Half of an emoji's UTF-16 pair (set in the page: it cannot cross Playwright's UTF-8 wire on its own).
    page.evaluate("document.getElementById('prompt').value = 'Hi \\uD83D there'")
    page.press("#prompt", "Enter")
    page.wait_for_selector("html[data-chat-error]", state="attached")
    status = page.locator("#chat-status").inner_text()
    assert re.fullmatch(r"ValueError: message \d \(user\) is not valid text: it holds a lone surrogate U\+D83D "
                        r"\(half of an emoji or other character\) after 'Hi '; delete that character and send it "
                        r"again", status), status
    assert page.evaluate("document.getElementById('prompt').value === 'Hi \\uD83D there'")
    assert page.locator("#messages .msg").count() == 0 and raw_last_turn(page) == previous
    page.fill("#prompt", "")
    turn = send_and_wait(page, "Hi there", 4)
    assert turn["tokens"] == 4 and page.locator("#messages .msg.user").all_inner_texts() == ["Hi there"]


# ------------------------------------------------------------------ test models behind ?test_models=1


@pytest.mark.parametrize(("query", "listed"), [
    ("?backend=cpu", ["gemma-3-270m", "smollm2-135m-instruct"]),
    ("?backend=cpu&test_models=1", ["gemma-3-270m", "smollm2-135m-instruct", "tiny-random", "tiny-random-wide"]),
])
def test_test_models_are_offered_only_with_test_models_1(browser, base_url, query, listed):
    page = browser.new_page()
    try:
        hold(page, "**/pyodide/pyodide.js")  # the list is the page's own: no Python, no model needed
        page.goto(base_url + query)
        page.wait_for_selector("#model-list button", state="attached", timeout=30_000)
        buttons = page.locator("#model-list button")
        assert [buttons.nth(i).get_attribute("data-model") for i in range(buttons.count())] == listed
    finally:
        page.close()
