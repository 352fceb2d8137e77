"""No request stalls another stream for more than one step (issue 49): a long prompt's prefill is cut into chunks
that fit the step's token budget beside the running streams, so a decoding stream gets its token at every step
while the prefill runs, and no step computes more than the budget. Measured on the engine's own events (each
step's outputs, each forward's batch), not on a clock."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from model_fixtures import reference_greedy, tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from slice_pauses import pauses_and_result
import pagedkv.chat as chat
from pagedkv.api import ApiError, Engine
from pagedkv.backends.cpu import CpuBackend
from pagedkv.chat import Conversation, validate_message
from pagedkv.completions import parse_request, parse_request_slices
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.grammar import Grammar
from pagedkv.grammar.schema import compile_schema
from pagedkv.request_limits import MAX_MESSAGES
from pagedkv.sampling import SamplingParams
from pagedkv.slices import SLICE_CHARS, SLICE_MESSAGES, SLICE_SCHEMA_NODES, run_slices
from pagedkv.tool_calls import ToolFormat
from pagedkv.tools import ToolChoice, call_grammar_slices
from pagedkv.tokenizer import Tokenizer

BUDGET = 32  # tokens one step computes at most (max_num_batched_tokens)
# SHORT decodes 12 greedy tokens equal to the numpy reference, in mixed batches too (test_abort_during_step).
SHORT = list(range(3, 8))
GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(10_000,))  # a stop id the tiny vocab never emits
LONG = [50 + (7 * i) % 400 for i in range(200)]  # 200 tokens: ceil(200 / 31) = 7 chunks beside the decoding stream


def run_alone(coro):
    """asyncio.run in a thread of its own: when the browser tests ran first, Playwright's sync API keeps a loop
    running in this thread, where asyncio.run refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class CountingBackend(CpuBackend):
    """Records the tokens of each forward's batch."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.batches: list[int] = []

    async def forward(self, batch, *, greedy=False, attention_mass=None):
        self.batches.append(len(batch.token_ids))
        return await super().forward(batch, greedy=greedy, attention_mass=attention_mass)


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):  # noqa: F811
    return Tokenizer.from_manifest(tiny_weights.manifest)


def test_a_long_prefill_never_costs_a_decoding_stream_a_step(tiny_weights, tiny_model, tokenizer):  # noqa: F811
    backend = CountingBackend(tiny_weights, num_blocks=64, block_size=16)
    engine = LLMEngine(backend, tokenizer, EngineConfig(max_num_batched_tokens=BUDGET))

    async def run() -> tuple[str, str, list[dict[str, int]]]:
        steps = []  # per step: tokens each request got
        a = engine.add_request(SHORT, GREEDY)
        steps.append({o.request_id: len(o.token_ids) for o in await engine.step()})
        b = engine.add_request(LONG, SamplingParams(max_tokens=2, stop_token_ids=(10_000,)))
        while engine.is_unfinished(b):
            steps.append({o.request_id: len(o.token_ids) for o in await engine.step()})
        return a, b, steps

    a, b, steps = run_alone(run())
    arrived = steps[1:]
    # While b's 200 prompt tokens are computed (7 steps of at most 31 beside a's one), a gets a token every step;
    # b's first token comes with its last chunk, its second a step later.
    assert [s.get(a) for s in arrived] == [1] * 8
    assert [s.get(b) for s in arrived] == [0] * 6 + [1, 1]
    assert backend.batches == [5] + [32] * 6 + [1 + 200 - 6 * 31, 2]
    assert max(backend.batches) <= BUDGET
    assert engine.request(a).output_ids[:9] == reference_greedy(tiny_model, SHORT, 12)[:9]


def distinct_words(n: int) -> list[str]:
    """n different lower-case words, each after a space (" abb", " bbb", ...): no word hits the tokenizer's cache,
    so each is merged (BpeModel._bpe) once, when it is tokenized."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = []
    for i in range(n):
        word = ""
        i += 26 * 27  # three letters and up
        while i:
            i, r = divmod(i, 26)
            word += letters[r]
        words.append(" " + word)
    return words


def test_a_big_body_is_prepared_in_slices_between_a_streams_steps(tiny_dir, monkeypatch):  # noqa: F811
    """A valid body of ~0.5 MB (5 messages) arrives while a stream decodes: it is rendered and tokenized in slices
    of SLICE_CHARS characters with the engine's steps between them (slices.py), so the stream gets its token at
    every step meanwhile and never waits for more than one slice; then the body is refused for the tiny model's
    context (256 tokens). Its text goes through the tokenizer's merges (BpeModel._bpe) word by word: the
    characters merged between two steps are counted."""
    engine = Engine([tiny_dir], budget_mib=16)
    service = engine.services["tiny-random"]
    events: list = []  # "step" per engine step, and the characters of each word merged
    model = service.tokenizer._model
    bpe = model._bpe
    monkeypatch.setattr(model, "_bpe", lambda word: events.append(len(word)) or bpe(word))
    step = engine.llm.step

    async def counted_step():
        outputs = await step()
        events.append("step")
        return outputs
    monkeypatch.setattr(engine.llm, "step", counted_step)
    words = distinct_words(100_000)
    big = [{"role": "user", "content": "".join(words[i * 20_000:(i + 1) * 20_000])} for i in range(5)]
    text = "".join(words)
    expected_tokens = len(run_slices(Conversation(service.tokenizer, service.template, big).prompt_ids_slices()))
    model._cache.clear()  # every word merged again by the request
    events.clear()

    async def run() -> tuple[list[int], ApiError]:
        never_ends = {str(i): -100 for i in service.tokenizer.eog_ids}  # 200 tokens: it streams all along
        stream = await engine.chat.completions.acreate(model="tiny-random", stream=True, max_tokens=200,
                                                       temperature=0, logit_bias=never_ends,
                                                       messages=[{"role": "user", "content": "hi"}])
        got: list[int] = []  # the stream's tokens, one entry per chunk of text
        started = asyncio.Event()

        async def read() -> None:
            async for piece in stream:
                got.append(len(piece["choices"][0]["delta"].get("content") or "") if piece["choices"] else 0)
                if len(got) == 3:
                    started.set()
        reader = asyncio.ensure_future(read())
        await started.wait()
        try:
            await engine.chat.completions.acreate(model="tiny-random", max_tokens=2, messages=big)
        except ApiError as err:
            refused = err
        reader.cancel()
        return got, refused

    _, refused = run_alone(run())
    assert (refused.status, refused.message) == (
        400, f"the prompt has {expected_tokens} tokens; tiny-random's context is 256")
    # the characters merged between two steps of the stream (and before the first, after the last)
    between, merged = [0], 0
    for event in events:
        if event == "step":
            between.append(0)
        else:
            between[-1] += event
            merged += event
    assert merged >= len(text)  # every word went through the merges (and the templates' few)
    longest = max(map(len, words))
    assert max(between) <= SLICE_CHARS + longest + 1, max(between)
    assert len([b for b in between if b]) >= merged // (SLICE_CHARS + longest + 1)  # a step between every two slices


def test_a_session_that_starts_another_request_while_a_body_is_prepared_refuses_it(tiny_dir):  # noqa: F811
    """The engine steps between a body's slices, and so do other requests: one on the same session that runs
    meanwhile (a small body, prepared at once, answered while the big one is prepared) wins, and the big one,
    prepared on the history before it, is refused when its preparation ends, not queued over that turn."""
    engine = Engine([tiny_dir], budget_mib=16)
    big = [{"role": "user", "content": "".join(distinct_words(50_000))}]  # ~240k characters: ~16 slices
    small = [{"role": "user", "content": "hi"}]

    async def run():
        prepared = asyncio.ensure_future(engine.chat.completions.acreate(
            model="tiny-random", max_tokens=2, messages=big, pagedkv={"session": "s"}))
        await asyncio.sleep(0)  # its first slice
        reply = await engine.chat.completions.acreate(model="tiny-random", max_tokens=2, temperature=0,
                                                      messages=small, pagedkv={"session": "s"})
        with pytest.raises(ApiError) as err:
            await prepared
        return reply, err.value

    reply, refused = run_alone(run())
    assert reply["usage"]["completion_tokens"] == 2
    assert (refused.status, refused.param, refused.message) == (
        400, "pagedkv.session", "pagedkv.session 's' took another request while this one was prepared; send it "
                                "again on the history the session has now")


def many_messages(n: int) -> list[dict]:
    """n messages of every form parse_request checks: text, text parts, tool calls and their results."""
    messages = []
    for i in range(n):
        if i % 4 == 2:
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "get", "arguments": f'{{"n": {i}}}'}}]})
        elif i % 4 == 3:
            messages.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": f"result {i}"})
        else:
            messages.append({"role": "user", "content": [{"type": "text", "text": f"word {i}"},
                                                         {"type": "text", "text": "more"}]} if i % 8 == 4
                            else {"role": "user" if i % 4 == 0 else "assistant", "content": f"word {i}"})
    return messages


def test_a_4096_message_body_is_checked_in_slices_with_the_result_of_one_pass():
    """parse_request pauses after every SLICE_MESSAGES messages checked and every SLICE_SCHEMA_NODES schemas of
    response_format compiled (slices.py), and gives what one pass gives: each message checked alone, the schema's
    grammar compiled at once."""
    schema = {"type": "object", "properties": {
        f"p{j}": {"type": "array", "items": {"type": "object", "properties": {f"q{k}": {"type": "integer"}
                                                                             for k in range(6)}}}
        for j in range(40)}}  # 1 + 40 * (1 + 1 + 6) = 321 schemas
    tools = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": many_messages(MAX_MESSAGES), "tools": tools, "temperature": 0.5,
            "response_format": {"type": "json_schema", "json_schema": {"name": "rows", "schema": schema}}}
    pauses, req = pauses_and_result(parse_request_slices(body, ["m"]))
    assert pauses == MAX_MESSAGES // SLICE_MESSAGES + 321 // SLICE_SCHEMA_NODES == 16 + 10
    assert req.messages == [validate_message(m, index=i) for i, m in enumerate(body["messages"])]
    assert req.messages[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "get", "arguments": '{"n": 2}'}}]}
    assert req.messages[4] == {"role": "user", "content": "word 4\nmore"}
    assert req.grammar == Grammar(compile_schema(schema, "response_format.json_schema.schema"))
    assert req == parse_request(body, ["m"])
    assert (req.temperature, req.tools[0]["function"]["name"]) == (0.5, "get")
    # a forced call's grammar (the service's _grammar) compiles a tool's parameters in slices too
    forced = call_grammar_slices(ToolFormat("tagged", False), ({"type": "function", "function": {
        "name": "rows", "parameters": schema}},), ToolChoice("required"))
    assert sum(1 for _ in forced) == 321 // SLICE_SCHEMA_NODES


def test_a_4096_message_body_is_checked_and_rendered_between_a_streams_steps(tiny_dir, monkeypatch):  # noqa: F811
    """The same body arriving while a stream decodes: its messages are checked (parse_request, then again where
    the conversation renders them) at most SLICE_MESSAGES between two of the stream's steps, and the stream gets
    a token at every step meanwhile; then the body is refused for the tiny model's context."""
    engine = Engine([tiny_dir], budget_mib=16)
    service = engine.services["tiny-random"]
    events: list = []  # "step" per engine step, 1 per message checked
    check = chat.validate_message
    monkeypatch.setattr(chat, "validate_message", lambda m, index=0: events.append(1) or check(m, index=index))
    step = engine.llm.step

    async def counted_step():
        outputs = await step()
        events.append("step")
        return outputs
    monkeypatch.setattr(engine.llm, "step", counted_step)
    messages = many_messages(MAX_MESSAGES)
    tools = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
    expected_tokens = len(run_slices(Conversation(service.tokenizer, service.template, messages,
                                                  tools=tools).prompt_ids_slices()))
    events.clear()

    async def run() -> tuple[list[int], ApiError]:
        never_ends = {str(i): -100 for i in service.tokenizer.eog_ids}
        stream = await engine.chat.completions.acreate(model="tiny-random", stream=True, max_tokens=200,
                                                       temperature=0, logit_bias=never_ends,
                                                       messages=[{"role": "user", "content": "hi"}])
        got: list[int] = []
        started = asyncio.Event()

        async def read() -> None:
            async for piece in stream:
                got.append(1)
                if len(got) == 3:
                    started.set()
        reader = asyncio.ensure_future(read())
        await started.wait()
        events.clear()  # from here on: the big body's checks, and the stream's steps meanwhile
        try:
            await engine.chat.completions.acreate(model="tiny-random", max_tokens=2, messages=messages, tools=tools)
        except ApiError as err:
            refused = err
        reader.cancel()
        return got, refused

    _, refused = run_alone(run())
    assert (refused.status, refused.message) == (
        400, f"the prompt has {expected_tokens} tokens; tiny-random's context is 256")
    between = [0]  # messages checked between two steps
    for event in events:
        if event == "step":
            between.append(0)
        else:
            between[-1] += event
    assert sum(between) >= 3 * MAX_MESSAGES  # parse_request's check, then the conversation's, then its render's
    assert max(between) == SLICE_MESSAGES, between
