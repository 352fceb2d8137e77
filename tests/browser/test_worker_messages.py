"""The worker reads every page message as Python data through bridge.plain: its JSON text, never JsProxy.to_py.

Pyodide 0.27's to_py gives a JS object met twice in one conversion one Python object with too few references
(pyodide#5598; here a dict in three list slots held 2 references where 4 are due). Python then frees it while the
list still holds it, and the heap it corrupts took the worker down ("Pyodide has suffered a fatal error") a turn
after a chat record merged by another tab (whose arrays are shared) reached the worker."""
from __future__ import annotations

from browser_pages import open_app

SHARED = """import json, sys
import js
from pagedkv_app import bridge
shared = js.Object.new(); shared.role = "user"; shared.content = "hi"
msgs = js.Array.new(); msgs.push(shared); msgs.push(shared); msgs.push(shared)
msg = js.Object.new(); msg.type = "send"; msg.messages = msgs; msg.settings = js.Object.new()
got = bridge.plain(msg)
m = got["messages"]
json.dumps({"got": got, "distinct": len({id(x) for x in m}), "refs": [sys.getrefcount(m[i]) for i in range(3)]})"""


def test_a_message_with_shared_objects_becomes_distinct_python_values_with_their_own_references(browser, base_url):
    context = browser.new_context()
    try:
        page, _ = open_app(context, base_url + "?model=tiny-random&backend=cpu", 60_000)
        out = page.py(SHARED)
    finally:
        context.close()
    message = {"role": "user", "content": "hi"}
    assert out["got"] == {"type": "send", "messages": [message] * 3, "settings": {}}
    # Three dicts, each held by its list slot alone (+1: getrefcount's own argument).
    assert out["distinct"] == 3 and out["refs"] == [2, 2, 2]
