"""The real SmolLM2-135M on WebGPU, as a person uses it: two turns, streamed, turn 2 prefills only its new tokens."""
from __future__ import annotations

import json
import re

import pytest

from browser_pages import open_and_boot, open_app, show_settings, wait_model

ENGINE_STATS = "import json\nfrom pagedkv_app.main import state\njson.dumps(state['engine'].stats())"


@pytest.fixture(scope="module")
def real_app(browser, base_url):
    booted, info = open_app(browser, base_url + "?budget_mib=1024&backend=webgpu", 300_000)
    yield booted, info
    booted.page.close()


# Every memory-panel update from here until the turn ends, in the page's own order (a MutationObserver, not a poll:
# a short turn on a fast path ended before a 50 ms poll saw one, once in a fresh-clone run).
RECORD_MEMORY = """() => {
  window.__turnMemory = [];
  let done = false;
  new MutationObserver((records, observer) => {
    for (const r of records) {
      if (r.attributeName === "data-last-turn") { done = true; observer.disconnect(); return; }
      if (!done) window.__turnMemory.push(document.documentElement.dataset.memory);
    }
  }).observe(document.documentElement, { attributes: true, attributeFilter: ["data-memory", "data-last-turn"] });
}"""


def run_turn(booted, text: str, max_tokens: int) -> tuple[dict, dict, list[str], list[dict]]:
    """Send `text`; return the turn-end and turn-start messages, the assistant texts seen while streaming,
    and the memory panel's numbers polled meanwhile."""
    page = booted.page
    previous = page.evaluate("document.documentElement.dataset.lastTurn || ''")
    page.fill("#set-temperature", "0")
    page.fill("#set-max-tokens", str(max_tokens))
    page.fill("#prompt", text)
    page.evaluate(RECORD_MEMORY)
    page.press("#prompt", "Enter")
    seen = []
    for _ in range(6000):
        if page.evaluate("document.documentElement.dataset.lastTurn || ''") != previous:
            start = json.loads(page.evaluate("document.documentElement.dataset.lastStart"))
            memory = [json.loads(m or "null") for m in page.evaluate("window.__turnMemory")]
            return json.loads(page.evaluate("document.documentElement.dataset.lastTurn")), start, seen, memory
        current = page.locator("#messages .msg.assistant").last.get_attribute("data-text") if \
            page.locator("#messages .msg.assistant").count() else None
        if current and (not seen or seen[-1] != current):
            seen.append(current)
        page.wait_for_timeout(50)
    raise AssertionError("the turn did not end")


def test_two_turns_stream_and_turn_two_prefills_only_new_tokens(real_app):
    booted, info = real_app
    assert info["model"] == "smollm2-135m-instruct" and info["backend"] == "webgpu"
    before = booted.py(ENGINE_STATS)
    turn1, start1, seen1, _ = run_turn(booted, "What is the capital of France?", 6)
    assert turn1["tokens"] == 6 and turn1["content"].startswith("The capital of France")
    assert len(seen1) >= 2  # the reply grew in the page before the turn ended
    mid = booted.py(ENGINE_STATS)
    assert start1["cached_tokens"] == 0
    assert mid["prefill_tokens"] - before["prefill_tokens"] == start1["prompt_tokens"] == 37
    turn2, start2, _, memory = run_turn(booted, "And of Italy?", 4)
    after = booted.py(ENGINE_STATS)
    # Turn 2's prompt starts with turn 1's exact tokens; only what the prefix cache lacks is computed.
    assert turn2["cached_tokens"] == (turn1["history_tokens"] // 16) * 16 >= 32
    assert after["prefill_tokens"] - mid["prefill_tokens"] == start2["prompt_tokens"] - turn2["cached_tokens"]
    assert start2["prompt_tokens"] - turn2["cached_tokens"] < start2["prompt_tokens"] - turn1["history_tokens"] + 16
    # While it answered, the dashboard showed this chat's blocks.
    facts = booted.page.locator("#memory-facts").inner_text()
    assert "23,040 B (f16)" in facts and re.search(r"weights 92\.\d · kv \d+\.\d", facts)  # the ledger, by kind
    busy = [m for m in memory if m and m["used"] > 0]
    assert busy and busy[-1]["owners"] and sum(busy[-1]["per_chat"].values()) >= 3


def test_real_model_answers_on_the_cpu_fallback_without_webgpu(browser_without_webgpu, base_url):
    # No WebGPU adapter: the page says so and SmolLM2 still answers, slowly, on numpy inside Pyodide.
    booted = open_and_boot(browser_without_webgpu, base_url)
    try:
        assert booted.dataset()["webgpu"] == "unavailable"
        info = wait_model(booted)
        assert info["model"] == "smollm2-135m-instruct" and info["backend"] == "cpu"
        page = booted.page
        page.set_default_timeout(300_000)
        assert "CPU fallback: slow" in page.locator("#chat-status").inner_text()
        show_settings(page)
        turn, start, _, _ = run_turn(booted, "Explain what a hash table is in two sentences.", 3)
        assert start["prompt_tokens"] == 40 and turn["tokens"] == 3
        assert turn["content"] == "A hash table"  # llama.cpp's greedy start (tests/golden: margins 4.6 to 8.5)
    finally:
        booted.page.close()
