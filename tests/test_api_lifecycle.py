"""pagedkv.api.Engine's lifecycle and arguments (CPython, tiny model): after close() every method raises ApiError
503 at once, and a request streaming when the engine closes ends with that error rather than just stopping; a
budget or a sampling number Python cannot use is a 400 naming it, not an OverflowError / MemoryError /
TypeError; so is a chat template that fails on some content (its reason), on the command line too."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from model_fixtures import tiny_dir  # noqa: F401  (fixture)
from pagedkv import cli
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


@pytest.mark.parametrize("budget", [1.5, "8", True, -1])
def test_a_budget_that_is_not_a_whole_number_of_mib_is_400(tiny_dir, budget):  # noqa: F811
    with pytest.raises(ApiError) as err:  # 1.5 was a TypeError
        Engine([tiny_dir], budget_mib=budget)
    assert (err.value.status, err.value.param, err.value.message) == (
        400, "budget_mib", f"budget_mib must be a whole number of MiB, got {budget!r}")


def test_a_budget_past_the_machines_memory_is_400_before_anything_is_allocated(tiny_dir):  # noqa: F811
    with pytest.raises(ApiError) as err:  # was a MemoryError: numpy asked for 954 TiB
        Engine([tiny_dir], budget_mib=10**9)
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    assert (err.value.status, err.value.param, err.value.message) == (
        400, "budget_mib", f"budget_mib is 1,000,000,000 MiB, more than this machine's memory ({memory:,} MiB)")


@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p"])
def test_a_number_too_large_for_a_float_is_a_400_naming_the_field(tiny_dir, field):  # noqa: F811
    engine = Engine([tiny_dir], budget_mib=16)
    with pytest.raises(ApiError) as err:  # was OverflowError: int too large to convert to float
        engine.chat.completions.create(model="tiny-random", messages=HI, max_tokens=2, **{field: 10**400})
    assert (err.value.status, err.value.param) == (400, field)
    assert err.value.message.startswith(f"{field} must be between ") and err.value.message.endswith(
        ", got 1000000000000000000000000000000000000000")


def test_a_template_that_fails_on_some_content_is_a_400_with_its_reason(tiny_dir, tmp_path, capsys):  # noqa: F811
    """The chat template refuses one message's content (its raise_exception): the API's 400 naming messages,
    and `complete` on the command line prints that error JSON, not a traceback."""
    model = tmp_path / "picky-random"
    shutil.copytree(tiny_dir, model)
    manifest = json.loads((model / "model.json").read_text())
    manifest["chat_template"] = ("{% for m in messages %}{% if 'forbidden' in m['content'] %}"
                                 "{{ raise_exception('no forbidden words, please') }}{% endif %}"
                                 "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
                                 "{% if add_generation_prompt %}assistant: {% endif %}")
    (model / "model.json").write_text(json.dumps(manifest))
    engine = Engine([model], budget_mib=16)
    said = [{"role": "user", "content": "a forbidden word"}]
    assert engine.chat.completions.create(model="picky-random", messages=HI, max_tokens=2)["usage"]
    with pytest.raises(ApiError) as err:
        engine.chat.completions.create(model="picky-random", messages=said, max_tokens=2)
    expected = "chat template failed to render: no forbidden words, please"
    assert (err.value.status, err.value.param, err.value.message) == (400, "messages", expected)
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "picky-random", "messages": said, "max_tokens": 2}))
    assert cli.main(["complete", "--model", str(model), "--body-json", str(body)]) == 1
    out, errors = capsys.readouterr()
    assert json.loads(out) == {"error": {"message": expected, "type": "invalid_request_error",
                                         "param": "messages", "code": None}}
    assert errors == f"error 400: {expected}\n"
