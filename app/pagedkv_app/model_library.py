"""The page's model list: the user's GGUF files, converted in this worker and kept in OPFS (models/<key>/).

The page posts {type: "open-gguf", file}, {type: "remove-model", id} and {type: "list-models"}; answers
are "user-models", "gguf-progress", "gguf-stored" and "gguf-error". A stored model is model.json + shards
as build.py writes them, plus entry.json, written last: a directory without it is an interrupted store
and is neither listed nor loaded. Opening a model is a page reload with ?model=<id> (web/models.js).
"""
from __future__ import annotations

import asyncio
import json
import os
import traceback

from pagedkv.browser.opfs import OpfsStore
from pagedkv.model.gguf_reader import GGUFFile

from . import bridge
from .user_models import MIB, convert_checked, is_user_model, key_of, model_id, storage_key

OPFS_ROOT = "models"
ENTRY_NAME = "entry.json"
CONVERT_DIR = "/tmp/pagedkv-convert"  # Pyodide's in-memory file system: the converter writes here first

_tasks: set = set()  # keeps each running open / remove alive until it ends


def model_reader(name: str):
    """`await read(file, on_chunk=None) -> bytes` for a model's files: from this site, or from OPFS."""
    if not is_user_model(name):
        return lambda file, on_chunk=None: bridge.fetch_bytes(f"models/{name}/{file}", on_chunk)
    key = key_of(name)

    async def read(file: str, on_chunk=None) -> bytes:
        store = await _stored(key)
        if file == "model.json" and (store is None or ENTRY_NAME not in await store.names()):
            raise FileNotFoundError(f"the model {name} is not stored in this browser (removed, or its storing "
                                    "was interrupted): open its GGUF file again")
        data = None if store is None else await store.read(file)
        if data is None:
            raise FileNotFoundError(f"{OPFS_ROOT}/{key}/{file} is not in this browser's storage")
        if on_chunk is not None:
            on_chunk(len(data))
        return data

    return read


async def _stored(key: str | None = None) -> OpfsStore | None:
    """The OPFS store of `models/` (or of one model's directory in it), None when it is not there."""
    try:
        return await OpfsStore.open(OPFS_ROOT, *([key] if key is not None else []), create=False)
    except FileNotFoundError:
        return None


async def list_user_models() -> list[dict]:
    """[{id, name, bytes}] of every completely stored user model, by file name."""
    models = []
    root = await _stored()
    for key in [] if root is None else await root.directories():
        store = await _stored(key)
        if ENTRY_NAME in await store.names():
            entry = json.loads(await store.read(ENTRY_NAME))
            models.append({"id": model_id(key), "name": entry["name"], "bytes": entry["bytes"]})
    return sorted(models, key=lambda m: m["name"])


async def post_list() -> None:
    bridge.post("user-models", models=await list_user_models())


# The page's model-list messages (a JS object each: its File stays a File) -> the action's coroutine;
# settings() -> dict(budget_bytes, block_size, kv_dtype, max_binding).
ACTIONS = {
    "open-gguf": lambda msg, settings: open_gguf(msg.file, settings()),
    "remove-model": lambda msg, settings: remove_model(str(msg.id)),
    "list-models": lambda msg, settings: post_list(),
}


def handle(msg, settings) -> None:
    """Start the model-list action `msg` asks for (ACTIONS); it runs on, its error goes to the page."""
    kind = str(msg.type)
    task = asyncio.ensure_future(reported(ACTIONS[kind](msg, settings), kind))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def reported(coro, kind: str) -> None:
    """Run a model-list action; its error goes to the page as gguf-error (with the traceback as detail)."""
    try:
        await coro
    except Exception as exc:  # shown on the page; the model in use keeps serving
        bridge.post("gguf-error", action=kind, message=str(exc) if str(exc) else type(exc).__name__,
                    error=type(exc).__name__, detail=traceback.format_exc())


async def open_gguf(file, settings: dict) -> None:
    """Read a GGUF File in slices, convert it tensor by tensor, let the ledger decide, then store it in OPFS."""
    name, size = str(file.name), int(file.size)
    key = storage_key(name)

    def progress(stage: str, loaded: int, total: int, detail: str) -> None:
        bridge.post("gguf-progress", file=name, stage=stage, loaded=loaded, total=total, detail=detail)

    progress("read", 0, 1, f"reading the header of {name} ({size / MIB:,.1f} MiB)")
    reader = GGUFFile(lambda offset, n: bridge.read_file_slice(file, offset, n), size, name)

    def on_tensor(done: int, count: int, tensor: str) -> None:
        progress("convert", done, count, f"converted {tensor}")

    out_dir = f"{CONVERT_DIR}/{key}"
    manifest = convert_checked(reader, out_dir, on_tensor=on_tensor, **settings)
    try:
        files = [s["file"] for s in manifest["shards"]] + ["model.json"]
        root = await OpfsStore.open(OPFS_ROOT)
        if key in await root.directories():
            await root.remove_directory(key)  # the same file name opened again replaces its model
        store = await OpfsStore.open(OPFS_ROOT, key)
        total = sum(os.path.getsize(f"{out_dir}/{f}") for f in files)
        stored = 0
        for f in files:
            with open(f"{out_dir}/{f}", "rb") as src:
                data = src.read()
            os.remove(f"{out_dir}/{f}")  # one copy at a time in wasm memory besides OPFS's
            await store.write(f, data)
            stored += len(data)
            progress("store", stored, total, f"stored {f} in this browser")
        entry = {"name": name, "bytes": size, "stored_bytes": total}
        await store.write(ENTRY_NAME, json.dumps(entry).encode())
    finally:
        for f in os.listdir(out_dir):
            os.remove(f"{out_dir}/{f}")
        os.rmdir(out_dir)
    bridge.post("gguf-stored", id=model_id(name), name=name)
    await post_list()


async def remove_model(name: str) -> None:
    """Delete a user model's OPFS data."""
    key = key_of(name)
    root = await _stored()
    if root is None or key not in await root.directories():
        raise FileNotFoundError(f"the model {name} is not stored in this browser")
    await root.remove_directory(key)
    await post_list()
