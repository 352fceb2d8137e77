"""The chat page with two models in one engine (?models=tiny-random,tiny-random-wide, on the CPU path and on
WebGPU): a new chat talks to the model picked for it, chats of both models answer at the same time, the memory
panel says whose each chat's blocks are, and after a reload both chats go on (neither is read-only). The page's
engine is pagedkv.js's: the same engine answers OpenAI requests for either model beside the chats."""
from __future__ import annotations

import json

from browser_pages import open_app

import pytest

QUERY = "?model=tiny-random&models=tiny-random,tiny-random-wide&backend={}&budget_mib=16"
RESTORED = ("import json\nfrom pagedkv_app.main import state\n"
            "json.dumps(state['engine'].lane('tiny-random-wide').stats()['disk_restored_tokens'])")
API = """async () => {
  const e = window.pagedkv.engine;
  const ask = (model) => e.chat.completions.create({ model, max_tokens: 4, temperature: 0,
                                                     messages: [{ role: "user", content: "hi" }] });
  const [a, b] = await Promise.all([ask("tiny-random"), ask("tiny-random-wide")]);
  return { listed: (await e.models.list()).data.map((m) => m.id), models: [a.model, b.model],
           finish: [a.choices[0].finish_reason, b.choices[0].finish_reason] };
}"""
SESSIONS = ("import json\nfrom pagedkv_app.main import state\n"
            "json.dumps({k: s.model for k, s in state['service'].sessions.items()})")


@pytest.mark.parametrize("backend", ["cpu", "webgpu"])
def test_each_chat_talks_to_its_model_and_both_answer_at_once(browser, base_url, backend):
    booted, info = open_app(browser, base_url + QUERY.format(backend), 60_000)
    page = booted.page
    try:
        assert info["models"] == ["tiny-random", "tiny-random-wide"] and info["backend"] == backend
        api = page.evaluate(API)  # the page's own engine, as a library: both models answer
        assert api["listed"] == api["models"] == ["tiny-random", "tiny-random-wide"]
        assert all(f in ("stop", "length") for f in api["finish"])
        assert page.locator("#new-chat-model").is_visible()
        page.fill("#set-max-tokens", "150")  # both replies run to it (greedy, no stop token)
        page.fill("#set-temperature", "0")
        made = {}
        for model in ("tiny-random-wide", "tiny-random"):  # the slower model first: it is still answering later
            n = page.locator("#chat-list li").count()
            page.select_option("#new-chat-model", model)
            page.locator("#new-chat").click()
            page.wait_for_selector(f"#chat-list li:nth-child({n + 1}) button[aria-current=true]", state="attached")
            made[model] = page.locator(f"#chat-list li:nth-child({n + 1}) button").get_attribute("data-chat")
            page.fill("#prompt", f"a message for {model}")
            page.press("#prompt", "Enter")
        page.wait_for_selector("#chat-list:has(li:nth-last-child(1) button.busy):has(li:nth-last-child(2) button.busy)",
                               state="attached")
        owners = {}  # every chat the memory panel showed blocks of while they answered, with its model
        while page.locator("#chat-list button.busy").count():
            memory = json.loads(page.evaluate("document.documentElement.dataset.memory || 'null'") or "null")
            if memory and memory["owner_models"]:
                owners.update(zip(memory["owners"], memory["owner_models"]))
            page.wait_for_timeout(20)
        # snapshots come every 0.5 s: whichever chats they caught, each is shown with its own model
        assert owners and all(made[model] == chat for chat, model in owners.items()), owners
        sessions = booted.py(SESSIONS)
        assert sessions[made["tiny-random"]] is None and sessions[made["tiny-random-wide"]] == "tiny-random-wide"
        assert page.locator(f"#chat-list button[data-chat='{made['tiny-random-wide']}']").get_attribute(
            "data-model") == "tiny-random-wide"

        page.reload()  # both chats are this page's: neither is read-only, and each goes on with its model
        page.wait_for_selector("html[data-model=ready]", state="attached", timeout=240_000)
        page.wait_for_selector(f"#chat-list button[data-chat='{made['tiny-random-wide']}']", state="attached")
        assert page.locator("#chat-list button.foreign").count() == 0
        assert booted.py(SESSIONS)[made["tiny-random-wide"]] == "tiny-random-wide"
        # its next message finds the chat's blocks on disk: the second model has the disk tier too
        page.click(f"#chat-list button[data-chat='{made['tiny-random-wide']}']")
        page.evaluate("document.getElementById('settings').open = true")
        page.fill("#set-max-tokens", "8")  # the history has ~200 of the tiny models' 256 tokens
        page.fill("#prompt", "and once more")
        page.press("#prompt", "Enter")
        restored = 0
        for _ in range(600):
            restored = booted.py(RESTORED)
            if restored:
                break
            page.wait_for_timeout(100)
        assert restored >= 16
    finally:
        page.close()
