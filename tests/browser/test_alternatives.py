""""Show 3 alternatives" as a person uses it (tiny model, WebGPU): after a reply, the button samples three
replies at once (one request, n = 3, its samples sharing the prompt's blocks), they show side by side, and
keeping one makes it the reply in the page and in the worker's token history."""
from __future__ import annotations

import json

import pytest

from browser_pages import open_and_boot, show_settings, wait_model
from test_chat_app import send_and_wait

HISTORY = ("import json\nfrom pagedkv_app.main import state\nc = state['service'].sessions[{chat!r}]\n"
           "json.dumps({{'messages': c.conversation.messages, 'ids': c.conversation.ids, "
           "'engine': state['engine'].stats()}})")


@pytest.fixture(scope="module")
def app(browser, base_url):
    booted = open_and_boot(browser, base_url + "?model=tiny-random&backend=webgpu")
    assert booted.state == "ready"
    info = wait_model(booted)
    booted.page.set_default_timeout(60_000)
    show_settings(booted.page)
    yield booted, info
    booted.page.close()


def poll_dataset(page, key: str, previous: str = "") -> dict:
    for _ in range(3000):  # the page's CSP forbids wait_for_function's eval: poll
        raw = page.evaluate(f"document.documentElement.dataset.{key} || ''")
        if raw and raw != previous:
            return json.loads(raw)
        page.wait_for_timeout(100)
    raise AssertionError(f"data-{key} never changed")


def test_three_alternatives_side_by_side_and_keep_one(app):
    booted, info = app
    page = booted.page
    assert info["backend"] == "webgpu"
    turn = send_and_wait(page, "Tell me a story.", 6)
    chat_id = page.evaluate("document.documentElement.dataset.chat")
    before = booted.py(HISTORY.format(chat=chat_id))
    assert not page.locator("#alternatives").is_disabled()

    page.fill("#set-temperature", "0.9")
    page.fill("#set-seed", "3")
    page.fill("#set-max-tokens", "8")
    page.click("#alternatives")
    end = poll_dataset(page, "alternatives")
    assert end["chat"] == chat_id and end["reason"] == "done" and end["tokens"] == [8, 8, 8]
    sections = page.locator("#alternatives-panel .alternative")
    assert sections.count() == 3 and page.locator("#alternatives-panel").is_visible()
    texts = [sections.nth(i).get_attribute("data-text") for i in range(3)]
    assert texts == end["alternatives"] and len(set(texts)) == 3
    # The current reply stays until one is kept; the prompt was prefilled once for the three samples.
    assert page.locator("#messages .msg.assistant").last.get_attribute("data-text") == turn["content"]
    during = booted.py(HISTORY.format(chat=chat_id))
    assert during["ids"] == before["ids"]
    assert during["engine"]["decode_tokens"] - before["engine"]["decode_tokens"] == 3 * 7
    assert during["engine"]["used_blocks"] == 0

    page.locator("#alternatives-panel .keep-alternative").nth(1).click()
    kept = poll_dataset(page, "altKept")
    assert kept["index"] == 1 and kept["content"] == texts[1]
    assert page.locator("#messages .msg.assistant").last.get_attribute("data-text") == texts[1]
    assert page.locator("#alternatives-panel").is_hidden()
    after = booted.py(HISTORY.format(chat=chat_id))
    assert after["messages"][-1] == {"role": "assistant", "content": texts[1]}
    assert len(after["ids"]) == kept["history_tokens"] != len(before["ids"])
    # The next turn continues from the kept reply's exact ids: its whole history's full blocks are cached.
    nxt = send_and_wait(page, "And then?", 4)
    assert nxt["cached_tokens"] == len(after["ids"]) // 16 * 16 > 0
