"""The app's UI bridge: the only app module that imports `js` / `pyodide`.

The app runs in a dedicated worker; the UI thread (web/main.js) receives plain
objects posted from here and renders them.
"""
from __future__ import annotations

import js  # type: ignore[import-not-found]
from pyodide.ffi import to_js  # type: ignore[import-not-found]


def post(msg_type: str, **payload) -> None:
    """Send one message `{type: msg_type, ...payload}` to the UI thread."""
    message = {"type": msg_type, **payload}
    js.postMessage(to_js(message, dict_converter=js.Object.fromEntries))


def now_ms() -> float:
    return float(js.performance.now())
