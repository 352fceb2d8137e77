"""pagedkv.api.Engine under CPython (tiny model, CPU backend): OpenAI Chat Completions objects and chunks, stop
strings held back across pieces, n, usage, the errors' statuses and fields, concurrent requests in one step loop
each equal to running alone, and an early close or a signal freeing the request's blocks."""
from __future__ import annotations

import asyncio

import pytest

from model_fixtures import tiny_dir  # noqa: F401  (fixture)
from pagedkv.api import ApiError, Engine
from pagedkv.chat import Conversation
from pagedkv.completions import StopStrings, parse_request
from pagedkv.engine import run_sync
from pagedkv.sampling import SamplingParams
from test_chat_service import in_fresh_loop


def service(engine):
    """The completion service of the engine's first model (its tokenizer, template and sessions)."""
    return engine.services[engine.model_id]


HI = [{"role": "user", "content": "hello there, tell me a story"}]


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return Engine([tiny_dir], budget_mib=64)


def reference(engine, messages, max_tokens: int) -> tuple[list[int], str]:
    """The greedy reply from LLMEngine directly (no API layer): ids and the text the API must give."""
    prompt = Conversation(service(engine).tokenizer, service(engine).template, messages).prompt_ids()
    req = run_sync(engine.llm.generate(prompt, SamplingParams(max_tokens=max_tokens)))
    ids = [t for t in req.output_ids if t not in engine.llm.default_stop_ids]
    return req.output_ids, service(engine).tokenizer.decode(ids)


def used_blocks(engine) -> int:
    """Blocks some request holds (a finished or aborted one holds none; cached prefixes are not held)."""
    return engine.llm.stats()["used_blocks"]


def test_completion_object_matches_the_engine_and_counts_usage(engine):
    ids, text = reference(engine, HI, 12)
    out = engine.chat.completions.create(model=engine.model_id, messages=HI, max_tokens=12, temperature=0)
    assert out["object"] == "chat.completion" and out["model"] == engine.model_id
    (choice,) = out["choices"]
    assert choice["message"] == {"role": "assistant", "content": text}
    assert choice["finish_reason"] == ("length" if len(ids) == 12 and ids[-1] not in engine.llm.default_stop_ids
                                       else "stop")
    prompt = len(Conversation(service(engine).tokenizer, service(engine).template, HI).prompt_ids())
    assert out["usage"]["prompt_tokens"] == prompt and out["usage"]["completion_tokens"] == len(ids)
    assert out["usage"]["total_tokens"] == prompt + len(ids)
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the reference run left the prompt cached
    assert engine.models.list()["data"][0]["id"] == engine.model_id


def test_stream_chunks_join_to_the_same_text_and_end_with_usage(engine):
    _, text = reference(engine, HI, 16)
    chunks = list(engine.chat.completions.create(model=engine.model_id, messages=HI, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    body = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in body) == text
    assert body[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1


def test_stop_string_cuts_the_reply_and_frees_the_blocks(engine):
    _, text = reference(engine, HI, 24)
    assert len(text) > 6
    stop = text[3:6]  # a stop string inside the reply (the text before its first occurrence comes out)
    out = engine.chat.completions.create(model=engine.model_id, messages=HI, max_tokens=24, temperature=0, stop=[stop])
    assert out["choices"][0]["message"]["content"] == text[:text.find(stop)]
    assert out["choices"][0]["finish_reason"] == "stop"
    assert used_blocks(engine) == 0 and not engine.llm.has_unfinished


def test_stop_strings_are_held_back_across_pieces():
    stops = StopStrings(("END", "xyz"))
    assert stops.push("abc E") == ("abc ", False)  # "E" may begin END: held
    assert stops.push("N") == ("", False)
    assert stops.push("x") == ("EN", False)  # "ENx" is no stop, but "x" may begin xyz
    assert stops.push("y") == ("", False)
    assert stops.push("zzz") == ("", True)
    assert stops.flush() == "" and stops.push("more") == ("", True)
    plain = StopStrings(("!!",))
    assert plain.push("hi!") == ("hi", False) and plain.flush() == "!"


def test_two_concurrent_requests_each_reply_as_alone(engine):
    other = [{"role": "user", "content": "what about boats and the sea?"}]
    _, alone_a = reference(engine, HI, 10)
    _, alone_b = reference(engine, other, 10)

    async def both():
        a = engine.chat.completions.acreate(model=engine.model_id, messages=HI, max_tokens=10, temperature=0)
        b = engine.chat.completions.acreate(model=engine.model_id, messages=other, max_tokens=10, temperature=0)
        return await asyncio.gather(a, b)

    a, b = in_fresh_loop(both)
    assert a["choices"][0]["message"]["content"] == alone_a
    assert b["choices"][0]["message"]["content"] == alone_b


def test_n_samples_and_seed(engine):
    body = dict(model=engine.model_id, messages=HI, max_tokens=8, temperature=0.9, seed=5, n=3)
    out = engine.chat.completions.create(**body)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert engine.chat.completions.create(**body)["choices"] == out["choices"]  # seeded: the same again


def test_closing_a_stream_early_or_a_signal_aborts_and_frees(engine):
    # greedy (its reply runs past 3 chunks): a sampled one may draw the end token at once
    stream = engine.chat.completions.create(model=engine.model_id, messages=HI, max_tokens=40, stream=True,
                                            temperature=0)
    next(stream), next(stream), next(stream)
    assert used_blocks(engine) > 0  # the request holds its prompt's blocks while it streams
    stream.close()
    assert not engine.llm.has_unfinished and used_blocks(engine) == 0

    async def signalled():
        signal = asyncio.Event()
        chunks = await engine.chat.completions.acreate(model=engine.model_id, messages=HI, max_tokens=40,
                                                       stream=True, signal=signal, temperature=0)
        got = []
        async for piece in chunks:
            got.append(piece)
            if len(got) == 3:
                signal.set()
        return got

    assert len(in_fresh_loop(signalled)) <= 4
    assert not engine.llm.has_unfinished and used_blocks(engine) == 0


@pytest.mark.parametrize("body,status,param", [
    ({"messages": HI}, 400, "model"),
    ({"model": "nope", "messages": HI}, 404, "model"),
    ({"model": "M", "messages": []}, 400, "messages"),
    ({"model": "M", "messages": HI, "tools": []}, 400, "tools"),
    ({"model": "M", "messages": HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "a+"}}}}, 400, "response_format"),
    ({"model": "M", "messages": HI, "temperature": 3}, 400, "temperature"),
    ({"model": "M", "messages": HI, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "M", "messages": HI, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": "M", "messages": HI, "n": 99}, 400, "n"),
    ({"model": "M", "messages": HI, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"model": "M", "messages": HI, "frobnicate": 1}, 400, "frobnicate"),
])
def test_bad_requests_name_the_field(body, status, param):
    with pytest.raises(ApiError) as err:
        parse_request(body, ["M"])
    assert (err.value.status, err.value.param) == (status, param)
    assert err.value.body()["error"]["param"] == param and err.value.body()["error"]["message"]


def test_too_long_prompt_and_max_tokens_are_400_with_both_numbers(engine):
    long = [{"role": "user", "content": "word " * (engine.context_length + 10)}]
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(model=engine.model_id, messages=long)
    assert err.value.status == 400 and str(engine.context_length) in err.value.message
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(model=engine.model_id, messages=HI, max_tokens=engine.context_length)
    assert err.value.status == 400 and err.value.param == "max_tokens"
    assert not engine.llm.has_unfinished


def test_budget_too_small_is_413_with_the_numbers(tiny_dir):
    with pytest.raises(ApiError) as err:
        Engine([tiny_dir], budget_mib=0)
    assert err.value.status == 413 and "MiB" in err.value.message


def test_closed_engine_is_503(tiny_dir):
    engine = Engine([tiny_dir], budget_mib=64)
    engine.close()
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(model=engine.model_id, messages=HI)
    assert err.value.status == 503


def test_a_session_continues_on_its_exact_token_ids(tiny_dir):
    engine = Engine([tiny_dir], budget_mib=64)  # its own prefix cache: nothing cached from other tests
    first = engine.chat.completions.create(model=engine.model_id, messages=HI, max_tokens=20, temperature=0,
                                           pagedkv={"session": "s1"})
    reply = first["choices"][0]["message"]
    turn2 = HI + [reply, {"role": "user", "content": "and then what happened?"}]
    second = engine.chat.completions.create(model=engine.model_id, messages=turn2, max_tokens=4, temperature=0,
                                            pagedkv={"session": "s1"})
    use = first["usage"]
    computed = use["prompt_tokens"] + use["completion_tokens"] - 1  # the reply's last token is never computed
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == computed // 16 * 16 > 0
    session = service(engine).sessions.get("s1").conversation
    assert session.messages[:3] == turn2 and session.messages[3]["role"] == "assistant"
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(model=engine.model_id, messages=HI, n=2, pagedkv={"session": "s1"})
    assert (err.value.status, err.value.param) == (400, "n")
    assert engine.forget("s1") and not engine.forget("s1")
    # A session whose messages the request does not start with: the messages are rendered afresh.
    other = [{"role": "user", "content": "something else entirely"}]
    out = engine.chat.completions.create(model=engine.model_id, messages=other, max_tokens=3, temperature=0,
                                         pagedkv={"session": "s2"})
    assert out["choices"][0]["finish_reason"] in ("stop", "length") and "s2" in service(engine).sessions
