"""The chat service against a hostile fallback server on loopback: every bad answer ends the reply with a clear
error, keeps what was streamed and leaves the chat idle; nothing is held open; a reload keeps a partial reply."""
from __future__ import annotations

import asyncio
import time

import pytest

from loopback_sse import SSE_HEAD, HostileServer, endless, never_answers, open_stream, stalls_after
from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from test_chat_fallback import make_service, of
from test_chat_service import in_fresh_loop
from test_remote import chunk_event

HI = chunk_event("Hi")


async def until_idle(chat, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while chat.request_id is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"the chat is still busy {seconds} s after the reply started")
        await asyncio.sleep(0.01)


def converse(tiny_weights, behave, settings: dict, *, stop_after_s: float | None = None):
    """Send "hello" with the fallback set to a HostileServer running `behave`, wait until the chat is idle,
    then press Stop (a no-op then, and it must not raise). Returns (chat, posts, how the connection ended) with
    the last taken while the loop still runs (closing the loop would cancel a forgotten connect)."""
    with HostileServer(behave) as server:
        svc, posts, _ = make_service(tiny_weights, 8, [], webgpu=False, open_stream=open_stream)

        async def scenario():
            chat = svc.open_session("chat-1")
            svc.send(chat.session_id, "hello", {"max_tokens": 8, "fallback_url": server.url, "fallback_model": "smol",
                                             **settings})
            if stop_after_s is not None:
                await asyncio.sleep(stop_after_s)
                svc.handle({"type": "stop", "chat": chat.session_id})
            await until_idle(chat)
            svc.stop(chat.session_id)
            deadline = time.monotonic() + 2.0
            while not server.hung_up and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return chat, list(server.hung_up)

        chat, hung_up = in_fresh_loop(scenario)
    return chat, posts, server, hung_up


def ended_with(posts, chat, reason: str, content: str) -> None:
    end, = of(posts, "turn-end")
    assert (end["reason"], end["content"]) == (reason, content)
    assert chat.request_id is None and chat.remote is None
    assert chat.conversation.messages == [{"role": "user", "content": "hello"},
                                          {"role": "assistant", "content": content}]


MALFORMED = [
    ('{"choices": [1]}', "choice 0 is not an object"),
    ('{"choices": [{"index": 0, "delta": "abc"}]}', "'delta' is not an object"),
    ('{"choices": [{"index": 0, "delta": {"content": 5}}]}', "'content' is not a string or null"),
    ('[1, 2]', "not a JSON object"),
    ('"text"', "not a JSON object"),
    ('null', "not a JSON object"),
    ('{"object": "chat.completion.chunk"}', "'choices' is not a list"),
    ('{"choices": {"0": {}}}', "'choices' is not a list"),
    ('{"choices": [{"index": 0}]}', "'delta' is not an object"),
    ('{"choices": [{"index": "0", "delta": {"content": "a"}}]}', "'index' is not an integer"),
    ('{"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": 3}]}',
     "'finish_reason' is not a string or null"),
    ('{"choices": [{"index": 0, "delta": {"role": ["assistant"]}}]}', "'role' is not a string or null"),
    ('{"model": 7, "choices": []}', "'model' is not a string"),
]


@pytest.mark.parametrize("data, what", MALFORMED)
def test_a_malformed_chunk_ends_the_reply_with_an_error_and_keeps_the_text(tiny_weights, data, what):
    # The good delta before it is kept, the one after it never shown, and the connection is closed by us.
    bad = stalls_after(HI, f"data: {data}\n\n", chunk_event(" never"))
    chat, posts, server, hung_up = converse(tiny_weights, bad, {})
    ended_with(posts, chat, "error", "Hi")
    err, = of(posts, "chat-error")
    assert err["message"] == f"the fallback server sent a malformed chunk ({what}): {data}"
    assert [p["text"] for p in of(posts, "token")] == ["Hi"] and hung_up == ["client"]


def test_a_server_that_never_answers_times_out(tiny_weights):
    chat, posts, server, hung_up = converse(tiny_weights, never_answers, {"fallback_connect_timeout_s": "0.2"})
    ended_with(posts, chat, "error", "")
    err, = of(posts, "chat-error")
    assert err["message"] == (f"the fallback server at {server.url}/v1/chat/completions did not answer within "
                              f"0.2 s; check that it runs and is not overloaded")
    assert hung_up == ["client"]


def test_a_server_that_stops_sending_times_out_and_the_text_is_kept(tiny_weights):
    chat, posts, server, hung_up = converse(tiny_weights, stalls_after(HI), {"fallback_read_timeout_s": 0.2})
    ended_with(posts, chat, "error", "Hi")
    assert of(posts, "chat-error")[0]["message"] == "the fallback server sent nothing for 0.2 s; the reply ends there"
    assert hung_up == ["client"]


def test_stop_while_connecting_closes_the_connection(tiny_weights):
    chat, posts, server, hung_up = converse(tiny_weights, never_answers, {}, stop_after_s=0.1)
    ended_with(posts, chat, "abort", "")
    assert of(posts, "chat-error") == [] and hung_up == ["client"]


def test_a_server_that_ignores_max_tokens_is_cut_off_at_max_tokens(tiny_weights):
    # One delta per token, as llama.cpp sends them; each goes out with its ids by the tab's tokenizer.
    chat, posts, server, hung_up = converse(tiny_weights, endless(chunk_event(" word").encode()), {"max_tokens": 6})
    ended_with(posts, chat, "length", " word" * 6)
    assert [p["ids"] for p in of(posts, "token")] == [[292, 114, 117, 103]] * 6
    assert of(posts, "turn-end")[0]["tokens"] == 6
    assert server.requests[0]["max_tokens"] == 6 and hung_up == ["client"] and of(posts, "chat-error") == []


def test_an_endless_line_is_refused_at_1_mib(tiny_weights):
    # 32 MiB of one `data:` line without a newline, after one good event.
    head = SSE_HEAD + HI.encode() + b"data: "
    chat, posts, server, hung_up = converse(tiny_weights, endless(b"x" * 65536, limit_bytes=32 << 20, head=head), {})
    ended_with(posts, chat, "error", "Hi")
    assert of(posts, "chat-error")[0]["message"] == ("the fallback server sent a line longer than 1 MiB "
                                                     "(1048576 bytes); the reply ends there")
    assert hung_up == ["client"] and server.sent < 16 << 20


def test_a_reload_during_a_server_reply_restores_the_partial_reply(tiny_weights):
    with HostileServer(stalls_after(HI, chunk_event(" there"))) as server:
        svc, posts, _ = make_service(tiny_weights, 8, [], webgpu=False, open_stream=open_stream)

        async def scenario():
            chat = svc.open_session("chat-1")
            svc.send(chat.session_id, "hello", {"max_tokens": 8, "fallback_url": server.url, "fallback_model": "smol"})
            while len(of(posts, "token")) < 2:
                await asyncio.sleep(0.01)
            svc.stop(chat.session_id)  # only to end the test's stream; the page below is saved before it
            return chat

        chat = in_fresh_loop(scenario)
    # What the page stores while the reply streams: the last chat-saved record and the ids of the tokens so far.
    end = next(i for i, (kind, _) in enumerate(posts) if kind == "turn-end")
    saved = [p for kind, p in posts[:end] if kind == "session-saved"][-1]
    partial = [i for kind, p in posts[:end] if kind == "token" for i in p["ids"]]
    assert partial == [75, 108, 262, 264]
    svc2, posts2, _ = make_service(tiny_weights, 8, [], webgpu=False)
    svc2.handle({"type": "open-sessions", "sessions": [{"id": chat.session_id, "checkpoint": saved["checkpoint"],
                                                              "partial_ids": partial}]})
    assert of(posts2, "chat-error") == []
    restored = svc2.sessions[chat.session_id].conversation
    assert restored.messages == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi there"}]
    assert restored.ids == saved["checkpoint"][1] + [1, 315, 339, 13] + partial + [2, 13]
    assert saved["checkpoint"][0] == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("data", ['{"choices": [{"index": 0, "delta": {"content": 5}}]}', '{"choices": [1]}'])
def test_stop_after_a_malformed_chunk_never_raises(tiny_weights, data):
    # The user presses Stop while the bad server keeps the connection open: the reply has already ended.
    chat, posts, _, hung_up = converse(tiny_weights, stalls_after(HI, f"data: {data}\n\n"), {}, stop_after_s=0.3)
    ended_with(posts, chat, "error", "Hi")
    assert len(of(posts, "chat-error")) == 1 and hung_up == ["client"]
