"""The origin private file system (OPFS) as a file_store.FileStore: every file the page keeps goes through one
OpfsStore per directory (the disk tier's block files in `kv/`, the gpu family's tuning in `tuning/`, each
model the user opened in `models/<key>/`). Imports `js` / `pyodide`: it runs only in the page's worker.
"""
from __future__ import annotations

import asyncio

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

from ..kv.file_store import FileStore, MemoryStore, StoreFull

__all__ = ["LIST_ATTEMPTS", "OpfsStore", "open_or_memory"]

SWAP_SUFFIX = ".crswap"  # Chromium's swap file of a createWritable() not yet closed
LIST_ATTEMPTS = 4
DELETE_ATTEMPTS = 4  # a file with a writable open refuses removal until the write closes
WRITE_ATTEMPTS = 3  # a write meets a removal of its file in flight


def _js_obj(value: dict):
    return to_js(value, dict_converter=js.Object.fromEntries)


# How long a storage call may take before the store is taken for unusable. With the origin's quota full,
# Chromium (156) never settles a worker's getFileHandle / getDirectoryHandle that would create an entry, or
# rejects it with a QuotaExceededError that has no `stack`. A busy machine answers in well under a second.
STORAGE_TIMEOUT_S = 10.0


class StorageError(OSError):
    """A storage call the browser refused, as its DOMException: `name` (NotFoundError, QuotaExceededError, ...)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


class StorageStalled(StoreFull):
    """The browser's storage did not answer: in Chromium, what a full quota does to the calls that create."""


class StorageQuotaFull(StorageError, StoreFull):
    """A storage call the browser refused with QuotaExceededError: a StoreFull whose message says what to do."""


async def _settle(what: str, target, method: str, *args):
    """`target.method(*args)`, a storage call, awaited: its rejection raises StorageError, no answer in
    STORAGE_TIMEOUT_S StorageStalled. The call is made in JavaScript (the worker's `pagedkvSettleCall`,
    web/worker.js), which hands a rejection over as a value: its promise never reaches Python. Pyodide turns a
    promise it is handed into a future at once, and a rejection with a QuotaExceededError that has no `stack`
    (what Chromium gives under a full quota) then fails in that future ("TypeError: invalid exception object"),
    an uncaught error in the page even when the same promise was settled through JavaScript too."""
    try:
        result = await asyncio.wait_for(js.pagedkvSettleCall(target, method, *args), STORAGE_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise StorageStalled(f"the browser's storage did not answer ({what}) in {STORAGE_TIMEOUT_S:g} s: its "
                             "quota for this site is likely full (remove saved models or chats to free it)") from None
    if not result.ok:
        if str(result.name) == "QuotaExceededError":
            raise StorageQuotaFull("QuotaExceededError", f"the browser's storage quota for this site is full ({what}): "
                                   "remove saved models or chats to free it")
        raise StorageError(str(result.name), str(result.message))
    return result.value


def _js_error(err: Exception, name: str) -> bool:
    """Whether a JS exception is the DOMException `name` (QuotaExceededError, NotFoundError)."""
    return isinstance(err, (JsException, StorageError)) and (getattr(err, "name", "") == name or name in str(err))


async def _opfs_directory(path: tuple[str, ...], create: bool = True):
    """The handle of the directory at `path` under the OPFS root, created when it is not there and `create`
    is set; FileNotFoundError names the first missing part otherwise."""
    storage = getattr(js.navigator, "storage", None)
    if storage is None or not hasattr(storage, "getDirectory"):
        raise OSError("this browser has no origin private file system (navigator.storage.getDirectory)")
    handle = await _settle("opening its root", storage, "getDirectory")
    for i, part in enumerate(path):
        try:
            handle = await _settle(f"opening {'/'.join(path[:i + 1])}", handle, "getDirectoryHandle", part,
                                   _js_obj({"create": create}))
        except StorageError as err:
            if _js_error(err, "NotFoundError"):
                raise FileNotFoundError(f"{'/'.join(path[:i + 1])} is not in this browser's storage") from None
            raise
    return handle


class OpfsStore:
    """A file_store.FileStore over one directory of the origin private file system, apart from other OPFS data.
    Create with `await OpfsStore.open("kv")` (or a nested path: `OpfsStore.open("models", key)`).

    Its directory handle can go stale: in a long benchmark run under load Chromium's iterator raised
    NotFoundError on every try with the same handle. A store that knows its directory's path (open() gives it)
    takes the handle again from the OPFS root, creating the directory when it is gone, after a listing failed
    twice or when a write finds the directory gone; `reopened` counts those."""

    def __init__(self, directory, path: tuple[str, ...] | None = None) -> None:
        self.directory = directory
        self.path = path
        self.reopened = 0

    @classmethod
    async def open(cls, *path: str, create: bool = True) -> "OpfsStore":
        """The store of the directory at `path`, created when absent (with create=False: FileNotFoundError
        then). Raises OSError naming the reason when this browser has no origin private file system."""
        return cls(await _opfs_directory(path, create), path)

    async def _reopen(self) -> bool:
        """The directory's handle taken again from the root; False for a store that has no path."""
        if self.path is None:
            return False
        self.directory = await _opfs_directory(self.path)
        self.reopened += 1
        return True

    async def read(self, name: str) -> bytes | None:
        try:
            handle = await _settle(f"opening {name}", self.directory, "getFileHandle", name)
        except StorageError as err:
            if _js_error(err, "NotFoundError"):
                return None
            raise
        file = await _settle(f"reading {name}", handle, "getFile")
        return (await _settle(f"reading {name}", file, "arrayBuffer")).to_bytes()

    async def write(self, name: str, data: bytes) -> None:
        """Write `name` whole. A file (or directory) removed while it is written, or locked by a removal in
        flight (this tab's disk tier forgetting a deleted chat's blocks, another tab evicting), is written
        again, up to WRITE_ATTEMPTS times in all; then OSError. StoreFull when the browser's quota refuses it."""
        for attempt in range(WRITE_ATTEMPTS):
            try:
                return await self._write_once(name, data)
            except StorageError as err:
                if not (_js_error(err, "NotFoundError") or _js_error(err, "NoModificationAllowedError")):
                    raise
                if attempt == WRITE_ATTEMPTS - 1:
                    raise OSError(f"{name} could not be written: it went or stayed locked, "
                                  f"{WRITE_ATTEMPTS} tries ({err})") from err
                await asyncio.sleep(0.02 * (attempt + 1))

    async def _write_once(self, name: str, data: bytes) -> None:
        create = _js_obj({"create": True})
        try:
            handle = await _settle(f"creating {name}", self.directory, "getFileHandle", name, create)
        except StorageError as err:  # the directory itself is gone (removed, or its handle stale)
            if not _js_error(err, "NotFoundError") or not await self._reopen():
                raise
            handle = await _settle(f"creating {name}", self.directory, "getFileHandle", name, create)
        try:  # a swap file: nothing lands in `name` before close()
            writable = await _settle(f"opening {name}", handle, "createWritable")
        except StorageError as err:
            await self._refused(name, len(data), err)
        try:
            await _settle(f"writing {name}", writable, "write", to_js(memoryview(data)))
        except StorageError as err:
            await _settle(f"abandoning {name}", writable, "abort")
            await self._refused(name, len(data), err)
        try:
            await _settle(f"closing {name}", writable, "close")
        except StorageError as err:
            await self._refused(name, len(data), err)

    async def _refused(self, name: str, nbytes: int, err: Exception) -> None:
        if _js_error(err, "NotFoundError") or _js_error(err, "NoModificationAllowedError"):
            raise err  # removed (or being removed) while written: write() tries again
        await self.delete(name)  # the empty file getFileHandle created
        if isinstance(err, StorageQuotaFull):  # says the quota and what to free already
            raise err
        if _js_error(err, "QuotaExceededError"):
            raise StoreFull(f"the browser's storage quota refused {name} ({nbytes:,} bytes; remove saved models "
                            f"or chats to free it): {err}") from err
        raise err

    async def delete(self, name: str) -> None:
        """Remove `name` (gone already is fine). A file being written (a writable open on it, here or in another
        tab) cannot be removed: tried again for up to ~0.2 s, then left to the writer, whose file it is now
        (a disk tier lists it again at its next open and evicts it by LRU)."""
        for attempt in range(DELETE_ATTEMPTS):
            try:
                return await _settle(f"removing {name}", self.directory, "removeEntry", name)
            except StorageError as err:
                if _js_error(err, "NotFoundError"):
                    return
                if not _js_error(err, "NoModificationAllowedError"):
                    raise
                await asyncio.sleep(0.02 * (attempt + 1))

    async def names(self) -> dict[str, int]:
        """{name: bytes} of the files now in the directory. Another tab of the app (or this one's write-behind)
        may write and delete while it is listed: a write in flight shows as `<name>.crswap`, Chromium's swap
        file, which is not a file of the store, and the file itself reads empty until that write closes: both
        are left out (no file of the store is empty), as is an entry deleted between the listing and its
        size read. The directory iterator itself has raised NotFoundError (in long benchmark runs under load):
        the listing is tried again, LIST_ATTEMPTS times in all, from the third try on with the directory's
        handle taken again from the OPFS root."""
        for attempt in range(LIST_ATTEMPTS):
            try:
                return await self._list()
            except StorageError as err:  # the iterator itself: an entry went while Chromium read the directory
                if not _js_error(err, "NotFoundError") or attempt == LIST_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
                if attempt >= 1:  # the same handle failed twice: not an entry going, the handle itself
                    await self._reopen()

    async def _entries(self):
        """The directory's entries, each step of its iterator awaited through _settle."""
        entries = self.directory.values()
        while True:
            step = await _settle("listing its files", entries, "next")
            if step.done:
                return
            yield step.value

    async def _list(self) -> dict[str, int]:
        out = {}
        async for handle in self._entries():
            name = str(handle.name)
            if handle.kind != "file" or name.endswith(SWAP_SUFFIX):
                continue
            try:
                size = int((await _settle(f"sizing {name}", handle, "getFile")).size)
            except StorageError as err:
                if not _js_error(err, "NotFoundError"):
                    raise
                continue
            if size:
                out[name] = size
        return out

    # ---------------------------------------------------------------- subdirectories (the model library)

    async def directories(self) -> list[str]:
        """Names of the directories in this one, sorted."""
        return sorted([str(handle.name) async for handle in self._entries() if handle.kind == "directory"])

    async def remove_directory(self, name: str) -> None:
        """Delete the directory `name` in this one with everything in it."""
        await _settle(f"removing {name}", self.directory, "removeEntry", name, _js_obj({"recursive": True}))


async def open_or_memory(*path: str) -> FileStore:
    """The OPFS store at `path`, or where this browser has no origin private file system a MemoryStore, which
    lasts as long as the page."""
    try:
        return await OpfsStore.open(*path)
    except OSError:
        return MemoryStore()
