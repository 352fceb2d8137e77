"""Tools through pagedkv.api.Engine: the tiny model under tool histories and sessions, and the real SmolLM2-135M
calling a forced get_weather and answering its result in text, streamed and not."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from model_fixtures import REAL_MODEL_DIR, real_weights  # noqa: F401  (fixture)
from pagedkv.api import ApiError, Engine
from pagedkv.chat import Conversation
from pagedkv.grammar import Grammar
from pagedkv.model.tiny import tiny_config, write_tiny_model
from pagedkv.tools import ToolChoice, call_grammar
from test_cli import run_cli
from tool_templates import MISTRAL_NEMO_TOOLS_TEMPLATE

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 22, "sky": "sunny"}'}


@pytest.fixture(scope="module")
def tiny_long_dir(tmp_path_factory):
    """The tiny random model with room for the tools' instruction (its small vocabulary spends a token on every
    few characters of it)."""
    path = tmp_path_factory.mktemp("models") / "tiny-long"
    write_tiny_model(path, seed=0, config=dataclasses.replace(tiny_config(), context_length=2048))
    return path


@pytest.fixture(scope="module")
def tiny(tiny_long_dir):
    return Engine([tiny_long_dir], budget_mib=64)


def service(engine):
    return engine.services[engine.model_id]


@pytest.fixture(scope="module")
def tiny_mistral_dir(tiny_long_dir, tmp_path_factory):
    """The same tiny model under Mistral Nemo's chat template: its calls are a [TOOL_CALLS] array (spelled in
    plain tokens: the tiny vocabulary has no [TOOL_CALLS] token)."""
    path = tmp_path_factory.mktemp("models") / "tiny-mistral"
    shutil.copytree(tiny_long_dir, path)
    manifest = json.loads((path / "model.json").read_text())
    (path / "model.json").write_text(json.dumps(manifest | {"chat_template": MISTRAL_NEMO_TOOLS_TEMPLATE}))
    return path


def test_a_session_continues_through_a_tool_call_turn(tiny):
    svc = service(tiny)
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT]
    first = tiny.chat.completions.create(model=tiny.model_id, messages=turn, tools=[WEATHER], max_tokens=6,
                                         temperature=0, pagedkv={"session": "t1"})
    assert first["usage"]["prompt_tokens"] == \
        len(Conversation(svc.tokenizer, svc.template, turn, tools=[WEATHER]).prompt_ids())
    reply = first["choices"][0]["message"]
    second = tiny.chat.completions.create(model=tiny.model_id, messages=turn + [reply, {"role": "user",
                                          "content": "thanks"}], tools=[WEATHER], max_tokens=2, temperature=0,
                                          pagedkv={"session": "t1"})
    use = first["usage"]
    computed = use["prompt_tokens"] + use["completion_tokens"] - 1  # the reply's last token is never computed
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == computed // 16 * 16 > 0
    assert svc.sessions.get("t1").conversation.tools == (WEATHER,)
    # Other tools: the system message differs, so the history is rendered afresh (and becomes the session)
    tiny.chat.completions.create(model=tiny.model_id, messages=turn, tools=[WEATHER], tool_choice="none",
                                 max_tokens=1, pagedkv={"session": "t1"})
    assert svc.sessions.get("t1").conversation.tools == ()
    assert tiny.forget("t1")


def test_tool_choice_none_shows_no_tools_and_parses_no_call(tiny):
    svc = service(tiny)
    out = tiny.chat.completions.create(model=tiny.model_id, messages=ASK, tools=[WEATHER], tool_choice="none",
                                       max_tokens=3, temperature=0)
    assert out["usage"]["prompt_tokens"] == len(Conversation(svc.tokenizer, svc.template, ASK).prompt_ids())
    assert "tool_calls" not in out["choices"][0]["message"]


# ---------------------------------------------------------------- a forced call, decoded under its grammar

TRIP = {"type": "function", "function": {"name": "plan_trip", "parameters": {
    "type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 9},
                                     "mode": {"enum": ["train", "plane"]}},
    "required": ["days", "mode"], "additionalProperties": False}}}


def calls_of(out: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in out["choices"][0]["message"].get("tool_calls") or []]


def test_a_named_function_is_called_with_arguments_its_schema_allows(tiny):
    body = {"model": tiny.model_id, "messages": ASK, "tools": [WEATHER, TRIP], "max_tokens": 80,
            "tool_choice": {"type": "function", "function": {"name": "plan_trip"}}, "temperature": 0}
    out = tiny.chat.completions.create(body)
    ((name, arguments),) = calls_of(out)
    assert name == "plan_trip" and set(arguments) == {"days", "mode"}
    assert isinstance(arguments["days"], int) and 1 <= arguments["days"] <= 9 and arguments["mode"] in ("train",
                                                                                                         "plane")
    assert out["choices"][0]["finish_reason"] == "stop"  # OpenAI's reason for a call asked for by name
    assert out["choices"][0]["message"]["content"] is None
    streamed = list(tiny.chat.completions.create(body, stream=True))
    deltas = [d for c in streamed for d in c["choices"][0]["delta"].get("tool_calls", ())]
    assert [d["index"] for d in deltas] == [0, 0] and deltas[0]["function"] == {"name": "plan_trip", "arguments": ""}
    assert deltas[1] == {"index": 0, "function": {"arguments": out["choices"][0]["message"]["tool_calls"][0]
                                                  ["function"]["arguments"]}}
    assert deltas[0]["id"].startswith("call_") and streamed[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_session_holds_a_call_as_returned_and_continues_with_its_result(tiny):
    svc = service(tiny)
    body = {"model": tiny.model_id, "messages": ASK, "tools": [WEATHER, TRIP], "max_tokens": 80, "temperature": 0,
            "tool_choice": {"type": "function", "function": {"name": "plan_trip"}}, "pagedkv": {"session": "t2"}}
    message = tiny.chat.completions.create(body)["choices"][0]["message"]
    held = svc.sessions.get("t2").conversation
    assert held.messages == ASK + [dict(message, content="")]  # null content checks as ""
    result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "booked"}
    before = held.ids
    reply = tiny.chat.completions.create(body, messages=ASK + [message, result], tool_choice="auto",
                                         max_tokens=2)["choices"][0]["message"]
    session = svc.sessions.get("t2").conversation
    assert session.messages[:3] == ASK + [dict(message, content=""), result] and session.ids[:len(before)] == before
    assert session.messages[3]["role"] == "assistant" and "tool_calls" not in reply
    assert tiny.forget("t2")


CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}


def test_required_calls_one_of_the_tools_in_every_sample(tiny):
    out = tiny.chat.completions.create(model=tiny.model_id, messages=ASK, tools=[CLOCK, TRIP], max_tokens=80,
                                       tool_choice="required", n=4, temperature=1.0, seed=7)
    calls = [calls_of({"choices": [c]}) for c in out["choices"]]  # seed 7: samples that pick each tool
    assert calls == [[("get_time", {})], [("plan_trip", {"days": 5, "mode": "train"})], [("get_time", {})],
                     [("get_time", {})]]
    assert [c["finish_reason"] for c in out["choices"]] == ["tool_calls"] * 4


def streamed_calls(chunks: list[dict]) -> list[tuple[int, str, str]]:
    """(index, name, arguments) of each call in a stream's tool_call deltas, assembled as a client does."""
    calls: dict[int, list] = {}
    for delta in (d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", ())):
        entry = calls.setdefault(delta["index"], [delta["index"], "", ""])
        entry[1] += delta["function"].get("name", "")
        entry[2] += delta["function"]["arguments"]
    return [tuple(c) for c in calls.values()]


def returns(value):
    """A sliced piece of work (slices.py) with nothing to pause for: the service's _grammar's form."""
    yield from ()
    return value


def two_calls_grammar(fmt) -> Grammar:
    """A reply of exactly two calls, get_time then plan_trip, in `fmt` (tagged: two blocks on their own lines;
    mistral: one array of two): the tiny random model writes no call of its own accord, and a forced call is one
    call (tools.call_grammar)."""
    get_time, plan_trip = (Grammar.literal(f'{{"name": "{t["function"]["name"]}", "{fmt.arguments_key}": ')
                           + Grammar.json_schema(t["function"]["parameters"]) + Grammar.literal("}")
                           for t in (CLOCK, TRIP))
    if fmt.kind == "mistral":
        return Grammar.literal("[TOOL_CALLS][") + get_time + Grammar.literal(", ") + plan_trip + Grammar.literal("]")
    return (Grammar.literal("<tool_call>\n") + get_time + Grammar.literal("\n</tool_call>\n<tool_call>\n")
            + plan_trip + Grammar.literal("\n</tool_call>"))


def test_two_calls_in_one_reply_and_parallel_false_stops_at_the_first(tiny_long_dir, monkeypatch):
    """The completion loop under a grammar of two calls (the service's _grammar made to return it): with
    parallel_tool_calls true (the default) both come back in the order written, streamed and not, each with its
    own id; with false the reply ends once its first call closes (decoding stops, the request is aborted), so it
    holds get_time alone, from the two-call reply's ids up to there. An engine of its own: what other tests left
    in the prefix cache changes the tiny model's logits by rounding, enough to flip a seeded draw."""
    tiny = Engine([tiny_long_dir], budget_mib=64)
    svc = service(tiny)
    monkeypatch.setattr(svc, "_grammar", lambda req: returns(two_calls_grammar(svc.template.tool_format)))
    body = {"model": tiny.model_id, "messages": ASK, "tools": [CLOCK, TRIP], "max_tokens": 200,
            "temperature": 1.0, "seed": 3}
    out = tiny.chat.completions.create(body)
    two = [("get_time", {}), ("plan_trip", {"days": 4, "mode": "train"})]
    assert calls_of(out) == two
    choice = out["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("tool_calls", None)
    ids = [c["id"] for c in choice["message"]["tool_calls"]]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    streamed = list(tiny.chat.completions.create(body, stream=True, pagedkv={"token_ids": True}))
    assert streamed_calls(streamed) == [(0, "get_time", "{}"), (1, "plan_trip", '{"days":4,"mode":"train"}')]
    assert [c["choices"][0]["finish_reason"] for c in streamed if c["choices"]][-1] == "tool_calls"

    one = tiny.chat.completions.create(body, parallel_tool_calls=False)
    assert calls_of(one) == two[:1] and one["choices"][0]["finish_reason"] == "tool_calls"
    alone = list(tiny.chat.completions.create(body, parallel_tool_calls=False, stream=True,
                                              pagedkv={"token_ids": True}))
    assert streamed_calls(alone) == [(0, "get_time", "{}")]
    assert [c["choices"][0]["finish_reason"] for c in alone if c["choices"]][-1] == "tool_calls"
    # decoding stopped at the token that closed the first call: the same ids as the two-call reply's up to there
    ids_two, ids_one = streamed_ids(streamed), streamed_ids(alone)
    assert ids_one == ids_two[:len(ids_one)] and len(ids_one) == one["usage"]["completion_tokens"] < len(ids_two)
    assert svc.tokenizer.decode(ids_one) == '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    tiny.close()


def streamed_ids(chunks: list[dict]) -> list[int]:
    return [t for c in chunks if c["choices"] for t in c["choices"][0].get("pagedkv", {}).get("token_ids", ())]


def test_auto_with_a_response_format_gives_the_format_or_a_call(tiny):
    """Under "auto" with a response_format, the reply is held to either: seeds 3 and 4 take each road."""
    answer = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}}}
    replies = [tiny.chat.completions.create(model=tiny.model_id, messages=ASK, tools=[TRIP], response_format=answer,
                                            max_tokens=120, temperature=1.0, seed=seed)["choices"][0]
               for seed in (3, 4)]
    assert calls_of({"choices": [replies[0]]}) == [("plan_trip", {"days": 4, "mode": "train"})]
    assert replies[0]["finish_reason"] == "tool_calls"
    assert (replies[1]["message"], replies[1]["finish_reason"]) == ({"role": "assistant", "content": '{"ok": true}'},
                                                                     "stop")


def test_the_cli_answers_a_body_with_tools(tiny, tiny_long_dir, tmp_path):
    """`python3 -m pagedkv complete` on a body with tools: the same call as the Engine's."""
    body = {"model": "tiny-long", "messages": ASK, "tools": [WEATHER, TRIP], "max_tokens": 80, "temperature": 0,
            "tool_choice": {"type": "function", "function": {"name": "plan_trip"}}}
    path = tmp_path / "body.json"
    path.write_text(json.dumps(body))
    done = run_cli("complete", "--model", str(tiny_long_dir), "--body-json", str(path))
    assert done.returncode == 0, done.stderr
    assert calls_of(json.loads(done.stdout)) == calls_of(tiny.chat.completions.create(body))


def test_a_parameters_keyword_the_grammar_cannot_hold_is_a_400_naming_it(tiny):
    odd = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "not": {"const": "y"}}}}}}
    with pytest.raises(ApiError) as err:
        tiny.chat.completions.create(model=tiny.model_id, messages=ASK, tools=[odd], tool_choice="required")
    assert (err.value.status, err.value.param) == (400, "tools[0].function.parameters.properties.x.not")
    assert err.value.message.startswith("tools[0].function.parameters.properties.x.not: the keyword 'not' is not ")


def test_smollm2_calls_the_forced_tool_then_answers_its_result(real_weights):  # noqa: F811
    """The real model, greedy: the forced call's arguments are JSON its schema allows; the result sent back is
    answered in text ("stop"), streamed and not. (A forced call streamed: the tiny model's test above.)"""
    engine = Engine([REAL_MODEL_DIR], budget_mib=1024)
    body = {"model": engine.model_id, "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
            "max_tokens": 40, "temperature": 0}
    out = engine.chat.completions.create(body)
    assert calls_of(out) == [("get_weather", {"city": "Paris"})]
    message, reason = out["choices"][0]["message"], out["choices"][0]["finish_reason"]
    assert (message["content"], reason) == (None, "tool_calls")
    answer = {"model": engine.model_id, "tools": [WEATHER], "max_tokens": 30, "temperature": 0,
              "messages": ASK + [message, dict(RESULT, tool_call_id=message["tool_calls"][0]["id"])]}
    text = engine.chat.completions.create(answer)["choices"][0]
    assert text == {"index": 0, "message": {"role": "assistant", "content": "The weather in Paris is indeed sunny."},
                    "logprobs": None, "finish_reason": "stop"}
    pieces = list(engine.chat.completions.create(answer, stream=True))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in pieces if c["choices"]) == \
        text["message"]["content"]
    assert pieces[-1]["choices"][0]["finish_reason"] == "stop"
    engine.close()


def test_a_mistral_template_calls_in_its_array_with_ids_it_takes_back(tiny_mistral_dir, monkeypatch):
    """Mistral Nemo's format end to end: "required" decodes one call as a [TOOL_CALLS] array, with a 9-character
    id; under a grammar of two calls in one array (as two_calls_grammar) both come back in order, streamed and
    not; sent back with their results, the template renders them (it refuses any other id) and the model
    answers. parallel_tool_calls false: the array is decided at its end, and its first call is the reply's."""
    engine = Engine([tiny_mistral_dir], budget_mib=64)
    svc = service(engine)
    assert svc.template.tool_format.kind == "mistral"
    body = {"model": engine.model_id, "messages": ASK, "tools": [CLOCK, TRIP], "max_tokens": 200,
            "tool_choice": "required", "temperature": 1.0, "seed": 2}
    forced = engine.chat.completions.create(body)["choices"][0]
    assert calls_of({"choices": [forced]}) == [("plan_trip", {"days": 8, "mode": "plane"})]
    assert forced["finish_reason"] == "tool_calls"

    with monkeypatch.context() as patched:
        patched.setattr(svc, "_grammar", lambda req: returns(two_calls_grammar(svc.template.tool_format)))
        out = engine.chat.completions.create(body)
        streamed = list(engine.chat.completions.create(body, stream=True))
        one = engine.chat.completions.create(body, parallel_tool_calls=False)
    two = [("get_time", {}), ("plan_trip", {"days": 7, "mode": "train"})]
    assert calls_of(out) == two and out["choices"][0]["finish_reason"] == "tool_calls"
    message = out["choices"][0]["message"]
    ids = [c["id"] for c in message["tool_calls"]]
    assert all(len(i) == 9 and i.isascii() and i.isalnum() for i in ids) and ids[0] != ids[1]
    assert streamed_calls(streamed) == [(0, "get_time", "{}"), (1, "plan_trip", '{"days":7,"mode":"train"}')]
    # decoding stopped at the array's closing "]": all the two-call reply's tokens but its end token
    assert calls_of(one) == two[:1] and one["usage"]["completion_tokens"] == out["usage"]["completion_tokens"] - 1

    results = [{"role": "tool", "tool_call_id": i, "content": "done"} for i in ids]
    history = ASK + [message] + results
    answer = engine.chat.completions.create(body, messages=history, tool_choice="auto", max_tokens=3, temperature=0)
    prompt = svc.template.render(history, add_generation_prompt=True, tools=[CLOCK, TRIP])
    assert prompt.endswith("".join(f'[TOOL_RESULTS]{{"content": done, "call_id": "{i}"}}[/TOOL_RESULTS]'
                                   for i in ids))
    assert answer["usage"]["prompt_tokens"] == len(Conversation(svc.tokenizer, svc.template, history,
                                                                tools=[CLOCK, TRIP]).prompt_ids())
    engine.close()
