"""The optional fallback to an OpenAI-compatible server: settings, request body, SSE stream parsing.

When a request cannot run in the tab (no WebGPU, a request the KV pool can never
hold, or the user asks for it), the chat streams from the configured server's
`/v1/chat/completions` with `stream: true`. Nothing here imports `js`: the HTTP
transport (fetch + reading the body stream + abort) is passed in by the bridge,
so the parser and the stream driver run and are tested under CPython.
"""
from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field

from pagedkv.sampling import SamplingParams

MODES = ("auto", "always")  # auto: only when the tab cannot answer; always: every reply comes from the server


class RemoteError(RuntimeError):
    """The fallback server could not be reached, refused the request, or broke off the stream."""


@dataclass(frozen=True)
class FallbackSettings:
    """Where to send a request the tab cannot answer; built only when the user set a URL."""

    url: str
    model: str
    mode: str = "auto"

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"fallback server URL {self.url!r} must look like http://host:port or "
                             f"https://host/v1 (no query or fragment)")
        if not self.model.strip():
            raise ValueError("set the fallback server's model name (the `model` field of its requests)")
        if self.mode not in MODES:
            raise ValueError(f"fallback mode {self.mode!r} must be one of {list(MODES)}")

    @classmethod
    def from_settings(cls, settings: dict) -> FallbackSettings | None:
        """The page's settings -> FallbackSettings, or None when no URL is set (nothing leaves the page)."""
        url = str(settings.get("fallback_url") or "").strip()
        if not url:
            return None
        return cls(url=url, model=str(settings.get("fallback_model") or "").strip(),
                   mode=str(settings.get("fallback_mode") or "auto"))

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
    the events completed by them. An `{"error": ...}` payload raises RemoteError.
    """

    def __init__(self) -> None:
        self.state = StreamState()
        self._buffer = b""
        self._data: list[str] = []  # `data:` lines of the event being read
        self._pending_cr = False  # the last chunk ended in CR: a following LF belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        """Parse more body bytes; returns the content deltas completed by them, in order."""
        if not chunk:
            return []
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._pending_cr = chunk.endswith(b"\r")
        self._buffer += chunk
        deltas: list[str] = []
        lines = self._buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._buffer = lines.pop()  # an unfinished line waits for the next chunk
        for raw in lines:
            deltas.extend(self._line(raw.decode("utf-8", errors="replace")))
        return deltas

    def close(self) -> None:
        """The body ended: dispatch a last event without its blank line; RemoteError if the reply is cut off."""
        if self._buffer:
            self._line(self._buffer.decode("utf-8", errors="replace"))
            self._buffer = b""
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
            self._data.append(value[1:] if value.startswith(" ") else value)
        return []

    def _dispatch(self) -> list[str]:
        if not self._data:
            return []
        data, self._data = "\n".join(self._data), []
        if data.strip() == "[DONE]":
            self.state.done = True
            return []
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            raise RemoteError(f"the fallback server sent an event that is not JSON: {data[:200]!r}") from None
        if isinstance(payload, dict) and "error" in payload:
            raise RemoteError(f"the fallback server reported an error: {error_message(payload)}")
        return self._chunk(payload)

    def _chunk(self, payload) -> list[str]:
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise RemoteError(f"the fallback server sent an event without 'choices': {str(payload)[:200]!r}")
        self.state.model = payload.get("model", self.state.model)
        deltas = []
        for choice in payload["choices"]:
            if choice.get("index", 0) != 0:
                continue  # we ask for one choice
            content = (choice.get("delta") or {}).get("content")
            if content:
                deltas.append(content)
                self.state.text.append(content)
            if choice.get("finish_reason"):
                self.state.finish_reason = choice["finish_reason"]
        return deltas


def error_message(payload) -> str:
    """The human part of an OpenAI-style error body (`{"error": {"message": ...}}` or `{"error": "..."}`)."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err if err is not None else payload)


class RemoteReply:
    """One streamed reply from the fallback server; `abort()` stops it (the fetch is cancelled)."""

    def __init__(self, settings: FallbackSettings, messages: list[dict], params: SamplingParams,
                 open_stream) -> None:
        """`open_stream(url, body_text)` is the bridge's transport: awaits the response, returning an
        object with `status`, `async read() -> bytes | None` (None at the end), `async text()` and `abort()`."""
        self.settings = settings
        self.body = settings.request_body(messages, params)
        self._open_stream = open_stream
        self._response = None
        self.aborted = False
        self.parser = SSEParser()

    async def run(self, on_text) -> StreamState:
        """Stream the reply, calling on_text(delta) per content delta; RemoteError on any failure."""
        s = self.settings
        try:
            self._response = await self._open_stream(s.endpoint, json.dumps(self.body))
        except Exception as exc:  # the browser hides the cause of a failed fetch (CORS, CSP, refused): list them
            if self.aborted:
                return self.parser.state
            raise RemoteError(
                f"could not reach the fallback server at {s.endpoint} ({exc}); check that it runs, that it "
                f"sends CORS headers, and that the page is served with `--allow-origin {s.origin}`") from None
        if self.aborted:  # stopped while the request was on its way
            self._response.abort()
            return self.parser.state
        if self._response.status != 200:
            text = await self._response.text()
            try:
                detail = error_message(json.loads(text))
            except json.JSONDecodeError:
                detail = text[:200]
            raise RemoteError(f"the fallback server answered HTTP {self._response.status}: {detail}")
        while not self.aborted:
            try:
                chunk = await self._response.read()
            except Exception as exc:
                if self.aborted:  # abort() cancels the pending read
                    break
                raise RemoteError(f"the stream from the fallback server broke off: {exc}") from None
            if chunk is None:
                self.parser.close()
                break
            for delta in self.parser.feed(chunk):
                on_text(delta)
        return self.parser.state

    def abort(self) -> None:
        """Stop the stream: the pending read ends and `run` returns what arrived so far."""
        self.aborted = True
        if self._response is not None:
            self._response.abort()
