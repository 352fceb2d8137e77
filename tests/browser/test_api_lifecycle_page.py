"""pagedkv.js's lifecycle in a page (web/examples/two-models.html, CPU path: tiny-random and tiny-random-wide in
one engine): unloading a model ends each of its requests with an ApiError that names the unload (a non-streamed
create rejects; engine.fetch's stream ends with OpenAI's `error` event, no [DONE]); after close() every method
rejects at once with ApiError 503; a createEngine that fails terminates its worker, and the next one works; the
single-model CPU path honours budgetMiB and refuses an unknown kvDtype by name; engine.fetch refuses a body past
8 MiB (413) before parsing it."""
from __future__ import annotations

import json

from test_two_models_page import opened

from pagedkv.kv.dtypes import KV_DTYPES

PAGE = "/examples/two-models.html?writer=tiny-random&reviewer=tiny-random-wide&backend=cpu&budget_mib=16"
WIDE = "tiny-random-wide"

UNLOAD = """async () => {
  const e = window.engine;
  const body = { model: "tiny-random-wide", max_tokens: 200, temperature: 0,
                 messages: [{ role: "user", content: "tell me a long story" }] };
  const settled = (promise) => promise.then((v) => ["resolved", v], (err) => ["rejected", err]);
  const whole = settled(e.chat.completions.create(body));  // asked first: running when the stream's chunk comes
  const response = await e.fetch(location.origin + "/v1/chat/completions", {
    method: "POST", body: JSON.stringify({ ...body, stream: true }) });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = decoder.decode((await reader.read()).value, { stream: true });
  await e.unload("tiny-random-wide");
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  const [how, err] = await whole;
  const huge = await e.fetch(location.origin + "/v1/chat/completions", {  // refused before it is parsed
    method: "POST", body: JSON.stringify({ ...body, messages: [{ role: "user", content: "x".repeat(9 << 20) }] }) });
  return { how, error: [err.name, err instanceof Error, err.status, err.message, err.param],
           events: text.split("\\n\\n").filter(Boolean), huge: [huge.status, (await huge.json()).error.message] };
}"""

CLOSED = """async () => {
  const e = window.engine;
  const running = e.chat.completions.create({ model: "tiny-random", max_tokens: 200,
                                               messages: [{ role: "user", content: "tell me a long story" }] });
  e.close();
  const late = new Promise((resolve) => setTimeout(() => resolve("never settled"), 3000));
  const calls = {
    running: () => running, stats: () => e.stats(), exec: () => e.exec("1 + 1"), unload: () => e.unload("x"),
    load: () => e.load("tiny-random-wide"), forget: () => e.forget("s"), list: () => e.models.list(),
    create: () => e.chat.completions.create({ model: "tiny-random", messages: [{ role: "user", content: "hi" }] }),
    send: async () => e.chats.send("c1", "hi"),
  };
  const out = {};
  for (const [name, call] of Object.entries(calls)) {
    let promise;
    try { promise = call(); } catch (err) { promise = Promise.reject(err); }
    out[name] = await Promise.race([promise.then(() => "resolved", (err) => [err.name, err.status, err.message]),
                                    late]);
  }
  const fetched = await e.fetch(location.origin + "/v1/models");
  out.fetch = [fetched.status, (await fetched.json()).error.message];
  return out;
}"""

FAILED_CREATE = """async () => {
  const workers = [];
  const Native = window.Worker;
  window.Worker = class extends Native {
    constructor(...args) { super(...args); this.terminated = false; workers.push(this); }
    terminate() { this.terminated = true; super.terminate(); }
  };
  const { createEngine } = await import("/pagedkv.js");
  let failed = null;
  try { await createEngine({ model: "no-such-model", backend: "cpu" }); } catch (err) { failed = err.message; }
  const afterFailure = workers.map((w) => w.terminated);
  const again = await createEngine({ model: "tiny-random", backend: "cpu", budgetMiB: 1 });
  const reply = await again.chat.completions.create({ model: again.model, max_tokens: 2, temperature: 0,
                                                       messages: [{ role: "user", content: "hi" }] });
  const blocks = (await again.stats())["tiny-random"].num_blocks;
  again.close();
  window.Worker = Native;
  return { failed, afterFailure, finish: reply.choices[0].finish_reason, blocks,
           terminated: workers.map((w) => w.terminated) };
}"""

# The single-model CPU path's options: ?budget_mib= bounds weights + KV (tiny-random: 82,176 B of weights, 8,192 B
# a block of 16 tokens), ?kv_dtype= must be a KV dtype's name; each refusal a model-error naming it.
CPU_OPTIONS = """async () => {
  const { createEngine } = await import("/pagedkv.js");
  const one = async (options) => {  // the engines boot side by side
    try {
      const e = await createEngine({ model: "tiny-random", backend: "cpu", ...options });
      const blocks = (await e.stats())["tiny-random"].num_blocks;
      e.close();
      return blocks;
    } catch (err) { return err.message; }
  };
  const [int3, small] = await Promise.all([one({ kvDtype: "int3" }), one({ budgetMiB: 0.0625 })]);
  return { int3, small };
}"""


def test_unload_close_and_a_failed_create_end_what_they_should(browser, base_url):
    page = opened(browser, base_url + PAGE)
    try:
        got = page.evaluate(UNLOAD)
        message = f"the model {WIDE} was unloaded while this request ran"
        assert got["how"] == "rejected"
        assert got["error"] == ["ApiError", True, 503, message, "model"]
        events = got["events"]
        assert json.loads(events[0].removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"
        assert events[-1].startswith("data: {")  # OpenAI's error event, which the openai client throws on
        assert json.loads(events[-1].removeprefix("data: ")) == {"error": {"message": message, "param": "model",
                                                                           "type": "service_unavailable"}}
        assert "data: [DONE]" not in events
        assert got["huge"] == [413, "the body is 9,437,287 bytes; one request takes at most 8,388,608"]

        closed = page.evaluate(CLOSED)
        gone = ["ApiError", 503, "the engine is closed"]
        assert closed == {"running": gone, "stats": gone, "exec": gone, "unload": gone, "load": gone,
                          "forget": gone, "list": gone, "create": gone, "send": gone,
                          "fetch": [503, "the engine is closed"]}

        failed = page.evaluate(FAILED_CREATE)
        assert failed["failed"] == "RuntimeError: fetching models/no-such-model/model.json failed: HTTP 404"
        assert failed["afterFailure"] == [True]  # the failed engine's worker is gone
        assert failed["finish"] in ("stop", "length") and failed["terminated"] == [True, True]
        # budgetMiB 1 on the CPU path: 117 blocks of 8,192 B beside 82,176 B of weights (was kv_mib's 16,384)
        assert failed["blocks"] == (2**20 - 82_176) // 8192

        assert page.evaluate(CPU_OPTIONS) == {
            "int3": "ValueError: unknown KV cache dtype 'int3'; valid dtypes are " + ", ".join(KV_DTYPES),
            "small": "ValueError: a budget of 0.0625 MiB does not hold tiny-random: its weights take 0.08 MiB and a "
                     "KV block of 16 tokens 8,192 B more; raise budget_mib"}
    finally:
        page.close()
