"""The fallback server client under CPython: settings, SSE parsing at every chunk boundary, the stream driver."""
from __future__ import annotations

import asyncio
import json

import pytest

from pagedkv.sampling import SamplingParams
from pagedkv_app.remote import FallbackSettings, RemoteError, RemoteReply, SSEParser
from test_chat_service import in_fresh_loop


def chunk_event(content=None, finish=None, role=None) -> str:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                                  "model": "smol", "object": "chat.completion.chunk"},
                                 ensure_ascii=False) + "\n\n"


# What llama.cpp's server sends (role first, content pieces, an empty delta with the finish reason, [DONE]),
# with a keep-alive comment, a multi-byte character and CRLF line ends in the mix.
STREAM = (chunk_event(role="assistant") + ": ping\n\n" + chunk_event("Hé") + chunk_event(" ✓ wo").replace("\n", "\r\n")
          + chunk_event("rld") + chunk_event(finish="stop") + "data: [DONE]\n\n").encode()


def parse(pieces: list[bytes]) -> tuple[list[str], SSEParser]:
    parser = SSEParser()
    deltas = []
    for piece in pieces:
        deltas += parser.feed(piece)
    parser.close()
    return deltas, parser


def test_whole_stream():
    deltas, parser = parse([STREAM])
    assert deltas == ["Hé", " ✓ wo", "rld"]
    assert parser.state.finish_reason == "stop" and parser.state.done and parser.state.model == "smol"


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_a_cut_anywhere_gives_the_same_deltas(cut):
    # Inside "data:", inside a CRLF pair, inside the 2-byte é and the 3-byte ✓: always the same three deltas.
    deltas, parser = parse([STREAM[:cut], STREAM[cut:]])
    assert deltas == ["Hé", " ✓ wo", "rld"] and parser.state.done


def test_byte_by_byte():
    deltas, _ = parse([STREAM[i:i + 1] for i in range(len(STREAM))])
    assert deltas == ["Hé", " ✓ wo", "rld"]


def test_a_delta_is_returned_as_soon_as_its_event_ends():
    parser = SSEParser()
    first = chunk_event("one").encode()
    assert parser.feed(first[:-1]) == []  # the blank line that ends the event has not arrived
    assert parser.feed(first[-1:]) == ["one"]


def test_multi_line_data_is_joined():
    parser = SSEParser()
    body = json.dumps({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}, indent=1)
    event = "".join(f"data:{line}\n" for line in body.split("\n")) + "\n"
    assert parser.feed(event.encode()) == ["a"]


@pytest.mark.parametrize("payload, message", [
    ({"error": {"code": 500, "message": "the context is full", "type": "server_error"}}, "the context is full"),
    ({"error": "model not loaded"}, "model not loaded"),
])
def test_an_error_payload_raises_with_its_message(payload, message):
    parser = SSEParser()
    assert parser.feed(chunk_event("partial").encode()) == ["partial"]
    with pytest.raises(RemoteError, match=f"reported an error: {message}"):
        parser.feed(("data: " + json.dumps(payload) + "\n\n").encode())
    assert parser.state.text == ["partial"]


def test_a_stream_cut_before_the_end_raises():
    parser = SSEParser()
    parser.feed(chunk_event("Hello").encode())
    with pytest.raises(RemoteError, match="closed the stream before the reply finished"):
        parser.close()


def test_a_finish_reason_without_done_is_a_complete_reply():
    deltas, parser = parse([(chunk_event("x") + chunk_event(finish="length")).encode()])
    assert deltas == ["x"] and parser.state.finish_reason == "length" and not parser.state.done


def test_a_last_event_without_its_blank_line_is_kept():
    deltas, parser = parse([(chunk_event("x") + "data: [DONE]").encode()])
    assert deltas == ["x"] and parser.state.done


def test_non_json_and_shapeless_events_raise():
    with pytest.raises(RemoteError, match="not JSON"):
        SSEParser().feed(b"data: <html>\n\n")
    with pytest.raises(RemoteError, match="without 'choices'"):
        SSEParser().feed(b'data: {"object": "x"}\n\n')


# ---------------------------------------------------------------- settings


def test_settings_off_without_url():
    assert FallbackSettings.from_settings({"fallback_url": "  ", "fallback_model": "m"}) is None
    assert FallbackSettings.from_settings({}) is None


@pytest.mark.parametrize("url, endpoint, origin", [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1/chat/completions", "http://127.0.0.1:8080"),
    ("https://api.example.org/v1/", "https://api.example.org/v1/chat/completions", "https://api.example.org"),
])
def test_endpoint_and_origin(url, endpoint, origin):
    s = FallbackSettings.from_settings({"fallback_url": url, "fallback_model": "smol", "fallback_mode": "always"})
    assert (s.endpoint, s.origin, s.mode) == (endpoint, origin, "always")


@pytest.mark.parametrize("fields, message", [
    ({"url": "ftp://host", "model": "m"}, "must look like http://host:port"),
    ({"url": "http://host/?key=1", "model": "m"}, "no query"),
    ({"url": "http://host", "model": " "}, "model name"),
    ({"url": "http://host", "model": "m", "mode": "never"}, "fallback mode 'never'"),
])
def test_bad_settings_say_what_to_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        FallbackSettings(**fields)


def test_request_body_carries_the_sampling_settings():
    s = FallbackSettings("http://h:1", "smol")
    body = s.request_body([{"role": "user", "content": "hi"}],
                          SamplingParams(temperature=0.0, top_p=0.5, max_tokens=7, seed=3))
    assert body == {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                    "temperature": 0.0, "top_p": 0.5, "max_tokens": 7, "seed": 3}
    assert "seed" not in s.request_body([], SamplingParams(max_tokens=1))


# ---------------------------------------------------------------- the stream driver with a scripted transport


class ScriptedResponse:
    def __init__(self, status: int, pieces: list[bytes], fail_at: int | None = None):
        self.status, self.pieces, self.fail_at = status, list(pieces), fail_at
        self.aborted = False
        self.reads = 0

    async def read(self):
        await asyncio.sleep(0)  # a real body stream yields to the event loop between chunks
        self.reads += 1
        if self.aborted:
            raise RuntimeError("AbortError: the operation was aborted")
        if self.fail_at is not None and self.reads == self.fail_at:
            raise RuntimeError("network error")
        return self.pieces.pop(0) if self.pieces else None

    async def text(self):
        return b"".join(self.pieces).decode()

    def abort(self):
        self.aborted = True


def run_reply(response, on_text=None, abort_after: int | None = None):
    s = FallbackSettings("http://127.0.0.1:9", "smol")
    sent = []

    async def open_stream(url, body):
        sent.append((url, json.loads(body)))
        if isinstance(response, Exception):
            raise response
        return response

    reply = RemoteReply(s, [{"role": "user", "content": "hi"}], SamplingParams(temperature=0.0, max_tokens=5),
                        open_stream)
    got = []

    def collect(delta):
        got.append(delta)
        if abort_after is not None and len(got) == abort_after:
            reply.abort()

    state = in_fresh_loop(lambda: reply.run(on_text or collect))  # Playwright may own this thread's loop
    return state, got, sent


def test_reply_streams_deltas_and_posts_the_body():
    state, got, sent = run_reply(ScriptedResponse(200, [STREAM[:50], STREAM[50:]]))
    assert got == ["Hé", " ✓ wo", "rld"] and state.finish_reason == "stop"
    assert sent == [("http://127.0.0.1:9/v1/chat/completions",
                     {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                      "temperature": 0.0, "top_p": 1.0, "max_tokens": 5})]


def test_abort_stops_the_stream_and_keeps_what_arrived():
    response = ScriptedResponse(200, [chunk_event("a").encode(), chunk_event("b").encode(), chunk_event("c").encode()])
    state, got, _ = run_reply(response, abort_after=1)
    assert got == ["a"] and state.text == ["a"] and response.aborted and state.finish_reason is None


def test_http_error_status_gives_the_servers_message():
    body = json.dumps({"error": {"code": 401, "message": "Invalid API Key"}}).encode()
    with pytest.raises(RemoteError, match="answered HTTP 401: Invalid API Key"):
        run_reply(ScriptedResponse(401, [body]))


def test_unreachable_server_names_the_allow_origin_fix():
    with pytest.raises(RemoteError, match=r"--allow-origin http://127.0.0.1:9"):
        run_reply(TypeError("Failed to fetch"))


def test_a_broken_stream_raises():
    with pytest.raises(RemoteError, match="broke off: network error"):
        run_reply(ScriptedResponse(200, [chunk_event("a").encode()] * 3, fail_at=2))
