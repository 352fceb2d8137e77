""""Show 3 alternatives" in the chat service (CPython, CPU backend, tiny model): one request with n = 3
samples of the last user message; the user keeps one and the token history ends with exactly its ids."""
from __future__ import annotations

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.sampling import SamplingParams
from test_chat_service import in_fresh_loop, of, service  # noqa: F401  (fixture)

SAMPLED = {"temperature": 0.9, "top_p": 1.0, "max_tokens": 10, "seed": 5}


def first_turn(svc):
    chat = svc.open_session("chat-1")
    svc.send(chat.session_id, "tell me something", {"temperature": 0, "max_tokens": 10})
    return chat


def test_three_alternatives_then_keep_one(service):
    svc, posts = service

    async def scenario():
        chat = first_turn(svc)
        await svc._loop_task
        reply_before = chat.conversation.messages[-1]["content"]
        prefill_before = svc.engine.stats()["prefill_tokens"]
        svc.alternatives(chat.session_id, SAMPLED)
        await svc._loop_task
        return chat, reply_before, prefill_before

    chat, reply_before, prefill_before = in_fresh_loop(scenario)
    (start,), (end,) = of(posts, "alt-start"), of(posts, "alt-end")
    assert start["n"] == 3 and end["reason"] == "done" and end["tokens"] == [10, 10, 10]
    # The samples' streams add up to their final texts, per index.
    for i in range(3):
        assert "".join(p["text"] for p in of(posts, "alt-token") if p["index"] == i) == end["alternatives"][i]
    # The prompt (history before the reply) was in the prefix cache: only its last partial block was computed.
    prompt = svc_prompt(svc, chat)
    assert svc.engine.stats()["prefill_tokens"] - prefill_before == len(prompt) - (len(prompt) - 1) // 16 * 16
    # Each sample is what a lone request with seed 6 + i draws (the settings' seed 5 is the reply's own).
    for i in range(3):
        lone = svc_lone(svc, chat, 6 + i)
        assert chat.alternatives.ids[i] == lone
    assert chat.conversation.messages[-1]["content"] == reply_before  # unchanged until one is kept

    kept = list(chat.alternatives.ids[2])
    content = svc.keep_alternative(chat.session_id, 2)
    assert content == end["alternatives"][2]
    assert chat.conversation.messages[-1] == {"role": "assistant", "content": content}
    kept_ids = chat.conversation.ids
    assert kept_ids[: len(prompt) + 10] == prompt + kept
    assert of(posts, "alt-kept")[-1]["history_tokens"] == len(kept_ids)
    assert of(posts, "session-saved")[-1]["checkpoint"][1] == kept_ids
    assert chat.alternatives is None
    assert svc.engine.stats()["used_blocks"] == 0


def svc_prompt(svc, chat):
    conv = chat.conversation
    now = conv.checkpoint()
    conv.rollback(chat.before_reply)
    ids = conv.prompt_ids()
    conv.rollback(now)
    return ids


def svc_lone(svc, chat, seed):
    from pagedkv.engine import run_sync

    params = SamplingParams(temperature=0.9, top_p=1.0, max_tokens=10, seed=seed, stop_token_ids=tuple(sorted(svc.engine.default_stop_ids)))
    return run_sync(svc.engine.generate(svc_prompt(svc, chat), params)).output_ids


def test_alternatives_refused_without_a_reply_or_while_busy_and_stop_ends_them(service):
    svc, posts = service

    async def scenario():
        chat = svc.open_session("chat-1")
        with pytest.raises(ValueError, match="no reply to show alternatives for"):
            svc.alternatives(chat.session_id, SAMPLED)
        svc.send(chat.session_id, "hi", {"temperature": 0, "max_tokens": 4})
        with pytest.raises(ValueError, match="still answering"):
            svc.alternatives(chat.session_id, SAMPLED)
        await svc._loop_task
        with pytest.raises(ValueError, match="ask for 2 to 8 alternatives, not 9"):
            svc.alternatives(chat.session_id, SAMPLED, n=9)
        with pytest.raises(ValueError, match="no finished alternatives"):
            svc.keep_alternative(chat.session_id, 0)
        svc.alternatives(chat.session_id, {**SAMPLED, "max_tokens": 50})
        svc.stop(chat.session_id)
        return chat

    chat = in_fresh_loop(scenario)
    assert of(posts, "alt-end")[-1]["reason"] == "abort" and chat.request_id is None
    assert svc.engine.stats()["used_blocks"] == 0 and not svc.engine.has_unfinished
    with pytest.raises(ValueError, match="alternative 3 does not exist"):
        svc.keep_alternative(chat.session_id, 3)
