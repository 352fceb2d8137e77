"""pagedkv.js in a page of the origin (web/examples/api.html; tiny model, CPU path): createEngine, OpenAI Chat
Completions non-streamed and streamed with the same greedy text, engine.fetch answering /v1/models and
/v1/chat/completions as an OpenAI server does (JSON, server-sent events ending in [DONE], error JSON with its
status), an AbortSignal ending a stream, and engine.stats() showing no block held afterwards; the official
`openai` npm client (node_modules/openai, served to the page as /vendor/openai/) unchanged over engine.fetch; legacy
Completions (engine.completions, POST /v1/completions, the client's completions) answering text_completions."""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

OPENAI = Path(__file__).resolve().parents[2] / "node_modules" / "openai"  # the official client, a devDependency

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
  for await (const c of await e.chat.completions.create({ model: e.model, stream: true, max_tokens: 200,
      messages: [{ role: "user", content: "another long story" }] })) break;  // left after the first chunk
  const stats = (await e.stats())[e.model];
  return { n, after: after.choices[0].finish_reason, used: stats.used_blocks, running: stats.running,
           blocks: stats.num_blocks };
}"""

SESSION = """async () => {
  const e = window.engine;
  const first = [{ role: "user", content: "hello there" }];
  const body = { model: e.model, max_tokens: 6, temperature: 0, pagedkv: { session: "s1" } };
  const a = await e.chat.completions.create({ ...body, messages: first });
  const next = [...first, a.choices[0].message, { role: "user", content: "and then?" }];
  const b = await e.chat.completions.create({ ...body, messages: next });
  return { forgot: await e.forget("s1"), again: await e.forget("s1"), never: await e.forget("nope"),
           prompt: [a.usage.prompt_tokens, b.usage.prompt_tokens] };
}"""

# OpenAI's sampling controls and log-probs on the tab's CPU path, joined by pagedkv.js (non-streamed) and per chunk
PENALISED_BODY = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8, "temperature": 0,
                  "presence_penalty": 1.5, "frequency_penalty": 0.7, "logit_bias": {"59": -100}, "logprobs": True,
                  "top_logprobs": 3}
PENALISED = """async (body) => {
  const e = window.engine;
  const whole = await e.chat.completions.create({ ...body, model: e.model });
  const streamed = [];
  for await (const c of await e.chat.completions.create({ ...body, model: e.model, stream: true })) {
    streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
  }
  return { whole, streamed };
}"""


def check_penalised(got) -> None:
    """The page's penalised greedy reply is CPython's (pagedkv.api.Engine on dist/models), token for token; its
    log-probs are CPython's within 0.05 (the tab's wasm CPU path gives this tiny model's logits apart from
    numpy's: 0.025 measured) and, streamed, the same as the joined ones within 1e-4."""
    from pagedkv.api import Engine

    want = Engine(["tiny-random"], budget_mib=64).chat.completions.create(model="tiny-random", **PENALISED_BODY)
    choice, expect = got["whole"]["choices"][0], want["choices"][0]
    assert choice["message"] == expect["message"] and choice["logprobs"]["refusal"] is None

    def shape(entries):
        return [(e["token"], e["bytes"], [t["bytes"] for t in e["top_logprobs"]]) for e in entries]

    def values(entries):
        return [v for e in entries for v in (e["logprob"], *(t["logprob"] for t in e["top_logprobs"]))]

    joined = choice["logprobs"]["content"]
    assert shape(joined) == shape(got["streamed"]) == shape(expect["logprobs"]["content"]) and len(joined) == 8
    assert max(abs(a - b) for a, b in zip(values(joined), values(got["streamed"]))) < 1e-4
    assert max(abs(a - b) for a, b in zip(values(joined), values(expect["logprobs"]["content"]))) < 0.05


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

        session = page.evaluate(SESSION)  # a session continued, then forgotten: once, and only once
        assert (session["forgot"], session["again"], session["never"]) == (True, False, False)
        assert session["prompt"][1] > session["prompt"][0]

        check_penalised(page.evaluate(PENALISED, PENALISED_BODY))

        aborted = page.evaluate(ABORTED)
        # the stream ends at the abort: chunks the worker sent before it heard of it are not handed out
        assert aborted["n"] == 3 and aborted["after"] in ("stop", "length")
        assert (aborted["used"], aborted["running"]) == (0, 0) and aborted["blocks"] > 0  # nothing left held
    finally:
        page.close()


OFFICIAL_CLIENT = """async () => {
  const { OpenAI } = await import("/vendor/openai/client.mjs");
  const e = window.engine;
  const client = new OpenAI({ baseURL: location.origin + "/v1", apiKey: "unused", fetch: e.fetch,
                              dangerouslyAllowBrowser: true, maxRetries: 0 });
  const body = { model: e.model, messages: [{ role: "user", content: "hello there" }], max_tokens: 8,
                 temperature: 0 };
  const models = await client.models.list();
  const plain = await client.chat.completions.create(body);
  let text = "";
  for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
    text += c.choices[0]?.delta?.content ?? "";
  }
  const failure = async (b) => {
    try { await client.chat.completions.create(b); return null; }
    catch (err) { return { name: err.constructor.name, status: err.status, param: err.param ?? null }; }
  };
  const tools = await failure({ ...body, tools: [] });  // refused by OpenAI too
  const unknown = await failure({ ...body, model: "nope" });
  const controller = new AbortController();
  const long = await client.chat.completions.create({ ...body, max_tokens: 200, stream: true },
                                                    { signal: controller.signal });
  let n = 0, aborted = null;
  try { for await (const c of long) { if (++n === 3) controller.abort(); } }
  catch (err) { aborted = err.constructor.name; }
  const stats = (await e.stats())[e.model];
  return { ids: models.data.map((m) => m.id), plain: plain.choices[0].message.content, usage: plain.usage, text,
           tools, unknown, n, aborted, used: stats.used_blocks, running: stats.running };
}"""


def serve_openai(route) -> None:
    """/vendor/openai/<file> from node_modules/openai (its ES modules import each other by relative paths)."""
    rel = urlparse(route.request.url).path.removeprefix("/vendor/openai/")
    path = (OPENAI / rel).resolve()
    if OPENAI.resolve() not in path.parents or not path.is_file():
        route.fulfill(status=404, body="not found")
        return
    route.fulfill(status=200, body=path.read_bytes(), content_type="text/javascript")


def evaluate_with_the_client(browser, base_url, script: str):
    """`script`'s result in the example page once its engine is ready, /vendor/openai/ served to it."""
    assert (OPENAI / "client.mjs").is_file(), "npm ci installs the openai devDependency"
    page = browser.new_page()
    try:
        page.route("**/vendor/openai/**", serve_openai)
        page.goto(base_url + EXAMPLE)
        page.wait_for_selector("html[data-engine=ready]", state="attached", timeout=240_000)
        return page.evaluate(script)
    finally:
        page.close()


def test_the_official_openai_client_works_unchanged(browser, base_url):
    got = evaluate_with_the_client(browser, base_url, OFFICIAL_CLIENT)
    assert got["ids"] == ["tiny-random"]
    assert got["plain"] and got["text"] == got["plain"] and got["usage"]["completion_tokens"] >= 1
    assert got["tools"] == {"name": "BadRequestError", "status": 400, "param": "tools"}
    assert got["unknown"]["name"] == "NotFoundError" and got["unknown"]["status"] == 404
    # The client ends a stream aborted by its signal without an error (openai's core/streaming.mjs), and
    # engine.fetch errors the body at once, as fetch does: no chunk after the abort.
    assert got["aborted"] is None and got["n"] == 3
    assert (got["used"], got["running"]) == (0, 0)  # the aborted stream's blocks are free


LEGACY = """async () => {
  const { OpenAI } = await import("/vendor/openai/client.mjs");
  const e = window.engine;
  const body = { model: e.model, prompt: "the cat", max_tokens: 6, temperature: 0 };
  const whole = await e.completions.create(body);
  let streamed = "";
  for await (const c of await e.completions.create({ ...body, stream: true })) streamed += c.choices[0]?.text ?? "";
  const post = (b) => e.fetch(location.origin + "/v1/completions", { method: "POST", body: JSON.stringify(b) });
  const plain = await (await post(body)).json();
  const events = (await (await post({ ...body, stream: true })).text()).split("\\n\\n").filter(Boolean);
  const chat = await post({ ...body, messages: [{ role: "user", content: "hi" }] });
  const client = new OpenAI({ baseURL: location.origin + "/v1", apiKey: "unused", fetch: e.fetch,
                              dangerouslyAllowBrowser: true, maxRetries: 0 });
  const official = await client.completions.create(body);
  let officialStreamed = "";
  for await (const c of await client.completions.create({ ...body, stream: true })) {
    officialStreamed += c.choices[0]?.text ?? "";
  }
  let echo = null;
  try { await client.completions.create({ ...body, echo: true }); }
  catch (err) { echo = { name: err.constructor.name, status: err.status, param: err.param ?? null }; }
  return { whole, streamed, plain, events, chat: [chat.status, await chat.json()], official, officialStreamed, echo,
           used: (await e.stats())[e.model].used_blocks };
}"""


def test_legacy_completions_through_engine_fetch_and_the_openai_client(browser, base_url):
    """engine.completions.create and POST /v1/completions (streamed and not, and through the official client):
    `text_completion`s of one greedy text; a chat body posted there is a 400 naming messages."""
    got = evaluate_with_the_client(browser, base_url, LEGACY)
    whole = got["whole"]
    (choice,) = whole["choices"]
    text = choice["text"]
    assert (whole["object"], whole["model"], whole["id"][:5]) == ("text_completion", "tiny-random", "cmpl-")
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"} and choice["finish_reason"] == "length"
    assert text and whole["usage"]["prompt_tokens"] == 4 and whole["usage"]["completion_tokens"] == 6
    assert got["streamed"] == text and got["plain"]["choices"][0]["text"] == text
    pieces = [json.loads(e[len("data: "):]) for e in got["events"][:-1]]
    assert got["events"][-1] == "data: [DONE]" and {p["object"] for p in pieces} == {"text_completion"}
    assert "".join(p["choices"][0]["text"] for p in pieces) == text
    assert got["chat"][0] == 400 and got["chat"][1]["error"]["param"] == "messages"
    assert got["official"]["choices"][0]["text"] == text and got["officialStreamed"] == text
    assert got["echo"] == {"name": "BadRequestError", "status": 400, "param": "echo"}
    assert got["used"] == 0
