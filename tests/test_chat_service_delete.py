"""Delete and Stop land whenever a person clicks them: also after the engine finished a reply whose last step
has not returned yet (the step awaits the disk tier's flush, and the page still shows the reply streaming)."""
from __future__ import annotations

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from test_chat_service import _common_prefix_len, in_fresh_loop, of, saves, service  # noqa: F401  (fixture)

SHORT = {"temperature": 0, "max_tokens": 12}


async def finish_in_engine_only(svc):
    """Step until the engine has nothing unfinished, handing the service every step's outputs but the last:
    what the service sees while that step still awaits the disk flush. Returns the last step's outputs."""
    last = []
    while svc.engine.has_unfinished:
        svc.on_outputs(last)
        last = await svc.engine.step()
    return last


def test_delete_of_a_reply_the_engine_just_finished_forgets_the_session_and_frees_its_blocks(service):  # noqa: F811
    svc, posts = service

    async def scenario():
        a, b = svc.open_session("chat-1"), svc.open_session("chat-2")
        svc.send(a.session_id, "the first chat's question", SHORT)
        svc.send(b.session_id, "the second chat's question", SHORT)
        last = await finish_in_engine_only(svc)
        assert b.request_id is not None  # the service (and the page) still see chat-2 answering
        replied = list(b.request.seq.token_ids)  # its prompt and the reply the engine finished
        svc.handle({"type": "forget-session", "chat": b.session_id})
        svc.on_outputs(last)  # the step returns: chat-1's reply ends, chat-2's output is dropped
        return a, replied

    a, replied = in_fresh_loop(scenario)
    kv = svc.engine.kv
    shared = _common_prefix_len(a.conversation.ids, replied) // 16 * 16
    assert len(replied) >= 48 and kv.lookup_prefix(replied)[0] == shared
    assert kv.pool.num_cached == kv.lookup_prefix(a.conversation.ids)[0] // 16  # chat-1's blocks, none of chat-2's
    assert of(posts, "chat-error") == []
    assert list(svc.sessions) == ["chat-1"]
    assert [e["chat"] for e in of(posts, "turn-end")] == ["chat-1"]
    assert "chat-2" not in {p["chat"] for p in saves(posts)[-1:]}
    assert svc.engine.stats()["used_blocks"] == 0 and not svc.engine.has_unfinished


def test_stop_of_a_reply_the_engine_just_finished_lets_it_end_as_finished(service):  # noqa: F811
    svc, posts = service

    async def scenario():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "a question", SHORT)
        last = await finish_in_engine_only(svc)
        svc.handle({"type": "stop", "chat": chat.session_id})
        svc.on_outputs(last)

    in_fresh_loop(scenario)
    assert of(posts, "chat-error") == []
    (end,) = of(posts, "turn-end")
    assert end["reason"] == "length" and end["tokens"] == 12
