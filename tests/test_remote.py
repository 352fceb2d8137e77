"""The fallback server client under CPython: settings, SSE parsing at every chunk boundary, the stream driver."""
from __future__ import annotations

import asyncio
import json

import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer
from pagedkv_app.remote import MAX_LINE_BYTES, FallbackSettings, RemoteError, RemoteReply, SSEParser
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
    with pytest.raises(RemoteError, match=r"malformed chunk \('choices' is not a list\): {\"object\": \"x\"}$"):
        SSEParser().feed(b'data: {"object": "x"}\n\n')
    with pytest.raises(RemoteError, match="not JSON"):
        SSEParser().feed(b"data: " + b"[" * 100_000 + b"\n\n")  # json.loads would raise RecursionError


def test_a_delta_before_a_bad_event_in_the_same_chunk_is_kept():
    parser = SSEParser()
    with pytest.raises(RemoteError, match=r"\(choice 0 is not an object\)"):
        parser.feed((chunk_event("kept") + 'data: {"choices": [1]}\n\n').encode())
    assert parser.state.text == ["kept"]


def test_a_line_over_1_mib_is_refused_whichever_way_it_arrives():
    line = b"data: " + b"x" * MAX_LINE_BYTES
    with pytest.raises(RemoteError, match=r"a line longer than 1 MiB \(1048576 bytes\); the reply ends there"):
        SSEParser().feed(line + b"\n\n")  # a whole line in one chunk
    parser = SSEParser()
    fed = 0
    with pytest.raises(RemoteError, match="a line longer than 1 MiB"):
        for start in range(0, 32 << 20, 65536):  # 32 MiB of one line, never ended
            fed = start
            parser.feed(line[start:start + 65536] if start < len(line) else b"x" * 65536)
    assert fed == MAX_LINE_BYTES  # refused at the chunk that passes the bound, not after buffering it all


def test_an_event_over_1_mib_of_short_data_lines_is_refused():
    parser = SSEParser()
    with pytest.raises(RemoteError, match=r"an event longer than 1 MiB \(1048576 bytes\)"):
        parser.feed(b"data: 0123456789abcde\n" * (MAX_LINE_BYTES // 16 + 1))


def test_a_line_of_almost_1_mib_in_64_byte_chunks_is_parsed():
    # 16,384 chunks: scanning only the new bytes keeps this linear (re-splitting the buffer each time took minutes).
    text = "y" * (MAX_LINE_BYTES - 200)
    event = chunk_event(text).encode()
    parser = SSEParser()
    deltas = []
    for start in range(0, len(event), 64):
        deltas += parser.feed(event[start:start + 64])
    assert deltas == [text]


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
    """A transport's response: `pieces` one per read, then the end (or, with `stall`, silence until aborted)."""

    def __init__(self, status: int, pieces: list[bytes], fail_at: int | None = None, stall: bool = False,
                 stall_open: bool = False):
        self.status, self.pieces, self.fail_at, self.stall = status, list(pieces), fail_at, stall
        self.stall_open = stall_open  # open_stream never returns it (the server sends no head)
        self.aborted = False
        self.reads = 0

    async def read(self):
        await asyncio.sleep(0)  # a real body stream yields to the event loop between chunks
        self.reads += 1
        if self.aborted:
            raise RuntimeError("AbortError: the operation was aborted")
        if self.fail_at is not None and self.reads == self.fail_at:
            raise RuntimeError("network error")
        if not self.pieces and self.stall:
            await asyncio.Event().wait()  # cancelled by the reply's timeout or abort
        return self.pieces.pop(0) if self.pieces else None

    async def text(self):
        return b"".join(self.pieces).decode()

    def abort(self):
        self.aborted = True


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):
    return Tokenizer.from_manifest(tiny_weights.manifest)


def run_reply(response, tokenizer, abort_after: int | None = None, max_tokens: int = 50, **timeouts):
    """Stream one reply from `response` (or the exception open_stream raises); returns (reason, got, sent, reply)
    with `got` the (delta, ids) pairs passed on."""
    s = FallbackSettings("http://127.0.0.1:9", "smol", **timeouts)
    sent = []

    async def open_stream(url, body):
        sent.append((url, json.loads(body)))
        if isinstance(response, BaseException):
            raise response
        if response.stall_open:
            await asyncio.Event().wait()
        return response

    reply = RemoteReply(s, [{"role": "user", "content": "hi"}],
                        SamplingParams(temperature=0.0, max_tokens=max_tokens), open_stream, tokenizer)
    got = []

    def collect(delta, ids):
        got.append((delta, ids))
        if abort_after is not None and len(got) == abort_after:
            reply.abort()

    reason = in_fresh_loop(lambda: reply.run(collect))  # Playwright may own this thread's loop
    return reason, got, sent, reply


def test_reply_streams_deltas_with_their_ids_and_posts_the_body(tokenizer):
    reason, got, sent, _ = run_reply(ScriptedResponse(200, [STREAM[:50], STREAM[50:]]), tokenizer)
    assert got == [("Hé", [75, 198, 172]), (" ✓ wo", [35, 229, 159, 150, 292, 114]), ("rld", [117, 111, 103])]
    assert reason == "stop"
    assert sent == [("http://127.0.0.1:9/v1/chat/completions",
                     {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                      "temperature": 0.0, "top_p": 1.0, "max_tokens": 50})]


def test_abort_stops_the_stream_and_keeps_what_arrived(tokenizer):
    response = ScriptedResponse(200, [(chunk_event("a") + chunk_event("b")).encode(), chunk_event("c").encode()])
    reason, got, _, reply = run_reply(response, tokenizer, abort_after=1)
    assert [d for d, _ in got] == ["a"] and reply.text == ["a"] and response.aborted and reason is None


@pytest.mark.parametrize("max_tokens, kept", [(1, ["Hé"]), (2, ["Hé", " ✓ wo"]), (3, ["Hé", " ✓ wo", "rld"])])
def test_a_reply_is_cut_at_max_tokens_deltas(tokenizer, max_tokens, kept):
    response = ScriptedResponse(200, [STREAM])
    reason, got, _, _ = run_reply(response, tokenizer, max_tokens=max_tokens)
    assert reason == "length" and [d for d, _ in got] == kept
    assert response.aborted  # the server is not read any further


def test_a_reply_is_cut_at_64_characters_per_max_token(tokenizer):
    # Deltas of 100 characters, max_tokens 3: 192 characters, the second delta shortened to 92.
    response = ScriptedResponse(200, [chunk_event("z" * 100).encode()] * 5)
    reason, got, _, reply = run_reply(response, tokenizer, max_tokens=3)
    assert reason == "length" and [d for d, _ in got] == ["z" * 100, "z" * 92] and reply.num_chars == 192
    assert [ids for _, ids in got] == [tokenizer.encode("z" * 100), tokenizer.encode("z" * 92)]


def test_a_reply_ends_at_done_even_if_the_server_keeps_the_body_open(tokenizer):
    response = ScriptedResponse(200, [(chunk_event("x") + "data: [DONE]\n\n").encode()], stall=True)
    reason, got, _, _ = run_reply(response, tokenizer, read_timeout_s=5)
    assert (reason, got, response.aborted) == ("stop", [("x", [123])], True)


def test_silence_while_connecting_or_reading_times_out(tokenizer):
    with pytest.raises(RemoteError, match=r"^the fallback server at http://127.0.0.1:9/v1/chat/completions did not "
                                          r"answer within 0.05 s; check that it runs and is not overloaded$"):
        run_reply(ScriptedResponse(200, [], stall_open=True), tokenizer, connect_timeout_s=0.05)
    response = ScriptedResponse(200, [chunk_event("x").encode()], stall=True)
    with pytest.raises(RemoteError, match=r"^the fallback server sent nothing for 0.05 s; the reply ends there$"):
        run_reply(response, tokenizer, read_timeout_s=0.05)
    assert response.aborted


def test_http_error_status_gives_the_servers_message(tokenizer):
    body = json.dumps({"error": {"code": 401, "message": "Invalid API Key"}}).encode()
    with pytest.raises(RemoteError, match="answered HTTP 401: Invalid API Key"):
        run_reply(ScriptedResponse(401, [body]), tokenizer)


def test_unreachable_server_names_the_allow_origin_fix(tokenizer):
    with pytest.raises(RemoteError, match=r"--allow-origin http://127.0.0.1:9"):
        run_reply(TypeError("Failed to fetch"), tokenizer)


def test_a_broken_stream_raises_and_closes_the_connection(tokenizer):
    response = ScriptedResponse(200, [chunk_event("a").encode()] * 3, fail_at=2)
    with pytest.raises(RemoteError, match="broke off: network error"):
        run_reply(response, tokenizer)
    assert response.aborted


@pytest.mark.parametrize("fields, message", [
    ({"fallback_connect_timeout_s": "0"}, "connect_timeout_s must be a positive number of seconds, not 0.0"),
    ({"fallback_read_timeout_s": "soon"}, "fallback_read_timeout_s must be a number of seconds, not 'soon'"),
    ({"fallback_read_timeout_s": "inf"}, "read_timeout_s must be a positive number of seconds, not inf"),
])
def test_bad_timeouts_say_what_to_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        FallbackSettings.from_settings({"fallback_url": "http://h:1", "fallback_model": "m", **fields})


def test_timeouts_default_to_30_and_60_seconds():
    s = FallbackSettings.from_settings({"fallback_url": "http://h:1", "fallback_model": "m",
                                        "fallback_read_timeout_s": "2.5"})
    assert (s.connect_timeout_s, s.read_timeout_s) == (30.0, 2.5)
    assert (FallbackSettings("http://h:1", "m").connect_timeout_s, FallbackSettings("http://h:1", "m").read_timeout_s) \
        == (30.0, 60.0)
