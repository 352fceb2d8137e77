"""The chat as a person uses it: type, press Enter, watch the reply stream, stop it, open a second chat."""
from __future__ import annotations

import json

import pytest

from browser_pages import open_app, show_settings, wait_until

APP_QUERY = "?model=tiny-random&backend=cpu"


@pytest.fixture(scope="module")
def app(browser, base_url):
    booted, info = open_app(browser, base_url + APP_QUERY, 60_000)
    yield booted, info
    booted.page.close()


def last_turn(page) -> dict:
    return json.loads(page.evaluate("document.documentElement.dataset.lastTurn"))


def raw_last_turn(page) -> str:
    return page.evaluate("document.documentElement.dataset.lastTurn || ''")


def wait_next_turn(page, previous: str) -> dict:
    for _ in range(3000):  # poll: the page's CSP (kept on in tests) forbids wait_for_function's eval
        if raw_last_turn(page) != previous:
            return last_turn(page)
        page.wait_for_timeout(100)
    raise AssertionError("no turn ended")


STREAMED_TEXT = """([stop, send]) => new Promise((resolve, reject) => {
  const button = document.getElementById("stop");
  const check = () => {  // the last message shown is a reply with text
    const shown = document.querySelectorAll("#messages .msg");
    const last = shown[shown.length - 1];
    if (!last || !last.classList.contains("assistant") || !last.dataset.text) return false;
    if (button.disabled) reject(new Error("the reply ended before the test could act on it"));
    else { if (stop) button.click(); resolve(); }
    return true;
  };
  if (send) {  // Enter in the same task: no message of the worker lands before the observer below watches
    document.getElementById("prompt").dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
  }
  if (check()) return;
  const seen = new MutationObserver(() => { if (check()) { seen.disconnect(); clearTimeout(late); } });
  const late = setTimeout(() => { seen.disconnect(); reject(new Error("no text streamed in 60 s")); }, 60000);
  seen.observe(document.getElementById("messages"), {subtree: true, childList: true, attributes: true});
})"""


def wait_for_streamed_text(page, stop: bool = False, send: bool = False) -> None:
    """Wait, inside the page, until the reply being generated shows text; with `stop`, click Stop right then;
    with `send`, press Enter in the box first, in the same task of the page.

    Polling from the test costs Playwright round trips, and on a busy machine the tiny model can finish its
    whole reply between a poll and the next action (CI saw Stop already disabled, and once a whole reply begin
    and end between a press of Enter and the wait for it to start). Fails if the reply has already ended when its
    text is seen."""
    page.evaluate(STREAMED_TEXT, [stop, send])


def send_and_wait(page, text: str, max_tokens: int) -> dict:
    previous = raw_last_turn(page)
    show_settings(page)
    page.fill("#set-max-tokens", str(max_tokens))
    page.fill("#set-temperature", "0")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    return wait_next_turn(page, previous)


def test_model_loads_and_a_reply_streams_into_the_page(app):
    booted, info = app
    page = booted.page
    assert info["model"] == "tiny-random" and info["backend"] == "cpu"
    turn = send_and_wait(page, "Hello there!", 8)
    assert turn["reason"] == "length" and turn["tokens"] == 8
    messages = page.locator("#messages .msg")
    assert messages.nth(0).inner_text() == "Hello there!"
    assert "user" in messages.nth(0).get_attribute("class")
    assert messages.nth(1).get_attribute("data-text") == turn["content"]
    assert page.locator("#chat-status").inner_text().startswith("tiny-random on the cpu backend")


def test_second_turn_reuses_the_first_from_the_prefix_cache(app):
    page = app[0].page
    first = last_turn(page)
    turn = send_and_wait(page, "And then?", 8)
    assert turn["cached_tokens"] == (first["history_tokens"] // 16) * 16 > 0
    assert page.locator("#messages .msg").count() == 4


def memory_when_idle(page) -> dict:
    """The panel's numbers once the final snapshot after a turn has arrived (no block in use)."""
    for _ in range(600):
        memory = json.loads(page.evaluate("document.documentElement.dataset.memory || 'null'") or "null")
        if memory and memory["used"] == 0:
            return memory
        page.wait_for_timeout(100)
    raise AssertionError(f"memory panel never showed an idle pool: {memory}")


def test_memory_panel_draws_the_block_map(app):
    page = app[0].page
    memory_when_idle(page)
    # The map and the panel's numbers come from one render (renderMemory): read them together, since a later
    # snapshot (the blocks a finished turn leaves cached) may redraw both at any moment.
    raw, label = page.evaluate("[document.documentElement.dataset.memory, "
                               "document.getElementById('block-map').getAttribute('aria-label')]")
    memory = json.loads(raw)
    assert memory["used"] + memory["cached"] + memory["free"] == memory["total"]
    assert memory["cached"] > 0  # the finished turns' full blocks stay cached
    assert f"{memory['cached']} cached" in label
    facts = page.locator("#memory-facts").inner_text()
    assert "Prefix-cache hit rate" in facts
    # The tiny model (2 layers x 2 KV heads x 16 dims, f32 K and V on the CPU backend): 512 B per token.
    assert "512 B (f32) · 8 KiB per block" in facts


INJECTION = '<img src=x onerror="document.title=\'pwned\'"><script>document.title=\'pwned2\'</script>'


def test_text_is_shown_literally_and_runs_nothing(app):
    page = app[0].page
    dialogs = []

    def on_dialog(dialog):
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    title = page.title()
    try:
        send_and_wait(page, INJECTION, 2)
    finally:
        page.remove_listener("dialog", on_dialog)
    user = page.locator("#messages .msg.user").last
    assert user.inner_text() == INJECTION
    assert page.locator("#messages img, #messages script").count() == 0
    # The reply renderer (markdown-it, html: false) escapes raw HTML as text; its own tags only.
    html = page.evaluate("t => window.pagedkv.renderMarkdown(t)", "**bold** and `x<y`\n- one\n- two\n```py\nprint('<b>')\n```\n" + INJECTION)
    assert html == ("<p><strong>bold</strong> and <code>x&lt;y</code></p>\n<ul>\n<li>one</li>\n<li>two</li>\n</ul>\n"
                    "<pre><code>print('&lt;b&gt;')\n</code></pre>\n<p>&lt;img src=x onerror=&quot;document.title='pwned'&quot;"
                    "&gt;&lt;script&gt;document.title='pwned2'&lt;/script&gt;</p>\n")
    assert page.title() == title and dialogs == []


def test_regenerate_answers_the_same_prompt_again(app):
    page = app[0].page
    first = send_and_wait(page, "Say something.", 6)
    count = page.locator("#messages .msg").count()
    previous = raw_last_turn(page)
    page.locator("#regenerate").click()
    again = wait_next_turn(page, previous)
    # Greedy: the same reply; the prompt's full blocks came from the prefix cache; no new user message.
    assert again["content"] == first["content"] and again["cached_tokens"] >= 16
    assert page.locator("#messages .msg").count() == count


def test_stop_keeps_the_partial_reply(app):
    page = app[0].page
    n = page.locator("#chat-list li").count()
    page.locator("#new-chat").click()  # room for a long reply: the tiny model's context is only 256 tokens
    page.wait_for_selector(f"#chat-list li:nth-child({n + 1}) button[aria-current=true]", state="attached")
    page.fill("#set-max-tokens", "2000")
    page.fill("#prompt", "Tell me everything.")
    wait_for_streamed_text(page, stop=True, send=True)
    page.wait_for_selector("html[data-generating=false]", state="attached")
    page.wait_for_selector("#messages .msg.assistant.interrupted", state="attached")
    turn = last_turn(page)
    assert turn["reason"] == "abort" and turn["tokens"] < 2000
    assert page.locator("#messages .msg.assistant").last.get_attribute("data-text") == turn["content"]


# Two new chats and a Send in each, in one task of the page: both reach the worker before it can run a step, so
# the two replies decode together however loaded the machine is (the tiny model's reply can be over before a
# second Send from the test's next call). The turns that end from then on are kept in window.turnsEnded.
TWO_CHATS_AT_ONCE = """(names) => {
  const root = document.documentElement;
  window.turnsEnded = [];
  new MutationObserver(() => window.turnsEnded.push(JSON.parse(root.dataset.lastTurn).chat))
    .observe(root, { attributes: true, attributeFilter: ["data-last-turn"] });
  const box = document.getElementById("prompt");
  for (const name of names) {
    document.getElementById("new-chat").click();
    box.value = name;
    box.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
  }
  return [...document.querySelectorAll("#chat-list li button")].slice(-2).map((b) => b.dataset.chat);
}"""


def test_two_chats_answer_at_the_same_time(app):
    booted = app[0]
    page = booted.page
    before = booted.py("import json\nfrom pagedkv_app.main import state\njson.dumps(state['engine'].stats())")
    steps_before, decode_before = before["steps"], before["decode_tokens"]
    page.fill("#set-max-tokens", "200")
    n = page.locator("#chat-list li").count()
    chats = page.evaluate(TWO_CHATS_AT_ONCE, ["first chat", "second chat"])  # the tiny model's context: 256
    assert len(set(chats)) == 2 and page.locator("#chat-list li").count() == n + 2 == 4
    wait_until("both chats' turns ended", lambda: set(chats) <= set(page.evaluate("window.turnsEnded")),
               lambda: page.evaluate("window.turnsEnded"), timeout_s=240)
    stats = booted.py("import json\nfrom pagedkv_app.main import state\njson.dumps(state['engine'].stats())")
    # Their decode tokens shared forward steps: fewer steps than tokens generated.
    assert stats["steps"] - steps_before < stats["decode_tokens"] - decode_before


def test_delete_frees_the_chats_cached_blocks(app):
    page = app[0].page
    before = memory_when_idle(page)
    n = page.locator("#chat-list li").count()
    page.locator("#chat-list li:nth-child(3) button").click()  # "first chat" of the two-chats test
    page.once("dialog", lambda d: d.accept())
    page.locator("#delete-chat").click()
    page.wait_for_selector(f"#chat-list li:nth-child({n})", state="detached")
    for _ in range(100):
        after = json.loads(page.evaluate("document.documentElement.dataset.memory"))
        if after["cached"] < before["cached"]:
            break
        page.wait_for_timeout(100)
    assert after["cached"] < before["cached"]
    assert after["free"] - before["free"] == before["cached"] - after["cached"]


def test_reload_keeps_chats_and_the_interrupted_reply(app):
    booted = app[0]
    page = booted.page
    page.locator("#new-chat").click()  # a fresh chat: the tiny model's context is only 256 tokens
    page.wait_for_selector("#chat-list li:nth-child(4) button[aria-current=true]", state="attached")
    titles = page.locator("#chat-list li").all_inner_texts()
    show_settings(page)
    page.fill("#set-max-tokens", "2000")
    page.fill("#prompt", "A long answer, please.")
    wait_for_streamed_text(page, send=True)  # the first streamed token is saved at once (later ones every 300 ms)
    page.wait_for_timeout(50)
    page.reload()
    page.wait_for_selector("html[data-model=ready][data-restored]", state="attached", timeout=240_000)
    page.wait_for_selector("#chat-list li", state="attached")  # drawn when the worker's chat list is back
    assert page.locator("#chat-list li").all_inner_texts() == titles
    page.locator("#chat-list li:nth-child(4) button").click()
    last = page.locator("#messages .msg.assistant").last
    assert "interrupted" in last.get_attribute("class") and len(last.get_attribute("data-text")) > 0
    show_settings(page)
    turn = send_and_wait(page, "Go on.", 4)
    # The restored history (with the cut-off reply) is the prefix of the next prompt.
    assert turn["tokens"] == 4 and turn["history_tokens"] > 40


def form_settings(page) -> tuple:
    return tuple(page.input_value(f"#set-{k}") for k in ("temperature", "seed", "system", "max-tokens"))


def test_settings_belong_to_their_chat_and_a_stopped_reply_survives_a_reload(app):
    page = app[0].page
    n = page.locator("#chat-list li").count()  # the chat in view is the last one
    show_settings(page)
    page.fill("#set-temperature", "0.3")
    page.fill("#set-seed", "7")
    page.fill("#set-system", "Be brief.")
    page.fill("#set-max-tokens", "100")
    page.locator("#new-chat").click()
    page.wait_for_selector(f"#chat-list li:nth-child({n + 1}) button[aria-current=true]", state="attached")
    assert form_settings(page) == ("0.3", "7", "Be brief.", "100")  # a new chat starts from the form
    # Seed 1 at temperature 1.1 draws no end-of-sequence token: the reply would run to the tiny model's
    # 256-token context (220 tokens in CPython), long after Stop is clicked.
    page.fill("#set-temperature", "1.1")
    page.fill("#set-seed", "1")
    page.fill("#set-max-tokens", "2000")
    page.locator(f"#chat-list li:nth-child({n}) button").click()
    assert form_settings(page) == ("0.3", "7", "Be brief.", "100")
    page.locator(f"#chat-list li:nth-child({n + 1}) button").click()
    assert form_settings(page) == ("1.1", "1", "Be brief.", "2000")

    # Stop mid-stream, then reload: the chat, its partial answer and its settings are still there.
    page.fill("#prompt", "Tell me everything.")
    wait_for_streamed_text(page, stop=True, send=True)
    page.wait_for_selector("#messages .msg.assistant.interrupted", state="attached")
    partial = last_turn(page)
    assert partial["reason"] == "abort" and 0 < partial["tokens"] < 220, partial
    from test_chat_records import wait_turn_saved  # (test_chat_records imports this module: here, not at the top)
    wait_turn_saved(page, partial["chat"], partial["history_tokens"])
    page.reload()
    page.wait_for_selector("html[data-model=ready][data-restored]", state="attached", timeout=240_000)
    page.wait_for_selector("#chat-list li", state="attached")  # drawn when the worker's chat list is back
    page.locator(f"#chat-list li:nth-child({n + 1}) button").click()
    assert form_settings(page) == ("1.1", "1", "Be brief.", "2000")
    last = page.locator("#messages .msg.assistant").last
    assert last.get_attribute("data-text") == partial["content"] and "interrupted" in last.get_attribute("class")
    page.locator(f"#chat-list li:nth-child({n}) button").click()
    assert form_settings(page) == ("0.3", "7", "Be brief.", "100")


def test_memory_settings_rebuild_the_pool_and_keep_the_chats(app):
    booted = app[0]
    page = booted.page
    titles = page.locator("#chat-list li").all_inner_texts()
    page.locator("#memory-settings summary").click()
    page.select_option("#mem-block-size", "32")
    page.fill("#mem-max-context", "128")
    page.fill("#mem-cpu-budget", "32")
    page.locator("#mem-apply").click()
    for _ in range(300):
        if "block_size=32" in page.url:
            break
        page.wait_for_timeout(100)
    assert "block_size=32" in page.url and "max_context=128" in page.url and "cpu_mib=32" in page.url, page.url
    page.wait_for_selector("html[data-model=ready][data-restored]", state="attached", timeout=240_000)
    page.wait_for_selector("#chat-list li", state="attached")  # drawn when the worker's chat list is back
    info = json.loads(page.evaluate("document.documentElement.dataset.modelInfo"))
    assert info["block_size"] == 32 and info["context_length"] == 128
    assert page.locator("#chat-list li").all_inner_texts() == titles
    assert page.locator("#mem-block-size").input_value() == "32"
    assert page.locator("#mem-cpu-budget").input_value() == "32"
    page.locator("#new-chat").click()
    page.wait_for_selector(f"#chat-list li:nth-child({len(titles) + 1}) button[aria-current=true]", state="attached")
    show_settings(page)
    turn = send_and_wait(page, "hi", 4)
    assert turn["tokens"] == 4
