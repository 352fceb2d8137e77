"""A request body's bounds (pagedkv.request_limits), checked before any rendering or tokenizing: past them a 413
naming the limit, through the API (CPython, tiny model)."""
from __future__ import annotations

import pytest

from model_fixtures import tiny_dir  # noqa: F401  (fixture)
from pagedkv import request_limits
from pagedkv.api import ApiError, Engine


@pytest.fixture(scope="module")
def engine(tiny_dir):  # noqa: F811
    return Engine([tiny_dir], budget_mib=16)


def refusal(engine, **body) -> tuple[int, str, str]:
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(model="tiny-random", max_tokens=2, **body)
    return err.value.status, err.value.param, err.value.message


def test_too_many_messages_is_413_before_the_template_renders_them(engine, monkeypatch):
    rendered = []
    monkeypatch.setattr(type(engine.services["tiny-random"].template), "render_slices",
                        lambda *a, **k: rendered.append(1) or "")  # never called
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] * 50_000
    assert refusal(engine, messages=messages) == (
        413, "messages", "the body holds 100,000 messages; one request takes at most 4,096")
    assert rendered == []


def test_too_much_text_is_413(engine):
    text = "x" * (request_limits.MAX_BODY_CHARS + 1)
    assert refusal(engine, messages=[{"role": "user", "content": text}]) == (
        413, "messages", "the body holds 4,194,305 characters of text; one request takes at most 4,194,304")
    with pytest.raises(ApiError) as err:
        engine.completions.create(model="tiny-random", prompt=text, max_tokens=2)
    assert (err.value.status, err.value.param) == (413, "prompt")
    with pytest.raises(ApiError) as err:  # an unknown model's body is bounded too, before it is checked
        engine.chat.completions.create(model="nope", messages=[{"role": "user", "content": text}])
    assert err.value.status == 413


def test_the_bounds_themselves_are_served(engine):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] * 2048
    # 4,096 messages pass the bound; the tiny model's context (256 tokens) is what refuses them
    status, param, message = refusal(engine, messages=messages)
    assert (status, param) == (400, "messages") and message.endswith("tiny-random's context is 256")


def test_a_long_conversation_renders_once_not_once_per_message(engine, monkeypatch):
    """Rendering is linear in a conversation's length: 2,000 messages render twice (the messages, then with the
    assistant's opener), where the template was rendered once per message (2,000 messages took 7.9 s)."""
    template = engine.services["tiny-random"].template
    calls = []
    render = type(template).render_slices  # what render() and the API's sliced preparation both run

    def counted(self, messages, **kw):
        calls.append(len(messages))
        return render(self, messages, **kw)

    monkeypatch.setattr(type(template), "render_slices", counted)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] * 1000
    status, param, message = refusal(engine, messages=messages)  # the tiny model's context refuses them
    assert (status, param) == (400, "messages") and message.endswith("tiny-random's context is 256")
    assert calls == [2000, 2000]
