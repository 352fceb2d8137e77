"""Structured output through pagedkv.api.Engine (CPU backend): response_format json_schema and json_object with the
real SmolLM2-135M (10 of 10 seeds at temperature 0.8 end with "stop" and validate), and with the tiny model each
sample's own automaton (n > 1 equal to lone seeded requests), a grammar request batched beside a plain one (which
replies exactly as alone), legacy completions refusing response_format, and `python3 -m pagedkv complete`."""
from __future__ import annotations

import asyncio
import json

import pytest

from model_fixtures import REAL_MODEL_DIR, real_weights, tiny_dir  # noqa: F401  (fixtures)
from pagedkv.api import ApiError, Engine
from pagedkv.sampling import SamplingParams
from test_chat_service import in_fresh_loop
from test_cli import run_cli

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "the person's name", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "student": {"type": "boolean"},
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3},
    },
    "required": ["name", "age", "student", "color", "hobbies"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person as JSON with name, age, student, favourite color and hobbies."}]


def validate(value, schema: dict) -> None:
    """Raise AssertionError unless `value` fits `schema` (the keywords PERSON uses)."""
    if "enum" in schema:
        assert value in schema["enum"], (value, schema["enum"])
        return
    kind = schema["type"]
    if kind == "object":
        assert isinstance(value, dict) and set(value) == set(schema["required"]), value
        for key, sub in schema["properties"].items():
            validate(value[key], sub)
    elif kind == "array":
        assert isinstance(value, list) and len(value) <= schema.get("maxItems", len(value)), value
        for item in value:
            validate(item, schema["items"])
    elif kind == "integer":
        assert type(value) is int and schema["minimum"] <= value <= schema["maximum"], value
    elif kind == "boolean":
        assert type(value) is bool, value
    else:
        assert isinstance(value, str) and len(value) <= schema["maxLength"], value


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def smollm2(real_weights):  # noqa: F811
    return Engine([REAL_MODEL_DIR], budget_mib=700)


def test_smollm2_json_schema_ten_of_ten_seeds_stop_and_validate(smollm2):
    # n=10 with seed 0: sample i draws what a lone request with seed i would (SamplingParams.for_sample), each
    # with its own automaton state; one batched request keeps this CPU test short.
    out = smollm2.chat.completions.create(model=smollm2.model_id, messages=ASK, temperature=0.8, seed=0, n=10,
                                          max_tokens=100, response_format=json_schema(PERSON))
    assert [c["finish_reason"] for c in out["choices"]] == ["stop"] * 10
    for choice in out["choices"]:
        validate(json.loads(choice["message"]["content"]), PERSON)


def test_smollm2_json_object_mode_gives_an_object(smollm2):
    ask = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    out = smollm2.chat.completions.create(model=smollm2.model_id, temperature=0, max_tokens=40, messages=ask,
                                          response_format={"type": "json_object"})
    choice = out["choices"][0]
    assert (choice["finish_reason"], json.loads(choice["message"]["content"])) == ("stop", {"city": "Paris"})


ENUM = {"enum": ["alpha", "beta", 12]}


@pytest.fixture(scope="module")
def tiny(tiny_dir):  # noqa: F811
    return Engine([tiny_dir], budget_mib=64)


def test_tiny_samples_each_follow_their_own_grammar_state(tiny):
    # The random model never chooses to stop; the grammar ends it: once a value is complete only EOS is left.
    body = dict(model=tiny.model_id, messages=ASK, temperature=1.0, seed=7, max_tokens=20,
                response_format=json_schema(ENUM))
    together = tiny.chat.completions.create(n=3, **body)["choices"]
    alone = [tiny.chat.completions.create(**{**body, "seed": 7 + i})["choices"][0] for i in range(3)]
    assert [c["message"]["content"] for c in together] == [c["message"]["content"] for c in alone]
    assert [c["finish_reason"] for c in together] == ["stop"] * 3
    assert all(json.loads(c["message"]["content"]) in ENUM["enum"] for c in together)


def test_tiny_grammar_request_batched_beside_a_plain_one(tiny):
    plain = dict(model=tiny.model_id, messages=ASK, temperature=0, max_tokens=12)
    shaped = dict(plain, response_format=json_schema(ENUM))
    lone_plain = tiny.chat.completions.create(**plain)["choices"][0]["message"]["content"]
    lone_shaped = tiny.chat.completions.create(**shaped)["choices"][0]["message"]["content"]

    async def both():
        return await asyncio.gather(tiny.chat.completions.acreate(**plain), tiny.chat.completions.acreate(**shaped))

    got = [r["choices"][0]["message"]["content"] for r in in_fresh_loop(both)]
    assert got == [lone_plain, lone_shaped] and json.loads(lone_shaped) in ENUM["enum"]


def test_plain_requests_keep_the_device_sampling_path(tiny):
    lane = tiny.llm.lane(None)
    rid = lane.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    member = lane.groups.members[rid]
    assert member.sampler.matcher is None and member.sampler.argmax_only and member.sampler.on_device
    lane.abort(rid)


def test_legacy_completions_refuse_response_format(tiny):
    with pytest.raises(ApiError) as err:
        tiny.completions.create(model=tiny.model_id, prompt="hi", response_format={"type": "json_object"})
    assert (err.value.status, err.value.param) == (400, "response_format")
    with pytest.raises(ApiError) as err:
        tiny.chat.completions.create(model=tiny.model_id, messages=ASK,
                                     response_format=json_schema({"type": "string", "format": "email"}))
    assert err.value.param == "response_format" and "schema.format" in err.value.message


def test_cli_complete_with_response_format(tiny_dir, tmp_path):  # noqa: F811
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
            "temperature": 0, "response_format": json_schema(ENUM)}
    path = tmp_path / "body.json"
    path.write_text(json.dumps(body))
    done = run_cli("complete", "--model", str(tiny_dir), "--body-json", str(path))
    assert done.returncode == 0, done.stderr
    choice = json.loads(done.stdout)["choices"][0]
    assert choice["finish_reason"] == "stop" and json.loads(choice["message"]["content"]) in ENUM["enum"]
