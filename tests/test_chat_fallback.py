"""The chat service's fallback to a server (CPython, tiny model, scripted transport): when, what is sent, stop."""
from __future__ import annotations

import asyncio
import json

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.tokenizer import Tokenizer
from pagedkv_app.chat_service import ChatService
from test_chat_service import in_fresh_loop
from test_remote import ScriptedResponse, chunk_event

FALLBACK = {"fallback_url": "http://127.0.0.1:9", "fallback_model": "smol"}
REPLY = (chunk_event("Hi") + chunk_event(" there") + chunk_event(finish="stop") + "data: [DONE]\n\n").encode()


def make_service(tiny_weights, num_blocks: int, responses: list, webgpu: bool = True, max_context=None,
                 open_stream=None):
    """A ChatService on the tiny model; its transport answers from `responses` unless `open_stream` is given."""
    tok = Tokenizer.from_manifest(tiny_weights.manifest)
    engine = LLMEngine(CpuBackend(tiny_weights, num_blocks=num_blocks, block_size=16), tok,
                       EngineConfig(max_context=max_context))
    posts, sent = [], []

    async def scripted(url, body):
        sent.append((url, json.loads(body)))
        await asyncio.sleep(0)
        return responses.pop(0)

    svc = ChatService(engine, ChatTemplate.from_manifest(tiny_weights.manifest, tok),
                      lambda kind, **p: posts.append((kind, p)), model_name="tiny-random",
                      open_stream=open_stream or scripted, webgpu=webgpu)
    return svc, posts, sent


def of(posts, kind):
    return [p for k, p in posts if k == kind]


async def until_idle(svc, chat):
    for _ in range(1000):
        if chat.request_id is None:
            return
        await asyncio.sleep(0)
    raise AssertionError("the reply never ended")


def test_a_request_the_pool_cannot_hold_streams_from_the_server(tiny_weights):
    # 2 blocks of 16 tokens; 100 new tokens can never fit, so the engine refuses (NeverFits) before any work.
    svc, posts, sent = make_service(tiny_weights, 2, [ScriptedResponse(200, [REPLY[:37], REPLY[37:]])])

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "hello", {"temperature": 0, "max_tokens": 100, **FALLBACK})
        await until_idle(svc, chat)
        return chat

    chat = in_fresh_loop(scenario)
    assert sent == [("http://127.0.0.1:9/v1/chat/completions",
                     {"model": "smol", "messages": [{"role": "user", "content": "hello"}], "stream": True,
                      "temperature": 0.0, "top_p": 0.95, "max_tokens": 100})]
    start, = of(posts, "turn-start")
    assert start["engine"]["kind"] == "remote" and start["engine"]["origin"] == "http://127.0.0.1:9"
    assert "needs up to" in start["engine"]["reason"] and "the KV pool only has 2 blocks" in start["engine"]["reason"]
    assert [p["text"] for p in of(posts, "token")] == ["Hi", " there"]
    end, = of(posts, "turn-end")
    assert (end["reason"], end["content"], end["tokens"], end["engine"]["model"]) == ("stop", "Hi there", 2, "smol")
    assert chat.conversation.messages == [{"role": "user", "content": "hello"},
                                          {"role": "assistant", "content": "Hi there"}]
    assert svc.engine.kv.pool.num_available == 2 and not svc.engine.has_unfinished  # the pool was never touched


def test_without_a_url_the_refusal_says_how_to_fix_it_and_keeps_the_history(tiny_weights):
    svc, posts, sent = make_service(tiny_weights, 2, [])
    chat = svc.open_session("chat-1")
    before = chat.conversation.checkpoint()
    svc.handle({"type": "send", "chat": chat.session_id, "text": "hello", "settings": {"max_tokens": 100}})
    err, = of(posts, "chat-error")
    assert err["chat"] == chat.session_id and "the KV pool only has 2 blocks" in err["message"]
    assert "set a fallback server in the generation settings" in err["message"]
    assert chat.conversation.checkpoint() == before and chat.request_id is None and sent == []


def test_auto_mode_runs_locally_when_the_tab_can(tiny_weights):
    svc, posts, sent = make_service(tiny_weights, 8, [])

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "hello", {"temperature": 0, "max_tokens": 4, **FALLBACK})
        await svc._loop_task

    in_fresh_loop(scenario)
    assert sent == [] and of(posts, "turn-start")[0]["engine"] == {"kind": "local", "backend": "cpu"}
    assert of(posts, "turn-end")[0]["tokens"] == 4


@pytest.mark.parametrize("webgpu, mode, reason", [
    (False, "auto", "this browser has no WebGPU"),
    (True, "always", "the settings send every reply to the fallback server"),
])
def test_no_webgpu_or_always_goes_to_the_server(tiny_weights, webgpu, mode, reason):
    svc, posts, sent = make_service(tiny_weights, 8, [ScriptedResponse(200, [REPLY])], webgpu=webgpu)

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "hello", {"max_tokens": 4, **FALLBACK, "fallback_mode": mode})
        await until_idle(svc, chat)

    in_fresh_loop(scenario)
    assert len(sent) == 1 and of(posts, "turn-start")[0]["engine"]["reason"] == reason
    assert of(posts, "turn-end")[0]["content"] == "Hi there"


def test_stop_aborts_the_stream_and_keeps_the_partial_reply(tiny_weights):
    response = ScriptedResponse(200, [chunk_event("one").encode()] + [chunk_event(" more").encode()] * 50)
    svc, posts, _ = make_service(tiny_weights, 8, [response], webgpu=False)

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "hello", {"max_tokens": 100, **FALLBACK})
        while not of(posts, "token"):
            await asyncio.sleep(0)
        svc.handle({"type": "stop", "chat": chat.session_id})
        for _ in range(5):
            await asyncio.sleep(0)
        return chat

    chat = in_fresh_loop(scenario)
    end, = of(posts, "turn-end")
    assert end["reason"] == "abort" and end["content"] == "one" and response.aborted
    assert [p["text"] for p in of(posts, "token")] == ["one"]
    assert chat.conversation.messages[-1] == {"role": "assistant", "content": "one"}


def test_a_server_error_is_reported_and_the_turn_ends(tiny_weights):
    body = json.dumps({"error": {"code": 503, "message": "Loading model"}}).encode()
    svc, posts, _ = make_service(tiny_weights, 8, [ScriptedResponse(503, [body])], webgpu=False)

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "hello", {"max_tokens": 4, **FALLBACK})
        await until_idle(svc, chat)

    in_fresh_loop(scenario)
    assert of(posts, "turn-end")[0]["reason"] == "error"
    assert of(posts, "chat-error")[0]["message"] == "the fallback server answered HTTP 503: Loading model"


def test_bad_fallback_settings_are_refused_before_anything_changes(tiny_weights):
    svc, posts, sent = make_service(tiny_weights, 8, [])
    chat = svc.open_session("chat-1")
    svc.handle({"type": "send", "chat": chat.session_id, "text": "hi",
                "settings": {"fallback_url": "http://127.0.0.1:9", "fallback_model": ""}})
    assert "model name" in of(posts, "chat-error")[0]["message"] and chat.conversation.messages == [] and sent == []


def test_a_prompt_longer_than_the_context_goes_to_the_server(tiny_weights):
    # The tab's context (?max_context=16) is shorter than this prompt.
    svc, posts, sent = make_service(tiny_weights, 32, [ScriptedResponse(200, [REPLY])], max_context=16)

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "a rather long message " * 4, {"max_tokens": 4, **FALLBACK})
        await until_idle(svc, chat)

    in_fresh_loop(scenario)
    assert "tiny-random's context is 16" in of(posts, "turn-start")[0]["engine"]["reason"]  # the API's refusal
    assert of(posts, "turn-end")[0]["content"] == "Hi there" and len(sent) == 1
