"""Fallback to a real OpenAI-compatible server (llama.cpp's, serving the same GGUF) when the tab cannot answer."""
from __future__ import annotations

import json
import threading

import pytest

import serve
from browser_pages import open_and_boot, show_settings, wait_model
from llama_server import MODEL_NAME, complete, llama_server
from model_fixtures import gguf_path  # noqa: F401  (fixture)
from test_chat_app import raw_last_turn, wait_for_streamed_text, wait_next_turn

PROMPT = "What is the capital of France?"
STORY = "Write a long story about a dragon."
MESSAGES = ("import json\nfrom pagedkv_app.main import state\n"
            "json.dumps(state['service'].sessions[{chat!r}].conversation.messages)")


@pytest.fixture(scope="module")
def llama(gguf_path):  # noqa: F811
    with llama_server(gguf_path) as origin:
        yield origin


@pytest.fixture(scope="module")
def site(llama):
    """dist/ served with the llama server's origin added to connect-src (build.py serve --allow-origin)."""
    server = serve.make_server("127.0.0.1", 0, allow_origins=(llama,))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def open_app(browser, url: str):
    booted = open_and_boot(browser, url)
    wait_model(booted)
    page = booted.page
    page.set_default_timeout(60_000)
    show_settings(page)
    page.fill("#set-temperature", "0")
    return booted


def set_fallback(page, url: str, mode: str = "auto") -> None:
    page.fill("#set-fallback-url", url)
    page.fill("#set-fallback-model", MODEL_NAME)
    page.select_option("#set-fallback-mode", mode)
    page.locator("#set-fallback-url").dispatch_event("change")


def send(page, text: str, max_tokens: int) -> str:
    previous = raw_last_turn(page)
    page.fill("#set-max-tokens", str(max_tokens))
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    return previous


def test_without_webgpu_the_reply_streams_from_llama_cpp(browser_without_webgpu, site, llama):
    booted = open_app(browser_without_webgpu, site + "?model=tiny-random")
    page = booted.page
    assert booted.dataset().get("webgpu") == "unavailable"
    set_fallback(page, llama)
    turn = wait_next_turn(page, send(page, PROMPT, 24))
    start = json.loads(page.evaluate("document.documentElement.dataset.lastStart"))
    assert start["engine"] == {"kind": "remote", "model": MODEL_NAME, "origin": llama,
                               "reason": "this browser has no WebGPU"}
    reply = page.locator("#messages .msg.assistant").last
    assert reply.get_attribute("data-engine") == "remote"
    assert reply.locator(".engine-badge").inner_text() == f"served remotely by {MODEL_NAME} @ {llama}"
    assert turn["reason"] in ("stop", "length") and turn["content"].strip()
    assert reply.get_attribute("data-text") == turn["content"]
    # Greedy decoding on the same server: the page's streamed text is the server's own answer.
    direct = complete(llama, {"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}],
                              "temperature": 0, "top_p": 0.95, "max_tokens": 24, "cache_prompt": False})
    assert turn["content"] == direct["choices"][0]["message"]["content"]
    assert turn["tokens"] == direct["usage"]["completion_tokens"]
    # The setting survives a reload (this browser only), and the next turn sends the whole history.
    page.reload()
    page.wait_for_selector("html[data-model=ready][data-restored]", state="attached", timeout=240_000)
    assert page.locator("#set-fallback-url").input_value() == llama
    # data-restored is set when the saved chats go to the worker; they are drawn when its chat list comes back.
    page.wait_for_selector("#messages .msg.assistant .engine-badge", state="attached")
    assert page.locator("#messages .msg.assistant .engine-badge").count() == 1
    booted.page.close()


def test_a_request_the_pool_cannot_hold_gets_a_message_then_the_server(browser, site, llama):
    # A 0.03 MiB KV pool holds 3 blocks of 16 tokens (8,192 B each on the CPU backend): the prompt (> 28 tokens)
    # plus 20 new tokens never fit.
    booted = open_app(browser, site + "?model=tiny-random&backend=cpu&kv_mib=0.03")
    page = booted.page
    assert json.loads(booted.dataset()["modelInfo"])["num_blocks"] == 3
    send(page, PROMPT, 20)
    page.wait_for_selector("html[data-chat-error]", state="attached")
    error = booted.dataset()["chatError"]
    assert "the KV pool only has 3 blocks (48 tokens)" in error and "set a fallback server" in error
    assert page.locator("#messages .msg").count() == 0  # nothing was added to the chat...
    assert page.locator("#prompt").input_value() == PROMPT  # ...and the text is back in the box

    set_fallback(page, llama)
    previous = raw_last_turn(page)
    page.press("#prompt", "Enter")
    turn = wait_next_turn(page, previous)
    start = json.loads(page.evaluate("document.documentElement.dataset.lastStart"))
    assert start["engine"]["kind"] == "remote" and "the KV pool only has 3 blocks" in start["engine"]["reason"]
    assert turn["content"].strip() and page.locator("#messages .msg").count() == 2
    memory = json.loads(page.evaluate("document.documentElement.dataset.memory"))
    assert memory["used"] == 0 and memory["free"] == 3  # the local pool was never touched

    # Stop works on a remote stream: the fetch is aborted and the partial reply kept.
    set_fallback(page, llama, mode="always")
    page.locator("#new-chat").click()
    page.wait_for_selector("#chat-list li:nth-child(2) button[aria-current=true]", state="attached")
    previous = send(page, STORY, 300)
    page.wait_for_selector("html[data-generating=true]", state="attached")
    wait_for_streamed_text(page, stop=True)
    turn = wait_next_turn(page, previous)
    assert turn["reason"] == "abort" and 0 < turn["tokens"] < 300
    assert "interrupted" in page.locator("#messages .msg.assistant").last.get_attribute("class")
    booted.page.close()


def test_a_reload_during_a_server_reply_keeps_it_in_the_history(browser, site, llama):
    # The page saves the ids that come with each server token; the reloaded worker restores the reply from them.
    booted = open_app(browser, site + "?model=tiny-random&backend=cpu")
    page = booted.page
    set_fallback(page, llama, mode="always")
    send(page, STORY, 300)
    page.wait_for_selector("html[data-generating=true]", state="attached")
    wait_for_streamed_text(page)
    page.wait_for_timeout(400)  # a streaming reply is saved every 300 ms
    chat_id = json.loads(page.evaluate("document.documentElement.dataset.lastStart"))["chat"]
    page.reload()
    page.wait_for_selector("html[data-model=ready][data-restored]", state="attached", timeout=240_000)
    last = page.locator("#messages .msg.assistant").last
    shown = last.get_attribute("data-text")
    assert "interrupted" in last.get_attribute("class") and shown
    assert booted.py(MESSAGES.format(chat=chat_id)) == [{"role": "user", "content": STORY},
                                                        {"role": "assistant", "content": shown}]
    booted.page.close()
