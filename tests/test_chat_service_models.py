"""The chat service with two models in one engine (CPython, two tiny random models sharing one pool of pages):
each chat talks to its own model, chats of both models stream at once, each reply is the one its model gives
alone, the memory snapshot colours every model's chats and says whose each is, and deleting a chat of the
second model evicts its history from that model's cache."""
from __future__ import annotations

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend, allocate_pages, plan_pages
from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.block_pool import BlockPool
from pagedkv.model.tiny import mixed_config, write_tiny_model
from pagedkv.model.weights import ModelWeights
from pagedkv.tokenizer import Tokenizer
from pagedkv_app.chat_service import ChatService
from test_chat_service import in_fresh_loop, of

SETTINGS = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module")
def wide_weights(tmp_path_factory) -> ModelWeights:
    path = tmp_path_factory.mktemp("models") / "tiny-random-wide"
    write_tiny_model(path, seed=1, config=mixed_config())
    return ModelWeights.load(path)


def make_service(weights: list, names: list[str], num_pages: int = 24, loader=None):
    page, sizes = plan_pages([w.config for w in weights])
    pages = allocate_pages(num_pages, page)
    toks = [Tokenizer.from_manifest(w.manifest) for w in weights]
    engine = LLMEngine(CpuBackend(weights[0], num_pages, sizes[0], pages=pages), toks[0], EngineConfig(),
                       model=names[0], pool=BlockPool(num_pages))
    for w, name, size, tok in zip(weights[1:], names[1:], sizes[1:], toks[1:]):
        engine.add_model(name, CpuBackend(w, num_pages, size, pages=pages), tok)
    posts = []
    svc = ChatService(engine, ChatTemplate.from_manifest(weights[0].manifest, toks[0]),
                      lambda kind, **p: posts.append((kind, p)), model_name=names[0],
                      loader=None if loader is None else lambda engine, model: loader(engine, pages, sizes, model))
    for w, name, tok in zip(weights[1:], names[1:], toks[1:]):
        svc.api.add_model(name, ChatTemplate.from_manifest(w.manifest, tok))
    return svc, posts


def replies(svc, posts, chats: dict[str, str | None]) -> dict[str, str]:
    async def scenario():
        for chat, model in chats.items():
            svc.send(chat, f"hello from {chat}, tell me something", SETTINGS, model)
        await svc._loop_task

    in_fresh_loop(scenario)
    return {e["chat"]: e["content"] for e in of(posts, "turn-end")}


def test_chats_of_two_models_stream_at_once_each_as_alone(tiny_weights, wide_weights):  # noqa: F811
    names = ["tiny-random", "tiny-random-wide"]
    alone_tiny = replies(*make_service([tiny_weights], names[:1]), {"chat-1": None})
    alone_wide = replies(*make_service([wide_weights], names[1:]), {"chat-2": None})
    svc, posts = make_service([tiny_weights, wide_weights], names)
    both = replies(svc, posts, {"chat-1": None, "chat-2": "tiny-random-wide"})
    assert both == {**alone_tiny, **alone_wide}
    assert svc.sessions["chat-2"].model == "tiny-random-wide" and svc.sessions["chat-1"].model is None
    busy = [m for m in of(posts, "memory") if m["per_chat_blocks"]]
    assert any(set(m["owners"]) == {"chat-1", "chat-2"} for m in busy)
    snap = next(m for m in busy if set(m["owners"]) == {"chat-1", "chat-2"})
    assert dict(zip(snap["owners"], snap["owner_models"])) == {"chat-1": names[0], "chat-2": names[1]}
    assert {chr(0x100), chr(0x101)} <= set(snap["cells"]) and set(snap["models"]) == set(names)
    # the second turn of chat-2 stays on its model and reuses its own cache
    async def second_turn():
        svc.send("chat-2", "and then?", SETTINGS)
        await svc._loop_task

    in_fresh_loop(second_turn)
    start = of(posts, "turn-start")[-1]
    assert start["chat"] == "chat-2" and start["cached_tokens"] > 0
    cached = svc.engine.lane(names[1]).kv.pool.num_cached
    svc.forget_session("chat-2")
    assert svc.engine.lane(names[1]).kv.pool.num_cached < cached
    with pytest.raises(ValueError, match="is not loaded here"):
        svc.send("chat-3", "hi", SETTINGS, "nope")


def test_api_load_and_unload_answer_with_their_statuses(tiny_weights, wide_weights):  # noqa: F811
    names = ["tiny-random", "tiny-random-wide"]
    wide_tok = Tokenizer.from_manifest(wide_weights.manifest)

    async def loader(engine, pages, sizes, model):  # as cpu_models.load_into does in the tab
        if model in engine.models:
            raise LookupError(f"{model} is loaded already")
        if model != names[1]:
            raise FileNotFoundError(f"there is no model {model!r} here")
        engine.add_model(model, CpuBackend(wide_weights, engine.pool.num_blocks, sizes[1], pages=pages), wide_tok,
                         reserve_blocks=20)
        return ChatTemplate.from_manifest(wide_weights.manifest, wide_tok)

    svc, posts = make_service([tiny_weights, wide_weights], names, loader=loader)

    async def scenario():
        svc.send("chat-9", "a long reply, please", {"temperature": 0, "max_tokens": 200}, names[1])
        svc.on_outputs(await svc.engine.step())  # the chat of the model about to go is mid-reply
        svc.handle({"type": "api-unload", "id": "u1", "model": names[1]})
        for rid, model in (("l1", "nope"), ("l2", names[0]), ("l3", names[1])):
            svc.handle({"type": "api-load", "id": rid, "model": model})
            await svc.api._tasks[rid] if rid in svc.api._tasks else None

    in_fresh_loop(scenario)
    assert of(posts, "api-unloaded") == [{"id": "u1", "model": names[1]}]
    end = next(p for p in of(posts, "turn-end") if p["chat"] == "chat-9")  # its reply ended with the model
    assert end["reason"] == "abort" and svc.sessions["chat-9"].request_id is None
    errors = {p["id"]: (p["status"], p["error"]["error"]["message"]) for p in of(posts, "api-error")}
    assert errors["l1"][0] == 404 and "no model 'nope'" in errors["l1"][1]
    assert errors["l2"] == (400, "tiny-random is loaded already")
    assert of(posts, "api-loaded") == [{"id": "l3", "model": names[1]}] and list(svc.api.services) == names
