"""A lost GPU device mid-reply: the page says so, the engine is rebuilt on a new device inside the same
budget, and the reply carries on from its token history to exactly what an uninterrupted run gives."""
from __future__ import annotations

import json

import pytest

from browser_pages import open_app
from test_chat_app import raw_last_turn, wait_next_turn

STATE = "import json\nfrom pagedkv_app.main import state\n"


@pytest.fixture(scope="module")
def gpu_app(browser, base_url):
    booted, info = open_app(browser, base_url + "?model=tiny-random&backend=webgpu&budget_mib=64&kv_dtype=int8",
                            120_000)
    assert info["backend"] == "webgpu" and info["kv_dtype"] == "int8"
    assert booted.page.locator("#mem-kv-dtype").input_value() == "int8"
    yield booted, info
    booted.page.close()


def test_lost_device_is_rebuilt_and_the_reply_resumes(gpu_app):
    booted, info = gpu_app
    page = booted.page
    page.fill("#set-max-tokens", "48")
    page.fill("#set-temperature", "0")
    previous = raw_last_turn(page)
    page.fill("#prompt", "Tell me a story about paged memory.")
    page.press("#prompt", "Enter")
    reply = page.locator("#messages .msg.assistant").last
    for _ in range(3000):  # a few tokens streamed before the device goes away
        if len(booted.py(STATE + "json.dumps(state['engine'].request(state['service'].sessions['chat-1'].request_id)"
                         ".output_ids if state['service'].sessions['chat-1'].request_id else [])")) >= 3:
            break
        page.wait_for_timeout(50)
    before = booted.py(STATE + "ctx = state['gpu']\nctx.device.destroy()\n"
                       "json.dumps({'streamed': len(state['service'].sessions['chat-1'].partial_ids),"
                       " 'blocks': state['engine'].kv.pool.num_blocks})")
    assert before["streamed"] >= 3
    page.wait_for_selector("html[data-device=restored]", state="attached", timeout=240_000)
    assert "1 reply(ies) resumed" in page.locator("#chat-status").inner_text()
    turn = wait_next_turn(page, previous)
    assert turn["tokens"] > before["streamed"] and reply.get_attribute("data-text") == turn["content"]

    after = booted.py(STATE + "e = state['engine']\nl = e.backend.ledger.snapshot()\n"
                      "json.dumps({'lost': state['gpu'].lost_reason, 'blocks': e.kv.pool.num_blocks, 'dtype': e.kv_dtype,"
                      " 'used': l['used_bytes'], 'budget': l['budget_bytes'], 'free': e.kv.pool.num_free,"
                      " 'cached': e.kv.pool.num_cached})")
    assert after["lost"] is None and after["blocks"] == before["blocks"]  # same budget and dtype -> same pool
    assert after["dtype"] == "int8"
    assert after["used"] <= after["budget"] == 64 << 20
    assert after["free"] + after["cached"] == after["blocks"]

    # Greedy: answering the same prompt again on the new device gives the same reply token for token.
    previous = raw_last_turn(page)
    page.locator("#regenerate").click()
    again = wait_next_turn(page, previous)
    assert again["content"] == turn["content"] and again["tokens"] == turn["tokens"]
