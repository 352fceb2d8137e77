"""The in-tab chat service under CPython: streaming, multi-turn prefix reuse, concurrent chats, stop."""
from __future__ import annotations

import asyncio
import threading

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.tokenizer import Tokenizer
from pagedkv_app.chat_service import ChatService

SETTINGS = {"temperature": 0, "max_tokens": 12}


def in_fresh_loop(fn):
    """Run `await fn()` in its own thread and event loop (Playwright may own this thread's loop)."""
    result = {}

    def target():
        try:
            result["value"] = asyncio.run(fn())
        except BaseException as exc:  # re-raised in the caller's thread, so pytest.raises sees it
            result["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.fixture()
def service(tiny_weights):
    tok = Tokenizer.from_manifest(tiny_weights.manifest)
    engine = LLMEngine(CpuBackend(tiny_weights, num_blocks=32, block_size=16), tok, EngineConfig())
    posts = []
    svc = ChatService(engine, ChatTemplate.from_manifest(tiny_weights.manifest, tok),
                      lambda kind, **p: posts.append((kind, p)), model_name="tiny-random")
    return svc, posts


def of(posts, kind):
    return [p for k, p in posts if k == kind]


def saves(posts):
    """The posts that carry a session's record for the page to store: session-saved, and turn-end (the ended
    reply's history comes with its end)."""
    return [p for k, p in posts if k == "session-saved" or (k == "turn-end" and "checkpoint" in p)]


def test_two_turns_stream_and_reuse_the_prefix(service):
    svc, posts = service

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "hello there, how are you doing today?", SETTINGS)
        await svc._loop_task
        svc.send(chat.session_id, "and tomorrow?", SETTINGS)
        await svc._loop_task
        return chat

    chat = in_fresh_loop(scenario)
    starts, ends = of(posts, "turn-start"), of(posts, "turn-end")
    assert len(starts) == 2 and len(ends) == 2
    assert starts[0]["cached_tokens"] == 0
    # Turn 2's prompt starts with turn 1's exact ids: every full block of them comes from the cache.
    history_after_turn1 = ends[0]["history_tokens"]
    assert starts[1]["cached_tokens"] == ends[1]["cached_tokens"] == (history_after_turn1 // 16) * 16 > 0
    streamed = "".join(p["text"] for p in of(posts, "token"))
    assert streamed == ends[0]["content"] + ends[1]["content"]
    assert chat.conversation.messages[-1] == {"role": "assistant", "content": ends[1]["content"]}
    memory = of(posts, "memory")[-1]
    assert len(memory["cells"]) == 32 and memory["used_blocks"] == 0
    assert memory["cached_blocks"] == memory["cells"].count("c") > 0
    assert memory["cells"].count("f") == 32 - memory["cached_blocks"]


def test_two_chats_generate_concurrently_in_one_batch(service):
    svc, posts = service

    async def scenario():
        a, b = svc.open_session("chat-1"), svc.open_session("chat-2")
        svc.send(a.session_id, "first chat message", SETTINGS)
        svc.send(b.session_id, "second chat message", SETTINGS)
        await svc._loop_task
        return svc.engine.stats()

    stats = in_fresh_loop(scenario)
    # Mid-generation snapshots showed each chat's own blocks in its own mark.
    busy = [m for m in of(posts, "memory") if m["used_blocks"] > 0]
    assert busy and set(busy[0]["owners"]) == {"chat-1", "chat-2"}
    assert {chr(0x100), chr(0x101)} <= set(busy[0]["cells"])
    ends = of(posts, "turn-end")
    assert sorted(e["chat"] for e in ends) == ["chat-1", "chat-2"]
    assert all(e["tokens"] == 12 and e["reason"] == "length" for e in ends)
    # Both replies decode together: 1 prefill step + 11 shared decode steps, not 24 steps.
    assert stats["steps"] == 12


def test_stop_keeps_partial_reply_and_frees_blocks(service):
    svc, posts = service

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "tell me a long story", {"temperature": 0, "max_tokens": 200})
        for _ in range(3):
            svc.on_outputs(await svc.engine.step())
        svc.stop(chat.session_id)
        return chat

    chat = in_fresh_loop(scenario)
    end = of(posts, "turn-end")[-1]
    assert end["reason"] == "abort" and end["tokens"] == 3
    assert chat.request_id is None and svc.engine.stats()["used_blocks"] == 0
    assert chat.conversation.messages[-1]["role"] == "assistant"


def test_bad_input_is_reported_and_changes_nothing(service):
    svc, posts = service

    async def scenario():
        chat = svc.open_session("chat-1")
        before = chat.conversation.checkpoint()
        svc.handle({"type": "send", "chat": chat.session_id, "text": "x" * 5000, "settings": SETTINGS})
        svc.handle({"type": "send", "chat": chat.session_id, "text": "hi", "settings": {"temperature": "hot"}})
        svc.handle({"type": "send", "chat": "chat-404"})  # no text
        svc.handle({"type": "warp"})
        return chat, before

    chat, before = in_fresh_loop(scenario)
    errors = [p["message"] for p in of(posts, "chat-error")]
    assert len(errors) == 4
    assert "KV pool only has 32 blocks" in errors[0] or "context" in errors[0]
    assert "bad generation setting" in errors[1]
    assert errors[2] == "KeyError: 'text'" and "unknown message type 'warp'" in errors[3]
    assert chat.conversation.checkpoint() == before and not svc.engine.has_unfinished


def test_open_sessions_bring_back_exact_history_and_interrupted_replies(service, tiny_weights):
    svc, posts = service

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "remember this", SETTINGS)
        await svc._loop_task
        return chat

    chat = in_fresh_loop(scenario)
    saved = saves(posts)[-1]
    # A fresh service (a reloaded tab) opens sessions from what the page stored, plus a reply cut off mid-stream.
    tok = Tokenizer.from_manifest(tiny_weights.manifest)
    engine = LLMEngine(CpuBackend(tiny_weights, num_blocks=32, block_size=16), tok, EngineConfig())
    posts2 = []
    svc2 = ChatService(engine, ChatTemplate.from_manifest(tiny_weights.manifest, tok),
                       lambda kind, **p: posts2.append((kind, p)), model_name="tiny-random")
    svc2.handle({"type": "open-sessions", "sessions": [{"id": saved["chat"], "checkpoint": saved["checkpoint"]},
                                                       {"id": "chat-7", "checkpoint": saved["checkpoint"],
                                                        "partial_ids": [40, 41]}]})
    assert svc2.sessions["chat-1"].conversation.ids == chat.conversation.ids
    cut = svc2.sessions["chat-7"].conversation
    assert cut.messages[-1] == {"role": "assistant", "content": tok.decode([40, 41])}
    before = len(saved["checkpoint"][1])
    assert cut.ids[before:] == tok.encode("<|im_start|>assistant\n") + [40, 41] + tok.encode("<|im_end|>\n")
    assert list(svc2.sessions) == ["chat-1", "chat-7"] and of(posts2, "chat-error") == []


def test_regenerate_replaces_the_reply_and_reuses_the_prompt_blocks(service):
    svc, posts = service

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "a prompt long enough to fill one block or two of sixteen tokens", SETTINGS)
        await svc._loop_task
        first = chat.conversation.checkpoint()
        svc.regenerate(chat.session_id, SETTINGS)
        await svc._loop_task
        return chat, first

    chat, first = in_fresh_loop(scenario)
    starts, ends = of(posts, "turn-start"), of(posts, "turn-end")
    assert [s["regenerate"] for s in starts] == [False, True]
    # Same prompt: every full block of it comes from the prefix cache, and greedy gives the same reply.
    assert starts[1]["prompt_tokens"] == starts[0]["prompt_tokens"]
    assert ends[1]["cached_tokens"] == ((starts[0]["prompt_tokens"] - 1) // 16) * 16 > 0
    assert chat.conversation.checkpoint() == first
    assert len([m for m in chat.conversation.messages if m["role"] == "assistant"]) == 1


def test_delete_evicts_the_chats_cached_history_but_not_a_shared_prefix(service):
    svc, posts = service
    kv = svc.engine.kv

    async def scenario():
        a, b = svc.open_session("chat-1"), svc.open_session("chat-2")
        svc.send(a.session_id, "the first conversation talks about apples and pears at length", SETTINGS)
        svc.send(b.session_id, "the second conversation talks about boats and rivers at length", SETTINGS)
        await svc._loop_task
        return a, b

    a, b = in_fresh_loop(scenario)
    a_hit, _ = kv.lookup_prefix(a.conversation.ids)
    b_hit, _ = kv.lookup_prefix(b.conversation.ids)
    shared = (_common_prefix_len(a.conversation.ids, b.conversation.ids) // 16) * 16
    free_before, cached_before = kv.pool.num_free, kv.pool.num_cached
    svc.forget_session(b.session_id)
    evicted = (b_hit - shared) // 16
    assert evicted >= 1
    assert kv.pool.num_cached == cached_before - evicted and kv.pool.num_free == free_before + evicted
    assert kv.lookup_prefix(b.conversation.ids)[0] == shared  # only the prefix chat A also starts with
    assert kv.lookup_prefix(a.conversation.ids)[0] == a_hit   # chat A keeps its whole cached history


def _common_prefix_len(x, y):
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n


def test_lost_device_parks_the_chats_and_a_new_backend_resumes_them(service, tiny_weights):
    svc, posts = service
    settings = {"temperature": 0, "max_tokens": 20}

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "a reply that the lost device interrupts", settings)
        while len(chat.partial_ids) < 5:
            await asyncio.sleep(0)
        svc.device_lost("destroyed: test")
        await asyncio.sleep(0)
        assert svc._loop_task.cancelled() or svc._loop_task.done()
        svc.send(svc.open_session("chat-2").session_id, "queued while the device is gone", settings)  # waits, loses nothing
        assert svc._loop_task.done() and of(posts, "turn-end") == []
        assert svc.resume_on(CpuBackend(tiny_weights, num_blocks=16, block_size=16)) == ["chatcmpl-1", "chatcmpl-2"]
        await svc._loop_task
        svc.regenerate(chat.session_id, settings)  # greedy: the same reply as one never interrupted
        await svc._loop_task

    in_fresh_loop(scenario)
    ends = of(posts, "turn-end")
    assert [e["reason"] for e in ends] == ["length"] * 3 and [e["tokens"] for e in ends] == [20] * 3
    first, again = [e["content"] for e in ends if e["chat"] == "chat-1"]
    assert again == first
    assert of(posts, "engine-error") == [] and svc.engine.kv.pool.num_blocks == 16
