"""The app's UI bridge: the only app module that imports `js` / `pyodide`.

The app runs in a dedicated worker; the UI thread (web/main.js) receives plain
objects posted from here and renders them.
"""
from __future__ import annotations

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy, to_js  # type: ignore[import-not-found]

from pagedkv.backends.webgpu.interop import fetch_bytes  # noqa: F401  (the app fetches site files with it)

_handler_proxy = None
_models_proxy = None


def post(msg_type: str, **payload) -> None:
    """Send one message `{type: msg_type, ...payload}` to the UI thread."""
    message = {"type": msg_type, **payload}
    js.postMessage(to_js(message, dict_converter=js.Object.fromEntries))


def now_ms() -> float:
    return float(js.performance.now())


def set_handler(handler) -> None:
    """Route every UI message (other than tool `exec`s) to handler(dict)."""
    global _handler_proxy

    def receive(msg):
        handler(msg.to_py())

    _handler_proxy = create_proxy(receive)
    js.self.pagedkvHandle = _handler_proxy


def set_models_handler(handler) -> None:
    """Route the page's model-list messages (web/worker.js: open-gguf, remove-model, list-models) to
    handler(msg), the message as a JS object: its File stays a File."""
    global _models_proxy
    _models_proxy = create_proxy(handler)
    js.self.pagedkvModels = _models_proxy


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


# ---------------------------------------------------------------- files the user picks, and OPFS

def read_file_slice(file, offset: int, nbytes: int) -> bytes:
    """Bytes offset..offset+nbytes of a File the user picked, read synchronously (workers have
    FileReaderSync), so the GGUF reader and the converter stay plain synchronous Python."""
    return js.FileReaderSync.new().readAsArrayBuffer(file.slice(offset, offset + nbytes)).to_bytes()


def _options(**kw):
    return to_js(kw, dict_converter=js.Object.fromEntries)


async def opfs_dir(*parts: str, create: bool = False):
    """The origin-private directory at parts (created if asked); FileNotFoundError names the missing path."""
    handle = await js.navigator.storage.getDirectory()
    for i, part in enumerate(parts):
        try:
            handle = await handle.getDirectoryHandle(part, _options(create=create))
        except Exception as exc:
            if getattr(exc, "name", "") == "NotFoundError" or "NotFoundError" in str(exc):
                raise FileNotFoundError(f"{'/'.join(parts[:i + 1])} is not in this browser's storage") from None
            raise
    return handle


async def opfs_names(*parts: str) -> list[str]:
    """Names in an OPFS directory (empty when it does not exist)."""
    try:
        handle = await opfs_dir(*parts)
    except FileNotFoundError:
        return []
    names, it = [], handle.keys()
    while not (step := await it.next()).done:
        names.append(str(step.value))
    return sorted(names)


async def opfs_write(parts: tuple[str, ...], name: str, data: bytes) -> None:
    """Write (replace) file `name` in the OPFS directory at parts."""
    directory = await opfs_dir(*parts, create=True)
    writable = await (await directory.getFileHandle(name, _options(create=True))).createWritable()
    array = js.Uint8Array.new(len(data))
    array.assign(data)
    await writable.write(array)
    await writable.close()


async def opfs_read(parts: tuple[str, ...], name: str) -> bytes:
    directory = await opfs_dir(*parts)
    try:
        handle = await directory.getFileHandle(name)
    except Exception as exc:
        raise FileNotFoundError(f"{'/'.join(parts)}/{name} is not in this browser's storage ({exc})") from None
    return (await (await handle.getFile()).arrayBuffer()).to_bytes()


async def opfs_remove(parts: tuple[str, ...]) -> None:
    """Delete the OPFS directory at parts with everything in it."""
    parent = await opfs_dir(*parts[:-1])
    await parent.removeEntry(parts[-1], _options(recursive=True))
