"""`pagedkv: {session}` under CPython (tiny model, CPU backend): one owner of a conversation for the API and the
chat page. Forgetting a session keeps the prefix another session shares; regenerate and alternatives; a session
saved (`save`) and restored after a reload (`restore`) resumes from the disk tier; the chat page's turns are
requests of the completions API (ChatService adds none of its own)."""
from __future__ import annotations

import inspect

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.api import ApiError, Engine
from pagedkv.completions import parse_request
from test_chat_service import in_fresh_loop, of, service  # noqa: F401  (fixture)
from test_chat_service_disk import disk_service

SYSTEM = {"role": "system", "content": "You answer every question about fruit, boats, rivers and trees with care."}
GREEDY = {"max_tokens": 6, "temperature": 0}


def test_forgetting_a_session_keeps_the_prefix_another_session_shares(tiny_dir):
    engine = Engine([tiny_dir], budget_mib=64)
    kv = engine.llm.lane(engine.model_id).kv
    for name, question in (("s1", "tell me about apples"), ("s2", "tell me about boats")):
        engine.chat.completions.create(model=engine.model_id, messages=[SYSTEM, {"role": "user", "content": question}],
                                       pagedkv={"session": name}, **GREEDY)
    sessions = engine.services.sessions
    a, b = sessions.get("s1").conversation.ids, sessions.get("s2").conversation.ids
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) // 16  # whole blocks both begin with
    a_hit, b_hit = kv.lookup_prefix(a), kv.lookup_prefix(b)
    assert shared == 3 and a_hit[1][:shared] == b_hit[1][:shared]  # the system prompt's blocks, one copy
    cached = kv.pool.num_cached
    assert engine.forget("s2") and not engine.forget("s2")
    # Only s2's own blocks left the cache: s1 hits every block it did, the shared ones included.
    assert kv.lookup_prefix(a) == a_hit
    assert kv.lookup_prefix(b) == (shared * 16, b_hit[1][:shared])
    assert kv.pool.num_cached == cached - (len(b_hit[1]) - shared)
    assert "s2" not in sessions and "s1" in sessions


def test_regenerate_and_alternatives_answer_the_last_user_message_again(tiny_dir):
    engine = Engine([tiny_dir], budget_mib=64)
    ask = [{"role": "user", "content": "tell me about the sea"}]
    first = engine.chat.completions.create(model=engine.model_id, messages=ask, pagedkv={"session": "s"}, **GREEDY)
    session = engine.services.sessions.get("s")
    history = session.conversation.checkpoint()
    again = engine.chat.completions.create(model=engine.model_id, messages=ask, **GREEDY,
                                           pagedkv={"session": "s", "regenerate": True})
    # Greedy: the same reply, its prompt's whole blocks from the cache, the history as it was.
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    prompt_tokens = again["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt_tokens - 1) // 16 * 16 > 0
    assert session.conversation.checkpoint() == history
    alts = engine.chat.completions.create(model=engine.model_id, messages=ask, n=3, seed=7, temperature=0.9,
                                          max_tokens=5, pagedkv={"session": "s", "regenerate": True,
                                                                 "token_ids": True}, stream=True)
    ids = {0: [], 1: [], 2: []}
    for piece in alts:
        for choice in piece["choices"]:
            ids[choice["index"]] += choice.get("pagedkv", {}).get("token_ids", [])
    assert session.conversation.checkpoint() == history and session.alternatives == [ids[0], ids[1], ids[2]]
    service = engine.services[engine.model_id]
    content = service.keep("s", 1)
    assert session.conversation.messages[-1] == {"role": "assistant", "content": content}
    assert session.conversation.ids[:len(session.prompt_before_reply())] == session.prompt_before_reply()
    assert session.conversation.ids[len(session.prompt_before_reply()):][:len(ids[1])] == ids[1]
    with pytest.raises(ApiError) as err:
        service.keep("s", 1)  # kept already
    assert err.value.status == 400 and "no finished alternatives" in err.value.message
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(model=engine.model_id, messages=ask + [{"role": "assistant", "content": "x"}],
                                       pagedkv={"session": "s", "regenerate": True}, **GREEDY)
    assert (err.value.status, err.value.param) == (400, "messages")


@pytest.mark.parametrize("extension, param", [
    ({"sesion": "x"}, "pagedkv"), ({"session": ""}, "pagedkv.session"), ({"regenerate": True}, "pagedkv.regenerate"),
    ({"session": "s", "priority": "high"}, "pagedkv.priority"), ({"session": "s", "token_ids": 1}, "pagedkv.token_ids"),
    ({"session": "s", "restore": {"checkpoint": [[], [-1], ""]}}, "pagedkv.restore.checkpoint"),
    ({"session": "s", "restore": []}, "pagedkv.restore")])
def test_a_bad_pagedkv_field_is_a_400_naming_it(extension, param):
    with pytest.raises(ApiError) as err:
        parse_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "pagedkv": extension}, ["m"])
    assert (err.value.status, err.value.param) == (400, param)


def test_a_saved_api_session_resumes_from_the_disk_tier_after_a_reload(tiny_weights):
    """pagedkv.js's route (api-request in the worker) with the disk tier: `save` hands out the session's record,
    a reloaded worker given it as `restore` continues on the exact ids, restored from disk, not prefilled."""
    from pagedkv.kv.disk_tier import MemoryStore

    store = MemoryStore()
    svc, posts, tier = disk_service(tiny_weights, store)
    turn1 = [SYSTEM, {"role": "user", "content": "tell me about apples and pears"}]
    body = {"model": "tiny-random", "messages": turn1, "pagedkv": {"session": "app-1", "save": True}, **GREEDY}

    async def first():
        await tier.open()
        svc.engine.attach_disk(tier)
        await svc.api.request("r1", body)

    in_fresh_loop(first)
    (saved,) = [p["chunk"]["pagedkv"] for p in of(posts, "api-chunk") if "pagedkv" in p["chunk"]]
    held = svc.store.get("app-1").conversation
    assert saved["session"] == "app-1" and saved["checkpoint"][1] == held.ids
    assert {tier.key.file_name(h) for h in tier_chain(tier, held.ids)} <= set(store.files)

    svc2, posts2, tier2 = disk_service(tiny_weights, store)  # the reload: a new worker over the same store
    turn2 = held.messages + [{"role": "user", "content": "and plums?"}]
    record = {"checkpoint": saved["checkpoint"], "before_reply": saved["before_reply"]}

    async def resumed():
        await tier2.open()
        svc2.engine.attach_disk(tier2)
        await svc2.api.request("r2", {**body, "messages": turn2, "pagedkv": {"session": "app-1", "restore": record}})

    in_fresh_loop(resumed)
    use = [p["chunk"]["usage"] for p in of(posts2, "api-chunk") if "usage" in p["chunk"]][-1]
    restored = (len(held.ids) - 1) // 16 * 16  # the reply's last token was never computed
    assert use["prompt_tokens_details"]["cached_tokens"] == restored > 0
    assert svc2.engine.stats()["disk_restored_tokens"] == restored
    assert svc2.store.get("app-1").conversation.ids[:len(held.ids)] == held.ids


def tier_chain(tier, ids):
    from pagedkv.kv.disk_tier import block_chain

    return block_chain(tier.key, ids, (len(ids) - 1) // 16)


def test_the_chat_service_adds_no_engine_requests_of_its_own(service):  # noqa: F811
    """Every engine request of a chat's turn (send, regenerate, alternatives) comes from the completions API's
    CompletionService._start: the page's chats have one route, pagedkv.js's."""
    svc, posts = service
    callers = []
    add_request = svc.engine.add_request

    def spy(*args, **kw):
        frame = inspect.stack()[1]
        callers.append((frame.function, frame.filename.rsplit("/", 1)[-1], kw.get("session"), kw.get("priority")))
        return add_request(*args, **kw)

    svc.engine.add_request = spy

    async def scenario():
        svc.send("chat-1", "hello there", {"temperature": 0, "max_tokens": 4, "priority": 1})
        await svc.settled()
        svc.regenerate("chat-1", {"temperature": 0, "max_tokens": 4, "priority": 1})
        await svc.settled()
        svc.alternatives("chat-1", {"temperature": 0.9, "max_tokens": 4, "seed": 1, "priority": 1}, 2)
        await svc.settled()

    in_fresh_loop(scenario)
    assert callers == [("_start", "api.py", "chat-1", 1)] * 3
    assert [e["regenerate"] for e in of(posts, "turn-start")] == [False, True] and len(of(posts, "alt-end")) == 1


def test_up_to_context_bounds_max_tokens_by_the_room_the_prompt_leaves(tiny_dir):
    engine = Engine([tiny_dir], budget_mib=64)
    # Seed 4 draws no end-of-sequence token before the context (256) is full.
    body = {"model": engine.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000,
            "temperature": 0.9, "seed": 4}
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(body)
    assert (err.value.status, err.value.param) == (400, "max_tokens")
    out = engine.chat.completions.create(body, pagedkv={"up_to_context": True})
    assert out["choices"][0]["finish_reason"] == "length"
    assert (out["usage"]["prompt_tokens"], out["usage"]["completion_tokens"]) == (31, 256 - 31)


def test_a_failing_step_ends_pagedkv_js_requests_and_the_chats_turn_resumes_on_a_new_backend(service,  # noqa: F811
                                                                                             tiny_weights):
    """A step dies (a destroyed GPU device fails it before its `lost` event comes): pagedkv.js's request ends
    with an api-error; the chat's turn, a request of the same API, waits and resumes on the rebuilt backend."""
    from pagedkv.backends.cpu import CpuBackend

    svc, posts = service
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

    async def failing_step():
        raise RuntimeError("mapAsync: the device was destroyed")

    async def scenario():
        svc.send("chat-1", "a reply a failing step interrupts", {"temperature": 0, "max_tokens": 8})
        api = svc.api.request("api-1", body)
        step, svc.engine.step = svc.engine.step, failing_step
        with pytest.raises(RuntimeError, match="destroyed"):
            await svc._loop_task
        await api
        svc.engine.step = step
        svc.device_lost("destroyed")
        resumed = svc.resume_on(CpuBackend(tiny_weights, num_blocks=32, block_size=16))
        await svc._loop_task
        await svc.settled()
        return resumed

    assert in_fresh_loop(scenario) == ["chatcmpl-1"]
    (error,) = of(posts, "api-error")
    assert error["id"] == "api-1" and error["status"] == 500 and "destroyed" in error["error"]["error"]["message"]
    (end,) = of(posts, "turn-end")
    assert (end["chat"], end["reason"], end["tokens"]) == ("chat-1", "length", 8)
    assert not svc.engine.has_unfinished and svc.engine.stats()["used_blocks"] == 0
