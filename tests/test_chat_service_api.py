"""The worker's side of pagedkv.js under CPython: `api-request` answered by `api-chunk`s and `api-end` on the chat
service's own step loop, beside a chat's reply (each gets only its own outputs, the API's text equal to the same
request alone); a refused body is one `api-error` with OpenAI's error JSON; `api-abort` ends the stream and frees
the request's blocks. `legacy: true` is a legacy Completions body answered with `text_completion` pieces."""
from __future__ import annotations

import asyncio

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.sampling import SamplingParams
from test_chat_service import SETTINGS, in_fresh_loop, of, service  # noqa: F401  (fixture)

BODY = {"model": "tiny-random", "messages": [{"role": "user", "content": "tell me about the sea"}], "max_tokens": 10,
        "temperature": 0, "stream": True}


def streamed_text(posts, request_id: str) -> str:
    chunks = [p["chunk"] for p in of(posts, "api-chunk") if p["id"] == request_id]
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


def test_api_request_streams_beside_a_chat_and_equals_running_alone(service):
    svc, posts = service

    async def alone():
        await svc.api.request("chatcmpl-a", BODY)

    in_fresh_loop(alone)
    assert of(posts, "api-end") == [{"id": "chatcmpl-a"}]
    alone_text = streamed_text(posts, "chatcmpl-a")
    assert alone_text

    async def together():
        chat = svc.open_session("chat-1")
        svc.send(chat.session_id, "hello there, how are you?", SETTINGS)
        task = svc.api.request("chatcmpl-b", BODY)
        await task
        await svc._loop_task

    in_fresh_loop(together)
    assert streamed_text(posts, "chatcmpl-b") == alone_text
    assert [p["id"] for p in of(posts, "api-end")] == ["chatcmpl-a", "chatcmpl-b"]
    assert of(posts, "turn-end")[-1]["chat"] == "chat-1" and of(posts, "turn-end")[-1]["tokens"] >= 1
    assert all(p["chat"] == "chat-1" for p in of(posts, "token"))  # no API token reached the chat's stream
    assert svc.engine.stats()["used_blocks"] == 0


def test_a_refused_body_is_one_api_error_and_abort_frees(service):
    svc, posts = service

    async def refused():
        await svc.api.request("x1", {**BODY, "tools": []})
        await svc.api.request("x2", {**BODY, "model": "other"})

    in_fresh_loop(refused)
    errors = {p["id"]: p for p in of(posts, "api-error")}
    assert errors["x1"]["status"] == 400 and errors["x1"]["error"]["error"]["param"] == "tools"
    assert errors["x2"]["status"] == 404

    async def aborted():
        task = svc.api.request("x3", {**BODY, "max_tokens": 200})
        while not [p for p in of(posts, "api-chunk") if p["id"] == "x3" and p["chunk"]["choices"]
                   and p["chunk"]["choices"][0]["delta"].get("content")]:
            await asyncio.sleep(0)
        svc.handle({"type": "api-abort", "id": "x3"})
        await task

    in_fresh_loop(aborted)
    assert [p["id"] for p in of(posts, "api-end")] == ["x3"]
    assert not svc.engine.has_unfinished and svc.engine.stats()["used_blocks"] == 0


def test_a_legacy_api_request_streams_text_completions(service):
    """`legacy: true` (pagedkv.js's engine.completions, /v1/completions): the prompt continued with no template,
    its pieces `text_completion`s whose text is the engine's greedy continuation of the prompt's ids alone; a chat
    body sent as legacy is refused naming messages."""
    svc, posts = service
    body = {"model": "tiny-random", "prompt": "the cat", "max_tokens": 8, "temperature": 0, "stream": True}

    async def run():
        svc.handle({"type": "api-request", "id": "cmpl-1", "body": body, "legacy": True})
        svc.handle({"type": "api-request", "id": "cmpl-2", "body": BODY, "legacy": True})
        await asyncio.gather(*svc.api._tasks.values())

    in_fresh_loop(run)
    chunks = [p["chunk"] for p in of(posts, "api-chunk") if p["id"] == "cmpl-1"]
    assert {c["object"] for c in chunks} == {"text_completion"} and {c["id"] for c in chunks} == {"cmpl-1"}
    assert [p["id"] for p in of(posts, "api-end")] == ["cmpl-1"]
    (error,) = of(posts, "api-error")
    assert (error["id"], error["status"], error["error"]["error"]["param"]) == ("cmpl-2", 400, "messages")
    tok = svc.engine.tokenizer
    assert tok.encode("the cat") == [119, 260, 272, 316] and not tok.add_bos  # no template, no BOS

    async def alone():
        return await svc.engine.generate([119, 260, 272, 316], SamplingParams(max_tokens=8))

    ids = in_fresh_loop(alone).output_ids
    assert "".join(c["choices"][0]["text"] for c in chunks) == tok.decode(ids)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and len(ids) == 8
    assert svc.engine.stats()["used_blocks"] == 0
