"""Tools in the tab: the official `openai` client over engine.fetch forces a named call of a tiny model whose
template does not read tools (SmolLM2's: our tagged format is stated to it); pagedkv.js assembles the call from its
deltas into the same message the stream gives, and the result sent back in a tool message is answered."""
from __future__ import annotations

import json

from test_api_page import OPENAI, serve_openai
from test_gguf_page import FILE_NAME, tiny_gguf  # noqa: F401  (fixture)

# The tiny model loaded from a GGUF File: a tiny Llama with SmolLM2's vocabulary and template (context 2048: room
# for the tools' instruction, which tiny-random's 256 lacks).
TOOLS = """async ([name, bytes]) => {
  const { OpenAI } = await import("/vendor/openai/client.mjs");
  const { createEngine } = await import("/pagedkv.js");
  const e = await createEngine({ models: [new File([new Uint8Array(bytes)], name)], backend: "cpu",
                                 budgetMiB: 32 });
  const client = new OpenAI({ baseURL: location.origin + "/v1", apiKey: "unused", fetch: e.fetch,
                              dangerouslyAllowBrowser: true, maxRetries: 0 });
  const tools = [{ type: "function", function: { name: "trip", parameters: { type: "object",
    properties: { days: { type: "integer", minimum: 1, maximum: 9 } }, required: ["days"],
    additionalProperties: false } } }];
  const messages = [{ role: "developer", content: "Plan." },
                    { role: "user", content: [{ type: "text", text: "Rome?" }] }];
  const body = { model: e.model, messages, tools, max_tokens: 60, temperature: 0,  // the file's context: 256
                 tool_choice: { type: "function", function: { name: "trip" } } };
  const whole = await client.chat.completions.create(body);
  const deltas = [];
  let reason = null;
  for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
    deltas.push(...(c.choices[0]?.delta?.tool_calls ?? []));
    reason = c.choices[0]?.finish_reason ?? reason;
  }
  const call = whole.choices[0].message.tool_calls[0];
  const answer = await e.chat.completions.create({ model: e.model, tools, max_tokens: 3, temperature: 0,
    messages: [...messages, whole.choices[0].message, { role: "tool", tool_call_id: call.id, content: "ok" }] });
  return { message: whole.choices[0].message, finish: whole.choices[0].finish_reason, deltas, reason,
           answer: answer.choices[0].message };
}"""


def serve_blank(route) -> None:
    """An empty page on the origin, cross-origin isolated as serve.py sends every page: it imports /pagedkv.js and
    boots one engine, the test's, and none of its own."""
    route.fulfill(status=200, body="<!doctype html><title>tools</title>", content_type="text/html",
                  headers={"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp"})


def test_the_openai_client_gets_a_forced_call_whole_and_streamed(browser, base_url, tiny_gguf):  # noqa: F811
    assert (OPENAI / "client.mjs").is_file(), "npm ci installs the openai devDependency"
    page = browser.new_page()
    try:
        page.route("**/vendor/openai/**", serve_openai)
        page.route("**/blank.html", serve_blank)
        page.goto(base_url + "/blank.html")
        got = page.evaluate(TOOLS, [FILE_NAME, list(tiny_gguf.read_bytes())])
    finally:
        page.close()
    message = got["message"]
    (call,) = message["tool_calls"]
    assert message["content"] is None and got["finish"] == "stop"  # a function named in tool_choice: "stop"
    assert call["id"].startswith("call_") and call["type"] == "function" and call["function"]["name"] == "trip"
    arguments = json.loads(call["function"]["arguments"])
    assert list(arguments) == ["days"] and 1 <= arguments["days"] <= 9
    first, rest = got["deltas"]
    assert first["function"] == {"name": "trip", "arguments": ""} and first["index"] == 0
    assert rest == {"index": 0, "function": {"arguments": call["function"]["arguments"]}}
    assert got["reason"] == "stop"
    assert got["answer"]["role"] == "assistant" and "tool_calls" not in got["answer"]
