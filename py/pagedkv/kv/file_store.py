"""The flat async file store the disk tier of the KV cache keeps its block files in (kv_disk.DiskTier): the
interface, its quota error, and an in-memory store for tests and pages without an origin private file system.
The page's store is browser.opfs.OpfsStore (one OPFS directory); the benchmark's under CPython is
bench.kv_disk.DirStore.
"""
from __future__ import annotations

from typing import Protocol

__all__ = ["StoreFull", "FileStore", "MemoryStore"]


class StoreFull(OSError):
    """The file store refused a write: quota exceeded or disk full."""


class FileStore(Protocol):
    """Flat async file store (OPFS directory in the page, a dict in tests)."""

    async def read(self, name: str) -> bytes | None:
        """The file's bytes, or None when there is no such file."""

    async def write(self, name: str, data: bytes) -> None:
        """Create or replace a file; raises StoreFull on quota / disk full (nothing written then)."""

    async def delete(self, name: str) -> None:
        """Remove a file; no error when it is absent."""

    async def names(self) -> dict[str, int]:
        """{name: size in bytes} of every file; may leave out an empty one (OPFS: a write still in flight)."""


class MemoryStore:
    """A FileStore in a dict; quota_bytes (optional) makes writes past it raise StoreFull like a browser."""

    def __init__(self, quota_bytes: int | None = None) -> None:
        self.files: dict[str, bytes] = {}
        self.quota_bytes = quota_bytes

    async def read(self, name: str) -> bytes | None:
        return self.files.get(name)

    async def write(self, name: str, data: bytes) -> None:
        used = sum(len(v) for k, v in self.files.items() if k != name)
        if self.quota_bytes is not None and used + len(data) > self.quota_bytes:
            raise StoreFull(f"quota of {self.quota_bytes} bytes exceeded writing {name} ({len(data)} bytes, "
                            f"{used} in use)")
        self.files[name] = bytes(data)

    async def delete(self, name: str) -> None:
        self.files.pop(name, None)

    async def names(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.files.items()}
