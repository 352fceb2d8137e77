"""The optional fallback to an OpenAI-compatible server: settings, request body, SSE stream parsing.

When a request cannot run in the tab (no WebGPU, a request the KV pool can never
hold, or the user asks for it), the chat streams from the configured server's
`/v1/chat/completions` with `stream: true`. Nothing here imports `js`: the HTTP
transport (fetch + reading the body stream + abort) is passed in by the bridge,
so the parser and the stream driver run and are tested under CPython.

A server is not trusted to behave: a chunk of another shape, a line without end,
silence, or a reply longer than asked for each end the reply with a RemoteError
(what arrived before is kept) and the connection is closed.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import urllib.parse
from dataclasses import dataclass, field

from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

MODES = ("auto", "always")  # auto: only when the tab cannot answer; always: every reply comes from the server
MAX_LINE_BYTES = 1 << 20  # one SSE line, and one event's data; a chunk of one token is a few hundred bytes
MAX_CHARS_PER_TOKEN = 64  # on average over a reply; SmolLM2's longest token is 81 characters, the mean about 4
_LINE_END = re.compile(rb"\r\n|\r|\n")


class RemoteError(RuntimeError):
    """The fallback server could not be reached, refused the request, or broke off the stream."""


@dataclass(frozen=True)
class FallbackSettings:
    """Where to send a request the tab cannot answer; built only when the user set a URL."""

    url: str
    model: str
    mode: str = "auto"
    connect_timeout_s: float = 30.0  # until the response's status line and headers arrive
    read_timeout_s: float = 60.0  # the longest silence while the body streams

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"fallback server URL {self.url!r} must look like http://host:port or "
                             f"https://host/v1 (no query or fragment)")
        if not self.model.strip():
            raise ValueError("set the fallback server's model name (the `model` field of its requests)")
        if self.mode not in MODES:
            raise ValueError(f"fallback mode {self.mode!r} must be one of {list(MODES)}")
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"fallback {name} must be a positive number of seconds, not {value!r}")

    @classmethod
    def from_settings(cls, settings: dict) -> FallbackSettings | None:
        """The page's settings -> FallbackSettings, or None when no URL is set (nothing leaves the page).

        `fallback_connect_timeout_s` and `fallback_read_timeout_s` (seconds) are optional."""
        url = str(settings.get("fallback_url") or "").strip()
        if not url:
            return None
        timeouts = {}
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = settings.get(f"fallback_{name}")
            if value not in (None, ""):
                try:
                    timeouts[name] = float(value)
                except (TypeError, ValueError):
                    raise ValueError(f"fallback_{name} must be a number of seconds, not {value!r}") from None
        return cls(url=url, model=str(settings.get("fallback_model") or "").strip(),
                   mode=str(settings.get("fallback_mode") or "auto"), **timeouts)

    @property
    def origin(self) -> str:
        """scheme://host[:port]: what `build.py serve --allow-origin` must allow."""
        parts = urllib.parse.urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def endpoint(self) -> str:
        """The chat-completions URL; a base URL ending in /v1 is accepted as is."""
        base = self.url.rstrip("/")
        return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")

    def request_body(self, messages: list[dict], params: SamplingParams) -> dict:
        """The JSON body of one streaming chat completion with the page's sampling settings."""
        body = {"model": self.model, "messages": [dict(m) for m in messages], "stream": True,
                "temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens}
        if params.seed is not None:
            body["seed"] = params.seed
        return body


@dataclass
class StreamState:
    """What the stream has said so far."""

    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    model: str | None = None
    done: bool = False  # the `data: [DONE]` sentinel arrived


class SSEParser:
    """Incremental server-sent-events parser for chat-completion chunks.

    `feed` takes the body's bytes as they arrive, cut anywhere (inside a line,
    a CRLF pair or a multi-byte UTF-8 character), and returns the text deltas of
    the events completed by them; each delta is also appended to `state.text`
    as soon as its event is read, so one completed before a RemoteError is kept.
    RemoteError: an `{"error": ...}` payload, a chunk not of the documented shape
    (see `_chunk`), or a line or event over MAX_LINE_BYTES. Only the new bytes
    are scanned for line ends, so a long line costs time linear in its length.
    """

    def __init__(self) -> None:
        self.state = StreamState()
        self._line_start = bytearray()  # the unfinished line so far
        self._data: list[str] = []  # `data:` lines of the event being read
        self._data_bytes = 0
        self._pending_cr = False  # the last chunk ended in CR: a following LF belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        """Parse more body bytes; returns the content deltas completed by them, in order."""
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        if not chunk:
            return []
        self._pending_cr = chunk.endswith(b"\r")
        pieces = _LINE_END.split(chunk)
        _check_line(len(self._line_start) + len(pieces[0]))
        self._line_start += pieces[0]
        if len(pieces) == 1:
            return []
        lines, self._line_start = [bytes(self._line_start), *pieces[1:-1]], bytearray()
        deltas: list[str] = []
        for raw in lines:
            _check_line(len(raw))
            deltas.extend(self._line(raw.decode("utf-8", errors="replace")))
        _check_line(len(pieces[-1]))
        self._line_start += pieces[-1]  # an unfinished line waits for the next chunk
        return deltas

    def close(self) -> None:
        """The body ended: dispatch a last event without its blank line; RemoteError if the reply is cut off."""
        if self._line_start:
            self._line(self._line_start.decode("utf-8", errors="replace"))
            self._line_start = bytearray()
        self._dispatch()
        if not self.state.done and self.state.finish_reason is None:
            raise RemoteError("the fallback server closed the stream before the reply finished")

    def _line(self, line: str) -> list[str]:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return []  # a comment / keep-alive ping
        name, _, value = line.partition(":")
        if name == "data":
            value = value[1:] if value.startswith(" ") else value
            self._data_bytes += len(value) + 1
            if self._data_bytes > MAX_LINE_BYTES:
                raise RemoteError(f"the fallback server sent an event longer than 1 MiB ({MAX_LINE_BYTES} bytes); "
                                  f"the reply ends there")
            self._data.append(value)
        return []

    def _dispatch(self) -> list[str]:
        if not self._data:
            return []
        data, self._data, self._data_bytes = "\n".join(self._data), [], 0
        if data.strip() == "[DONE]":
            self.state.done = True
            return []
        try:
            payload = json.loads(data)
        except (json.JSONDecodeError, RecursionError):
            raise RemoteError(f"the fallback server sent an event that is not JSON: {data[:200]!r}") from None
        if isinstance(payload, dict) and "error" in payload:
            raise RemoteError(f"the fallback server reported an error: {error_message(payload)}")
        return self._chunk(payload, data)

    def _chunk(self, payload, data: str) -> list[str]:
        """The documented shape: `{"model"?: str, "choices": [{"index"?: int, "delta": {"role"?: str | null,
        "content"?: str | null, ...}, "finish_reason"?: str | null}, ...]}`; other keys are ignored."""
        def malformed(what: str) -> RemoteError:
            return RemoteError(f"the fallback server sent a malformed chunk ({what}): {data[:200]}")

        if not isinstance(payload, dict):
            raise malformed("not a JSON object")
        choices = payload.get("choices")
        if not isinstance(choices, list):
            raise malformed("'choices' is not a list")
        model = payload.get("model", self.state.model)
        if model is not None and not isinstance(model, str):
            raise malformed("'model' is not a string")
        for i, choice in enumerate(choices):  # the whole chunk is checked before any of it counts
            if not isinstance(choice, dict):
                raise malformed(f"choice {i} is not an object")
            index, delta = choice.get("index", 0), choice.get("delta")
            if not isinstance(index, int) or isinstance(index, bool):
                raise malformed("'index' is not an integer")
            if not isinstance(delta, dict):
                raise malformed("'delta' is not an object")
            for key in ("role", "content"):
                if not isinstance(delta.get(key), (str, type(None))):
                    raise malformed(f"'{key}' is not a string or null")
            if not isinstance(choice.get("finish_reason"), (str, type(None))):
                raise malformed("'finish_reason' is not a string or null")
        self.state.model = model
        deltas = []
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue  # we ask for one choice
            content = choice["delta"].get("content")
            if content:
                deltas.append(content)
                self.state.text.append(content)
            if choice.get("finish_reason"):
                self.state.finish_reason = choice["finish_reason"]
        return deltas


def _check_line(num_bytes: int) -> None:
    if num_bytes > MAX_LINE_BYTES:
        raise RemoteError(f"the fallback server sent a line longer than 1 MiB ({MAX_LINE_BYTES} bytes); "
                          f"the reply ends there")


def error_message(payload) -> str:
    """The human part of an OpenAI-style error body (`{"error": {"message": ...}}` or `{"error": "..."}`)."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err if err is not None else payload)


class RemoteReply:
    """One streamed reply from the fallback server; `abort()` stops it (the fetch is cancelled).

    The reply is cut at the request's `max_tokens` even when the server ignores
    it. The tab cannot count the server's tokens (its model, and so its
    tokenizer, may be another), so the bound is on what it can count: content
    deltas, at most `max_tokens` of them (llama.cpp, vLLM and OpenAI send one
    token per delta, or more, never less), and characters, at most
    `max_tokens * MAX_CHARS_PER_TOKEN` (the delta that passes it is shortened).
    A server that sends several tokens per delta can thus pass `max_tokens`
    tokens by that factor, within the character bound.

    Each delta also goes out with its ids by the tab's tokenizer (encoded on its
    own, control-token text as plain text): what a reload restores the partial
    reply from, as it does the engine's.
    """

    def __init__(self, settings: FallbackSettings, messages: list[dict], params: SamplingParams,
                 open_stream, tokenizer: Tokenizer) -> None:
        """`open_stream(url, body_text)` is the bridge's transport: awaits the response, returning an
        object with `status`, `async read() -> bytes | None` (None at the end), `async text()` and `abort()`;
        cancelling the call while it waits must cancel the request."""
        self.settings = settings
        self.body = settings.request_body(messages, params)
        self.max_tokens = params.max_tokens
        self.tokenizer = tokenizer
        self._open_stream = open_stream
        self._response = None
        self._waiting: asyncio.Future | None = None  # the transport call in flight, for abort()
        self.aborted = False
        self.parser = SSEParser()
        self.text: list[str] = []  # the deltas passed on (the last one shortened by the cut)
        self.num_chars = 0
        self.ids: list[int] = []  # their ids, by the tab's tokenizer

    async def run(self, on_text) -> str | None:
        """Stream the reply, calling on_text(delta, ids) per content delta; returns the finish reason ("length"
        when cut at max_tokens; None when aborted). RemoteError on any failure, after closing the connection."""
        try:
            return await self._stream(on_text)
        except BaseException:  # an error, or this task cancelled: the connection must not stay open
            if self._response is not None:
                self._response.abort()
            raise

    async def _stream(self, on_text) -> str | None:
        s = self.settings
        try:
            self._response = await self._within(self._open_stream(s.endpoint, json.dumps(self.body)),
                                                s.connect_timeout_s)
        except TimeoutError:
            raise RemoteError(f"the fallback server at {s.endpoint} did not answer within {s.connect_timeout_s:g} "
                              f"s; check that it runs and is not overloaded") from None
        except asyncio.CancelledError:
            if self.aborted:  # abort() cancels the call
                return None
            raise
        except Exception as exc:  # the browser hides the cause of a failed fetch (CORS, CSP, refused): list them
            if self.aborted:
                return None
            raise RemoteError(
                f"could not reach the fallback server at {s.endpoint} ({exc}); check that it runs, that it "
                f"sends CORS headers, and that the page is served with `--allow-origin {s.origin}`") from None
        if self.aborted:  # stopped while the request was on its way
            self._response.abort()
            return None
        if self._response.status != 200:
            text = await self._read(self._response.text())
            if text is None:  # aborted
                return None
            try:
                detail = error_message(json.loads(text))
            except json.JSONDecodeError:
                detail = text[:200]
            raise RemoteError(f"the fallback server answered HTTP {self._response.status}: {detail}")
        while not self.aborted:
            chunk = await self._read(self._response.read())
            if chunk is None:
                if self.aborted:
                    break
                cut = self._parse(self.parser.close, on_text)
                return "length" if cut else self.parser.state.finish_reason or "stop"
            cut = self._parse(lambda: self.parser.feed(chunk), on_text)
            if cut or self.parser.state.done:  # no need to wait for the server to close the body
                self._response.abort()
                return "length" if cut else self.parser.state.finish_reason or "stop"
        return None

    async def _within(self, awaitable, seconds: float):
        """Await a transport call for at most `seconds` (TimeoutError, the call cancelled); abort() cancels it."""
        self._waiting = asyncio.ensure_future(awaitable)
        try:
            return await asyncio.wait_for(self._waiting, seconds)
        finally:
            self._waiting = None

    async def _read(self, awaitable):
        try:
            return await self._within(awaitable, self.settings.read_timeout_s)
        except TimeoutError:
            raise RemoteError(f"the fallback server sent nothing for {self.settings.read_timeout_s:g} s; "
                              f"the reply ends there") from None
        except asyncio.CancelledError:
            if self.aborted:  # abort() cancels the pending read
                return None
            raise
        except Exception as exc:
            if self.aborted:  # the aborted fetch fails the pending read
                return None
            raise RemoteError(f"the stream from the fallback server broke off: {exc}") from None

    def _parse(self, step, on_text) -> bool:
        """Run a parser step, then pass on its deltas, also those completed before a bad event raised."""
        try:
            step()
        finally:
            cut = self._pass_on(on_text)
        return cut

    def _pass_on(self, on_text) -> bool:
        """Hand the parser's new deltas to on_text, within the max_tokens bounds; True when the cut was reached."""
        max_chars = self.max_tokens * MAX_CHARS_PER_TOKEN
        for delta in self.parser.state.text[len(self.text):]:
            if self.aborted:  # on_text may press Stop
                break
            delta = delta[:max_chars - self.num_chars]  # shortened before encoding, which costs per character
            ids = self.tokenizer.encode(delta, allow_special=False)
            self.text.append(delta)
            self.num_chars += len(delta)
            self.ids += ids
            on_text(delta, ids)
            if len(self.text) >= self.max_tokens or self.num_chars >= max_chars:
                return True
        return False

    def abort(self) -> None:
        """Stop the stream: the pending call ends and `run` returns None."""
        self.aborted = True
        if self._waiting is not None:
            self._waiting.cancel()
        if self._response is not None:
            self._response.abort()
