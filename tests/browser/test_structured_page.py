"""Structured output in the tab (Pyodide worker, tiny model, CPU path): POST /v1/chat/completions through
engine.fetch with a json_schema response_format gets n=2 replies that fit the schema and end with "stop" (the
random model never chooses to stop: the grammar ends it), and a schema keyword the engine cannot honour is a 400
naming response_format."""
from __future__ import annotations

import json

EXAMPLE = "/examples/api.html?model=tiny-random&backend=cpu"

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["answer", "n"], "additionalProperties": False}

STRUCTURED = """async (schema) => {
  const e = window.engine;
  const post = async (body) => {
    const r = await e.fetch(location.origin + "/v1/chat/completions", { method: "POST", body: JSON.stringify(body),
                                                                        headers: { "content-type": "application/json" } });
    return [r.status, await r.json()];
  };
  const body = { model: e.model, messages: [{ role: "user", content: "yes or no?" }], max_tokens: 40,
                 temperature: 0.8, seed: 1, n: 2 };
  const [status, shaped] = await post({ ...body,
      response_format: { type: "json_schema", json_schema: { name: "reply", schema, strict: true } } });
  const refused = await post({ ...body, response_format: { type: "json_schema",
      json_schema: { name: "reply", schema: { type: "string", pattern: "^a" } } } });
  return { status, choices: shaped.choices.map((c) => [c.finish_reason, c.message.content]), refused };
}"""


def test_response_format_in_the_tab(browser, base_url):
    page = browser.new_page()
    try:
        page.goto(base_url + EXAMPLE)
        page.wait_for_selector("html[data-engine=ready]", state="attached", timeout=240_000)
        got = page.evaluate(STRUCTURED, SCHEMA)
        assert got["status"] == 200 and [reason for reason, _ in got["choices"]] == ["stop", "stop"]
        for _, content in got["choices"]:
            value = json.loads(content)
            assert set(value) == {"answer", "n"} and value["answer"] in ("yes", "no") and 0 <= value["n"] <= 9
        status, refused = got["refused"]
        assert (status, refused["error"]["param"]) == (400, "response_format")
        assert "schema.pattern" in refused["error"]["message"]
    finally:
        page.close()
