"""pagedkv.js in a page of the origin (web/examples/api.html; tiny model, CPU path): createEngine, OpenAI Chat
Completions non-streamed and streamed with the same greedy text, engine.fetch answering /v1/models and
/v1/chat/completions as an OpenAI server does (JSON, server-sent events ending in [DONE], error JSON with its
status), an AbortSignal ending a stream, and engine.stats() showing no block held afterwards."""
from __future__ import annotations

EXAMPLE = "/examples/api.html?model=tiny-random&backend=cpu"

ROUND_TRIP = """async () => {
  const e = window.engine;
  const body = { model: e.model, messages: [{ role: "user", content: "hello there" }], max_tokens: 8,
                 temperature: 0 };
  const whole = await e.chat.completions.create(body);
  let streamed = "", chunks = 0, last = null;
  for await (const c of await e.chat.completions.create({ ...body, stream: true,
                                                          stream_options: { include_usage: true } })) {
    chunks += 1; last = c;
    streamed += c.choices[0]?.delta.content ?? "";
  }
  return { whole, streamed, chunks, last };
}"""

THROUGH_FETCH = """async () => {
  const e = window.engine;
  const base = location.origin + "/v1";
  const post = (body) => e.fetch(base + "/chat/completions", { method: "POST", body: JSON.stringify(body),
                                                                headers: { "content-type": "application/json" } });
  const body = { model: e.model, messages: [{ role: "user", content: "hello there" }], max_tokens: 8,
                 temperature: 0 };
  const models = await (await e.fetch(base + "/models")).json();
  const plain = await post(body);
  const sse = await post({ ...body, stream: true });
  const events = (await sse.text()).split("\\n\\n").filter(Boolean);
  const bad = await post({ ...body, tools: [] });
  const unknown = await post({ ...body, model: "nope" });
  const notJson = await e.fetch(base + "/chat/completions", { method: "POST", body: "{" });
  return { models, plain: [plain.status, await plain.json()], sseType: sse.headers.get("content-type"), events,
           bad: [bad.status, await bad.json()], unknown: unknown.status, notJson: notJson.status };
}"""

ABORTED = """async () => {
  const e = window.engine;
  const controller = new AbortController();
  const stream = await e.chat.completions.create({ model: e.model, stream: true, max_tokens: 200,
      messages: [{ role: "user", content: "tell me a long story" }] }, { signal: controller.signal });
  let n = 0;
  for await (const c of stream) { if (++n === 3) controller.abort(); }
  const after = await e.chat.completions.create({ model: e.model, max_tokens: 2,
      messages: [{ role: "user", content: "still there?" }] });
  const stats = (await e.stats())[e.model];
  return { n, after: after.choices[0].finish_reason, used: stats.used_blocks, running: stats.running,
           blocks: stats.num_blocks };
}"""


def test_pagedkv_js_answers_openai_requests(browser, base_url):
    page = browser.new_page()
    try:
        page.goto(base_url + EXAMPLE)
        page.wait_for_selector("html[data-engine=ready]", state="attached", timeout=240_000)
        got = page.evaluate(ROUND_TRIP)
        whole = got["whole"]
        assert whole["object"] == "chat.completion" and whole["model"] == "tiny-random"
        text = whole["choices"][0]["message"]["content"]
        assert got["streamed"] == text and got["chunks"] >= 3
        assert whole["usage"]["completion_tokens"] >= 1
        assert got["last"]["choices"] == [] and got["last"]["usage"]["completion_tokens"] >= 1

        f = page.evaluate(THROUGH_FETCH)
        assert f["models"]["data"][0]["id"] == "tiny-random"
        assert f["plain"][0] == 200 and f["plain"][1]["choices"][0]["message"]["content"] == text
        assert f["sseType"] == "text/event-stream" and f["events"][-1] == "data: [DONE]"
        assert all(e.startswith("data: {") for e in f["events"][:-1])
        assert f["bad"][0] == 400 and f["bad"][1]["error"]["param"] == "tools"
        assert (f["unknown"], f["notJson"]) == (404, 400)

        aborted = page.evaluate(ABORTED)
        assert aborted["n"] <= 4 and aborted["after"] in ("stop", "length")
        assert (aborted["used"], aborted["running"]) == (0, 0) and aborted["blocks"] > 0  # nothing left held
    finally:
        page.close()
