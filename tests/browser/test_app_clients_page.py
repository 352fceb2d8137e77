"""Real app code against pagedkv.js, unchanged: tests/browser/app_clients.js (the Vercel AI SDK's generateText,
streamText, generateObject, structured output and tools over createOpenAICompatible, and the official openai
client) bundled with esbuild as an app's build does, served to /examples/api.html and given its engine.fetch;
SmolLM2-135M (the built-in model) on the tab's CPU path and on WebGPU (SwiftShader). The request bodies the clients
send are checked too: they are what the engine has to accept (docs/api.md, "The Vercel AI SDK")."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

import build

APP = build.ROOT / "tests" / "browser" / "app_clients.js"
ESBUILD = build.ROOT / "node_modules" / ".bin" / "esbuild"
PAGE = "/examples/api.html?backend={backend}&budget_mib=1024"
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def app_bundle(tmp_path_factory) -> bytes:
    """The app module bundled with its npm dependencies into one ES module (in a temp dir: dist/ stays the
    product, without the SDK)."""
    assert ESBUILD.is_file(), "npm ci installs the esbuild devDependency"
    out = tmp_path_factory.mktemp("app") / "app_clients.js"
    subprocess.run([str(ESBUILD), str(APP), "--bundle", "--format=esm", "--platform=browser", "--log-level=warning",
                    f"--outfile={out}"], check=True, cwd=build.ROOT)
    return out.read_bytes()


def open_app_page(browser, base_url, bundle: bytes, backend: str):
    page = browser.new_page()
    page.route("**/app/app_clients.js",
               lambda route: route.fulfill(status=200, body=bundle, content_type="text/javascript"))
    page.goto(base_url + PAGE.format(backend=backend))
    page.wait_for_selector("html[data-engine=ready]", state="attached", timeout=300_000)
    page.evaluate("""async () => {
      window.app = await import("/app/app_clients.js");
      window.conn = window.app.connect(window.engine);
    }""")
    return page


@pytest.fixture(scope="module")
def cpu_page(browser, base_url, app_bundle):
    page = open_app_page(browser, base_url, app_bundle, "cpu")
    yield page
    page.close()


@pytest.fixture(scope="module")
def webgpu_page(browser, base_url, app_bundle):
    page = open_app_page(browser, base_url, app_bundle, "webgpu")
    yield page
    page.close()


def run(page, scenario: str, *args):
    """One scenario of app_clients.js in the page; fails with its error and request bodies if it threw."""
    started = time.monotonic()
    got = page.evaluate(f"(args) => window.app.{scenario}(window.conn, ...args)", list(args))
    print(f"{scenario}: {time.monotonic() - started:.1f} s")  # pytest -s shows where the browser time goes
    for r in got.get("runs", []):
        print(f"  seed {r['seed']}: {r.get('tokens')} tokens in {r.get('ms')} ms")
    assert "error" not in got, json.dumps(got, indent=1)
    return got


def bodies(got) -> list[dict]:
    assert {r["path"] for r in got["requests"]} == {"/v1/chat/completions"}
    return [r["body"] for r in got["requests"]]


# -- what works with plain chat: the harness itself, both clients' text ------------------------------------------

def check_sdk_text(page):
    got = run(page, "sdkText")
    assert got["text"] and got["finishReason"] in ("stop", "length")
    assert got["streamed"] == got["text"] and got["parts"] >= 2  # greedy: the same text, in several pieces
    assert got["usage"]["outputTokens"] >= 1 and got["usage"]["inputTokens"] > 10
    whole, streamed = bodies(got)
    # instructions become a system message; the stream asks for no usage (the provider's includeUsage is off)
    assert whole == {"model": MODEL, "max_tokens": 12, "temperature": 0,
                     "messages": [{"role": "system", "content": "Answer in one sentence."},
                                  {"role": "user", "content": "What is the capital of France?"}]}
    assert streamed == {**whole, "stream": True}
    return got["text"]


def test_ai_sdk_generate_text_and_stream_text(cpu_page):
    assert check_sdk_text(cpu_page).startswith("The capital of France is")


def test_openai_client_text_streamed_with_usage(cpu_page):
    got = run(cpu_page, "openaiText")
    assert got["text"] and got["streamed"] == got["text"] and got["finish"] in ("stop", "length")
    assert got["usage"]["completion_tokens"] >= 1
    assert bodies(got)[1]["stream_options"] == {"include_usage": True}


def test_openai_client_developer_role_and_content_parts(cpu_page):
    """A developer message and content as text parts read as a system message and the parts joined by newlines:
    the same prompt tokens and greedy text as that plain request."""
    got = run(cpu_page, "openaiShapes")
    assert got["text"] and got["text"] == got["plainText"]
    tokens = ("prompt_tokens", "completion_tokens")  # cached_tokens differ: the second finds the first's blocks
    assert [got["usage"][k] for k in tokens] == [got["plainUsage"][k] for k in tokens]
    shaped, _ = bodies(got)
    assert shaped["messages"][0]["role"] == "developer" and len(shaped["messages"][1]["content"]) == 2


# -- structured output ------------------------------------------------------------------------------------------

PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                                  "age": {"type": "integer", "minimum": -9007199254740991,
                                                          "maximum": 9007199254740991}},
                 "required": ["name", "age"], "additionalProperties": False}


def check_json_schema(page, seeds: list[int], sdk_seeds: list[int]):
    """The openai client's response_format json_schema at temperature 0.8, all seeds at once (batched): each ends
    with stop and its JSON passes zod's safeParse in the page. generateObject (the AI SDK, a zod schema) one seed
    after another, and generateText's Output.object at temperature 0: the same."""
    client = run(page, "openaiJsonSchema", seeds)
    assert [(r["seed"], r["finish"], r["valid"]) for r in client["runs"]] == [(s, "stop", True) for s in seeds], \
        client
    sdk = run(page, "sdkObjects", sdk_seeds)
    assert [(r["seed"], r["finish"], r["valid"]) for r in sdk["runs"]] == [(s, "stop", True) for s in sdk_seeds], sdk
    body = bodies(sdk)[0]
    # supportsStructuredOutputs: the zod schema goes as a json_schema (draft-07, zod's int bounds), strict
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "schema": {"$schema": "http://json-schema.org/draft-07/schema#", **PERSON_SCHEMA},
        "strict": True, "name": "response"}}
    structured = run(page, "sdkOutputObject")
    assert structured["valid"] and structured["finish"] == "stop"
    assert bodies(structured)[0]["response_format"] == body["response_format"]


def test_json_schema_every_seed_stops_and_validates(cpu_page):
    """Ten seeds through the openai client, two of them through generateObject as well."""
    check_json_schema(cpu_page, list(range(10)), [0, 1])


# -- tools --------------------------------------------------------------------------------------------------------

PARIS = [{"name": "weather", "input": {"city": "Paris"}, "invalid": False}]  # arguments the tool's zod schema took


def check_round_trip(page):
    """streamText with a tool that runs: step 1's forced call, its result sent back, step 2 answers in text."""
    trip = run(page, "sdkToolRoundTrip")
    assert trip["calls"] == PARIS and trip["ran"] == ["Paris"]
    assert trip["steps"][0] == "tool-calls" and trip["steps"][1] in ("stop", "length") and trip["text"].strip()
    first, second = bodies(trip)
    assert first["tool_choice"] == "required" and first["stream"] is True
    assistant, result = second["messages"][1:]  # the call as the engine made it, then the tool's result
    assert assistant["content"] is None and assistant["tool_calls"][0]["function"]["name"] == "weather"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                      "content": '{"city":"Paris","celsius":21}'}
    assert second["tool_choice"] == "none"


def check_tools(page):
    called = run(page, "sdkToolCall")  # no execute: the call is generateText's answer
    assert called["calls"] == PARIS and called["finish"] == "tool-calls"
    assert bodies(called)[0]["tool_choice"] == "required"
    check_round_trip(page)

    client = run(page, "openaiTools", 7)
    message = client["message"]
    assert client["finish"] == "tool_calls" and message["content"] is None and all(client["args"])
    whole = [(c["type"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    streamed = [(c["type"], c["function"]["name"], c["function"]["arguments"]) for c in client["streamed"]]
    assert whole and streamed == whole and client["streamedFinish"] == "tool_calls"  # same seed, same call
    assert all(c["id"] for c in client["streamed"])


def test_tool_calls_and_a_tool_round_trip(cpu_page):
    check_tools(cpu_page)


# -- logprobs -----------------------------------------------------------------------------------------------------

def check_logprobs(page):
    got = run(page, "openaiLogprobs")
    content = got["logprobs"]["content"]
    # one entry per generated token, the end token included when the reply ended on it (docs/api.md, logprobs)
    end = "<|im_end|>" if got["finish"] == "stop" else ""
    assert "".join(t["token"] for t in content) == got["text"] + end
    assert len(content) == got["usage"]["completion_tokens"] <= 8
    for t in content:
        tops = [x["logprob"] for x in t["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        # greedy: the chosen token is the most likely one
        assert (t["top_logprobs"][0]["token"], t["top_logprobs"][0]["logprob"]) == (t["token"], t["logprob"])


def test_logprobs_are_sorted_and_greedy_takes_the_top(cpu_page):
    check_logprobs(cpu_page)


# -- on WebGPU (SwiftShader): the GPU path is slower here, so one of each but the json_schema seeds ---------------

def test_the_clients_on_webgpu(webgpu_page):
    """The ten json_schema seeds batch in one step loop: measured in one page, 13.1 s for one seed, then 26.7 s for
    the ten (SwiftShader, 2 cores at a load of about 2; 57 s at a load of 15), so all ten run; generateObject one
    seed."""
    assert webgpu_page.evaluate("window.engine.info.backend") == "webgpu"
    check_sdk_text(webgpu_page)
    check_json_schema(webgpu_page, list(range(10)), [0])
    check_round_trip(webgpu_page)
    check_logprobs(webgpu_page)
