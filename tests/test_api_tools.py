"""Tools through pagedkv.api.Engine: the tiny model under tool histories and sessions, and the real SmolLM2-135M
calling a forced get_weather and answering its result in text, streamed and not."""
from __future__ import annotations

import dataclasses
import json

import pytest

from pagedkv.api import Engine
from pagedkv.chat import Conversation
from pagedkv.model.tiny import tiny_config, write_tiny_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 22, "sky": "sunny"}'}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny random model with room for the tools' instruction (its byte-level vocabulary spends a token on
    about every character of it)."""
    path = tmp_path_factory.mktemp("models") / "tiny-long"
    write_tiny_model(path, seed=0, config=dataclasses.replace(tiny_config(), context_length=2048))
    return Engine([path], budget_mib=64)


def service(engine):
    return engine.services[engine.model_id]


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
    assert svc._sessions["t1"].tools == (WEATHER,)
    # Other tools: the system message differs, so the history is rendered afresh (and becomes the session)
    tiny.chat.completions.create(model=tiny.model_id, messages=turn, tools=[WEATHER], tool_choice="none",
                                 max_tokens=1, pagedkv={"session": "t1"})
    assert svc._sessions["t1"].tools == ()
    assert tiny.forget("t1")


def test_tool_choice_none_shows_no_tools_and_parses_no_call(tiny):
    svc = service(tiny)
    out = tiny.chat.completions.create(model=tiny.model_id, messages=ASK, tools=[WEATHER], tool_choice="none",
                                       max_tokens=3, temperature=0)
    assert out["usage"]["prompt_tokens"] == len(Conversation(svc.tokenizer, svc.template, ASK).prompt_ids())
    assert "tool_calls" not in out["choices"][0]["message"]
