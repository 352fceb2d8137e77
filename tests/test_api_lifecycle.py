"""pagedkv.api.Engine after close() (CPython, tiny model): every method raises ApiError 503 at once, and a
request streaming when the engine closes ends with that error rather than just stopping."""
from __future__ import annotations

import pytest

from model_fixtures import tiny_dir  # noqa: F401  (fixture)
from pagedkv.api import ApiError, Engine
from test_chat_service import in_fresh_loop

HI = [{"role": "user", "content": "hello there, tell me a story"}]


def test_close_ends_a_running_stream_with_an_error_and_every_later_call_raises_503(tiny_dir):  # noqa: F811
    engine = Engine([tiny_dir], budget_mib=16)

    async def close_mid_stream():
        chunks = await engine.chat.completions.acreate(model="tiny-random", messages=HI, max_tokens=40,
                                                       temperature=0, stream=True)
        seen = 0
        try:
            async for _ in chunks:
                seen += 1
                if seen == 3:
                    engine.close()
        except ApiError as exc:
            return seen, exc
        return seen, None

    seen, err = in_fresh_loop(close_mid_stream)
    assert seen == 3 and (err.status, err.message) == (503, "the engine was closed while this request ran")
    calls = {"stats": engine.stats, "list": engine.models.list, "forget": lambda: engine.forget("s"),
             "unload": lambda: engine.unload("tiny-random"), "load": lambda: engine.load(tiny_dir),
             "create": lambda: engine.chat.completions.create(model="tiny-random", messages=HI, max_tokens=2),
             "legacy": lambda: engine.completions.create(model="tiny-random", prompt="Once", max_tokens=2)}
    for name, call in calls.items():
        with pytest.raises(ApiError) as caught:
            call()
        assert (name, caught.value.status, caught.value.message) == (name, 503, "the engine is closed")
