"""The app's UI bridge: the only app module that imports `js` / `pyodide`.

The app runs in a dedicated worker; the UI thread (web/main.js) receives plain
objects posted from here and renders them.
"""
from __future__ import annotations

import json

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy, to_js  # type: ignore[import-not-found]

from pagedkv.browser.interop import fetch_bytes  # noqa: F401  (the app fetches site files with it)

_router_proxy = None


def plain(msg) -> dict:
    """A page message as Python data, through its JSON text rather than JsProxy.to_py: Pyodide 0.27's to_py
    miscounts the references of a JS object met twice in one conversion (pyodide#5598, fixed upstream in
    pyodide#6245), and the freed object then corrupts Python's heap ("Pyodide has suffered a fatal error"). A chat
    record merged from two tabs carries such shared arrays; its JSON text has none."""
    return json.loads(js.JSON.stringify(msg))


def post(msg_type: str, **payload) -> None:
    """Send one message `{type: msg_type, ...payload}` to the UI thread."""
    message = {"type": msg_type, **payload}
    js.postMessage(to_js(message, dict_converter=js.Object.fromEntries))


def progress(model: str, detail: str = "downloading weights"):
    """on_progress(loaded, total) posting model-progress for `model` with `detail` (what is being loaded)."""
    def on_progress(loaded: int, total: int) -> None:
        post("model-progress", model=model, loaded=loaded, total=total, detail=detail)

    return on_progress


def now_ms() -> float:
    return float(js.performance.now())


def set_router(route) -> None:
    """Route every page message but tools' `exec` (web/worker.js forwards them) to route(msg), the message as
    a JS object (a File the user picked stays a File)."""
    global _router_proxy
    _router_proxy = create_proxy(route)
    js.self.pagedkvRoute = _router_proxy


def user_agent() -> str:
    """The browser's user agent: its version is part of the gpu kernel family's tuning cache key."""
    return str(js.navigator.userAgent)


def query_param(name: str, default: str) -> str:
    """A parameter of the page URL (the worker is started with the page's query string)."""
    params = js.URLSearchParams.new(js.location.search)
    value = params.get(name)
    return default if value is None else str(value)


class _FetchStream:
    """A streaming fetch response for remote.RemoteReply: read() chunk by chunk, abort() cancels the fetch."""

    def __init__(self, response, controller) -> None:
        self.status = int(response.status)
        self._response = response
        self._controller = controller
        self._reader = None

    async def read(self) -> bytes | None:
        if self._reader is None:
            self._reader = self._response.body.getReader()
        chunk = await self._reader.read()
        return None if chunk.done else bytes(chunk.value.to_py())

    async def text(self) -> str:
        return str(await self._response.text())

    def abort(self) -> None:
        self._controller.abort()


async def open_stream(url: str, body: str) -> _FetchStream:
    """POST JSON `body` to `url` (a server the user configured); the response body is read as it streams."""
    controller = js.AbortController.new()
    init = {"method": "POST", "headers": {"Content-Type": "application/json", "Accept": "text/event-stream"},
            "body": body, "signal": controller.signal, "mode": "cors", "credentials": "omit"}
    try:
        response = await js.fetch(url, to_js(init, dict_converter=js.Object.fromEntries))
    except BaseException:  # failed, or cancelled by the reply's connect timeout or Stop: end the request too
        controller.abort()
        raise
    return _FetchStream(response, controller)


# ---------------------------------------------------------------- files the user picks

def read_file_slice(file, offset: int, nbytes: int) -> bytes:
    """Bytes offset..offset+nbytes of a File the user picked, read synchronously (workers have
    FileReaderSync), so the GGUF reader and the converter stay plain synchronous Python."""
    return js.FileReaderSync.new().readAsArrayBuffer(file.slice(offset, offset + nbytes)).to_bytes()
