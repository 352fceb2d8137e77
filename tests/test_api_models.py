"""pagedkv.api.Engine with several models under one budget (CPython, CPU backend, two tiny random models of
different KV widths): the pages hold both models' weights and one KV pool; each model's greedy reply is the
one it gives alone while the other streams; unload stops the model's streams and returns its pages; load
at run time takes them again or is refused (413) with the numbers."""
from __future__ import annotations

import asyncio

import pytest

from model_fixtures import tiny_dir  # noqa: F401  (fixture)
from pagedkv.api import ApiError, Engine
from pagedkv.model.tiny import mixed_config, write_tiny_model
from test_chat_service import in_fresh_loop

HI = [{"role": "user", "content": "hello there, tell me a story"}]


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "mixed-random"
    write_tiny_model(path, seed=1, config=mixed_config())
    return path


def reply(engine, model: str, max_tokens: int = 12) -> str:
    out = engine.chat.completions.create(model=model, messages=HI, max_tokens=max_tokens, temperature=0)
    return out["choices"][0]["message"]["content"]


def test_two_models_share_the_pages_and_each_replies_as_alone(tiny_dir, mixed_dir):  # noqa: F811
    alone = {m: reply(Engine([d], budget_mib=16), m) for m, d in (("tiny-random", tiny_dir),
                                                                 ("mixed-random", mixed_dir))}
    engine = Engine([tiny_dir, mixed_dir], budget_mib=16)
    assert [m["id"] for m in engine.models.list()["data"]] == ["tiny-random", "mixed-random"]
    pool = engine.stats()["pool"]
    assert pool["pages"] * pool["page_bytes"] <= pool["budget_bytes"] == 16 << 20
    weights = {m: s["weights_pages"] for m, s in pool["models"].items()}
    assert pool["reserved_pages"] == sum(weights.values()) and weights["mixed-random"] > weights["tiny-random"] > 0
    assert (pool["models"]["tiny-random"]["block_size"], pool["models"]["mixed-random"]["block_size"]) == (64, 16)

    async def both():
        return await asyncio.gather(*(engine.chat.completions.acreate(
            model=m, messages=HI, max_tokens=12, temperature=0) for m in alone))

    got = in_fresh_loop(both)
    assert {g["model"]: g["choices"][0]["message"]["content"] for g in got} == alone
    stats = engine.stats()
    assert stats["tiny-random"]["steps"] >= 12 and stats["mixed-random"]["steps"] >= 12
    assert stats["pool"]["free_pages"] + stats["pool"]["cached_pages"] + pool["reserved_pages"] == pool["pages"]
    with pytest.raises(ApiError) as err:
        reply(engine, "other")
    assert err.value.status == 404 and "loaded: tiny-random, mixed-random" in err.value.message


def test_unload_stops_its_streams_and_load_takes_the_pages_again(tiny_dir, mixed_dir):  # noqa: F811
    engine = Engine([tiny_dir, mixed_dir], budget_mib=16)
    reserved = engine.stats()["pool"]["reserved_pages"]

    async def unload_mid_stream():
        chunks = await engine.chat.completions.acreate(model="mixed-random", messages=HI, max_tokens=40,
                                                       temperature=0, stream=True)
        whole = asyncio.ensure_future(engine.chat.completions.acreate(model="mixed-random", messages=HI,
                                                                      max_tokens=40, temperature=0))
        seen, streamed = [], None
        try:
            async for piece in chunks:
                seen.append(piece)
                if len(seen) == 3:
                    engine.unload("mixed-random")
        except ApiError as exc:
            streamed = exc
        try:
            await whole
        except ApiError as exc:
            return seen, streamed, exc
        return seen, streamed, None

    seen, streamed, whole = in_fresh_loop(unload_mid_stream)
    assert len(seen) == 3 and all(c["choices"][0]["finish_reason"] is None for c in seen)  # ended, unfinished
    for err in (streamed, whole):  # the stream and the non-streamed request alike end with the unload's error
        assert (err.status, err.message, err.param) == (
            503, "the model mixed-random was unloaded while this request ran", "model")
    pool = engine.stats()["pool"]
    assert list(pool["models"]) == ["tiny-random"] and pool["reserved_pages"] < reserved
    # the weights' pages were never memory (the buffer holds the KV pages only): spare for the next model's weights
    assert pool["spare_pages"] == reserved - pool["reserved_pages"] and pool["backed_pages"] == pool["pages"] - reserved
    assert pool["free_pages"] + pool["cached_pages"] + pool["reserved_pages"] + pool["spare_pages"] == pool["pages"]
    with pytest.raises(ApiError) as err:
        reply(engine, "mixed-random")
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        engine.unload("tiny-random")
    assert err.value.status == 400 and "only model" in err.value.message
    assert engine.load(mixed_dir) == "mixed-random" and engine.stats()["pool"]["reserved_pages"] == reserved
    assert engine.stats()["pool"]["spare_pages"] == 0 and engine.shared.pages.shape[0] == pool["backed_pages"]
    assert reply(engine, "mixed-random")


def test_a_model_that_does_not_fit_is_413_with_the_numbers(tiny_dir, mixed_dir, tmp_path):  # noqa: F811
    with pytest.raises(ApiError) as err:
        Engine([tiny_dir, mixed_dir], budget_mib=1)
    assert err.value.status == 413 and "tiny-random" in err.value.message and "mixed-random" in err.value.message
    engine = Engine([tiny_dir], budget_mib=2)  # pages for the tiny model's width: 8 mixed-model tokens do not fit
    with pytest.raises(ApiError) as err:
        engine.load(mixed_dir)
    assert err.value.status == 413 and err.value.message.startswith(
        "mixed-random does not fit this engine's pages (a page of 8,192 B holds 4 mixed-random tokens")
    # 6 MiB: 192 pages of 32 KiB; the weights take 14 + 161, a second copy of the mixed model 161 more
    engine = Engine([tiny_dir, mixed_dir], budget_mib=6)
    write_tiny_model(tmp_path / "mixed-copy", seed=2, config=mixed_config())
    with pytest.raises(ApiError) as err:
        engine.load(tmp_path / "mixed-copy")
    assert err.value.status == 413 and err.value.message.startswith(
        "mixed-copy needs 161 pages of the budget; 17 of 192 are free or cached (175 hold other models' weights")
    assert [m["id"] for m in engine.models.list()["data"]] == ["tiny-random", "mixed-random"]
    assert reply(engine, "tiny-random") and engine.stats()["pool"]["reserved_pages"] == 175
