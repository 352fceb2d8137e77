"""The chat page's own turns never stall the other chats (issue 49): a message longer than one slice of its
tokenizer is checked, rendered and tokenized in slices with the engine's steps between them, the chat busy
meanwhile (ChatService.send, Chat.preparing); a shorter one is prepared at once, as before. Measured on the
engine's own events (its steps, each word merged), not on a clock."""
from __future__ import annotations

import asyncio
import time

import pytest
from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from test_chat_service import in_fresh_loop, of
from test_no_stall import distinct_words

from pagedkv.backends.cpu import CpuBackend
from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.slices import SLICE_CHARS
from pagedkv.tokenizer import Tokenizer
from pagedkv_app.chat_service import ChatService

STREAM = {"temperature": 0, "max_tokens": 100}


@pytest.fixture()
def service(tiny_weights, monkeypatch):  # noqa: F811
    """A chat service whose engine records its steps and its tokenizer each word it merges (chars) in `events`."""
    tok = Tokenizer.from_manifest(tiny_weights.manifest)
    engine = LLMEngine(CpuBackend(tiny_weights, num_blocks=64, block_size=16), tok, EngineConfig())
    posts, events = [], []
    svc = ChatService(engine, ChatTemplate.from_manifest(tiny_weights.manifest, tok),
                      lambda kind, **p: posts.append((kind, p)), model_name="tiny-random")
    model = svc.api.service_of(None).tokenizer._model
    bpe, step = model._bpe, engine.step
    monkeypatch.setattr(model, "_bpe", lambda word: events.append(len(word)) or bpe(word))

    async def counted_step():
        outputs = await step()
        events.append("step")
        return outputs
    monkeypatch.setattr(engine, "step", counted_step)
    return svc, posts, events


async def streaming(svc, posts, chat_id: str) -> None:
    """Chat `chat_id` asks for a long reply and has streamed a few tokens."""
    svc.send(chat_id, "tell me a long story", STREAM)
    while len([p for p in of(posts, "token") if p["chat"] == chat_id]) < 3:
        await asyncio.sleep(0)


async def answered(posts, chat_id: str, kinds=("turn-start", "chat-error")) -> tuple[str, dict]:
    """The first of `kinds` posted for the chat, once it is (a bound, not a pace: 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for kind, p in posts:
            if kind in kinds and p.get("chat") == chat_id:
                return kind, p
        await asyncio.sleep(0)
    raise AssertionError(f"nothing of {kinds} was posted for {chat_id}: {posts[-3:]}")


def merged_between_steps(events) -> list[int]:
    between = [0]
    for event in events:
        if event == "step":
            between.append(0)
        else:
            between[-1] += event
    return between


def test_a_long_paste_is_prepared_between_another_chats_steps(service):
    """A ~100k-character paste (distinct words, so each is merged when it is tokenized) while another chat streams:
    send returns no request id, the chat refuses a second Send while it is prepared, the other chat gets a step
    between every two slices of SLICE_CHARS characters, and the refusal (the tiny model's context) comes as the
    chat's chat-error, its history as it was."""
    svc, posts, events = service
    words = distinct_words(25_000)
    paste = "".join(words)
    assert len(paste) > 3 * SLICE_CHARS

    async def scenario():
        a, b = svc.open_session("chat-a"), svc.open_session("chat-b")
        before = b.conversation.checkpoint()
        await streaming(svc, posts, "chat-a")
        events.clear()
        svc.api.service_of(None).tokenizer._model._cache.clear()  # every word merged again by the request
        assert svc.send("chat-b", paste, STREAM) is None and b.preparing is not None
        with pytest.raises(ValueError, match="still answering"):
            svc.send("chat-b", "again", STREAM)
        kind, answer = await answered(posts, "chat-b")
        svc.stop("chat-a")
        await svc._loop_task
        return a, b, before, kind, answer

    a, b, before, kind, answer = in_fresh_loop(scenario)
    assert kind == "chat-error" and "context is 256" in answer["message"], answer
    assert b.conversation.checkpoint() == before and not b.busy and not a.busy
    between = merged_between_steps(events)
    assert sum(between) >= len(paste)  # every word went through the merges
    longest = max(map(len, words))
    assert max(between) <= SLICE_CHARS + longest + 1, max(between)
    assert len([n for n in between if n]) >= len(paste) // (SLICE_CHARS + longest + 1)  # a step between slices
    assert [e["reason"] for e in of(posts, "turn-end")] == ["abort"]  # chat-a streamed all along


def test_a_turn_prepared_in_slices_starts_and_streams_its_reply(service, monkeypatch):
    """With slices of 32 characters a 160-character message is prepared in slices while another chat streams:
    then turn-start, the reply, and the message in the history, as a turn prepared at once."""
    svc, posts, events = service
    monkeypatch.setattr(type(svc.api.service_of(None).tokenizer._model), "slice_chars", 32)
    message = "".join(distinct_words(40))
    assert len(message) > 4 * 32

    async def scenario():
        a, b = svc.open_session("chat-a"), svc.open_session("chat-b")
        await streaming(svc, posts, "chat-a")
        events.clear()
        assert svc.send("chat-b", message, {"temperature": 0, "max_tokens": 6}) is None
        kind, answer = await answered(posts, "chat-b")
        steps_before_start = events.count("step")
        svc.stop("chat-a")
        await svc._loop_task
        while b.busy:
            await asyncio.sleep(0)
        return b, kind, answer, steps_before_start

    b, kind, answer, steps_before_start = in_fresh_loop(scenario)
    assert kind == "turn-start" and steps_before_start >= 3, (kind, answer)
    end = [e for e in of(posts, "turn-end") if e["chat"] == "chat-b"][-1]
    assert end["tokens"] == 6 and end["reason"] == "length"
    assert b.conversation.messages[-2:] == [{"role": "user", "content": message},
                                            {"role": "assistant", "content": end["content"]}]


def test_stop_or_delete_while_a_turn_is_prepared_queues_nothing(service, monkeypatch):
    """Stop while the turn is prepared: chat-error (the page puts the text back), nothing queued, the history as it
    was, and the chat takes a message again. Delete meanwhile: the chat is gone and nothing is queued."""
    svc, posts, _ = service
    monkeypatch.setattr(type(svc.api.service_of(None).tokenizer._model), "slice_chars", 64)
    message = "".join(distinct_words(100))

    async def scenario():
        b = svc.open_session("chat-b")
        before = b.conversation.checkpoint()
        svc.send("chat-b", message, STREAM)
        await asyncio.sleep(0)  # its first slice
        svc.stop("chat-b")
        stopped = (b.busy, svc.engine.has_unfinished, b.conversation.checkpoint() == before)
        kind, answer = await answered(posts, "chat-b")
        svc.send("chat-b", "short", {"temperature": 0, "max_tokens": 2})  # at once: a request id now
        assert b.request_id is not None
        await svc._loop_task
        c = svc.open_session("chat-c")
        svc.send("chat-c", message, STREAM)
        await asyncio.sleep(0)
        svc.forget_session("chat-c")
        for _ in range(50):
            await asyncio.sleep(0)
        return stopped, kind, answer, c

    stopped, kind, answer, c = in_fresh_loop(scenario)
    assert stopped == (False, False, True)
    assert (kind, answer["message"]) == ("chat-error", "stopped before its reply began")
    assert not c.busy and "chat-c" not in svc.sessions and not svc.engine.has_unfinished
    assert not [p for p in of(posts, "turn-start") if p["chat"] == "chat-c"]


def test_a_preparation_that_fails_unexpectedly_still_answers_the_page(service, monkeypatch):
    """Whatever fails while a long turn is prepared reaches the page as the chat's chat-error (the page waits for
    turn-start or chat-error), and the chat takes a message again."""
    svc, posts, _ = service
    monkeypatch.setattr(type(svc.api.service_of(None).tokenizer._model), "slice_chars", 32)
    api = svc.api.service_of(None)

    async def broken(body, *args, **kw):
        raise RuntimeError("the disk is on fire")

    async def scenario():
        b = svc.open_session("chat-b")
        monkeypatch.setattr(api, "stream", broken)
        svc.send("chat-b", "".join(distinct_words(40)), STREAM)
        kind, answer = await answered(posts, "chat-b")
        monkeypatch.undo()
        return b, kind, answer

    b, kind, answer = in_fresh_loop(scenario)
    assert (kind, answer["message"]) == ("chat-error", "RuntimeError: the disk is on fire") and not b.busy
