"""The disk tier of the KV cache: full blocks kept in a file store (OPFS in the page) by content hash, one block
per file (block_files.py: the file's name, header and payload, and how a lookup checks it).

The store's files are an LRU under a byte budget; `touch` moves blocks used from any tier (a GPU prefix
hit too) to the recent end, so the disk drops what no tier used for longest. The order survives a reload:
`flush` writes it to `<layout key>.lru` (the chain hashes, least recently used first, one per line; about
33 bytes per block, beside the budget) when it changed, at most once every INDEX_INTERVAL_S seconds, and
always when forced (the engine forces it when its last request ends). The whole index is rewritten each time
(48 KB once a 512 MiB store of SmolLM2's f16 blocks is full, 144 KB of int4 ones), so not at every block that
fills; a reload in the middle of a reply loses at most the last interval's moves (blocks written since the
index count as the newest, which they are). A full store (quota) lowers the budget to what is stored and leaves a
note: new blocks then replace old ones, nothing stops a chat.

Several models of one engine share one store and one budget: the second model's tier is made with
`share_with=` the first's. They hold one LRU of the store's files and one budget, so a block of either model
is evicted when it is the least recently used of both; each keeps its own index file and owners.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

from .block_files import (BlockFileError, DiskKey, block_chain, block_payloads, block_words,  # noqa: F401
                          decode_block, encode_block, model_hash)  # (the file format, re-exported)
from .file_store import FileStore, MemoryStore, StoreFull  # noqa: F401  (MemoryStore: re-exported)

__all__ = ["StoreFull", "FileStore", "MemoryStore", "DiskKey", "TierBudgets", "BlockFileError", "DiskTier",
           "block_chain", "encode_block", "decode_block", "model_hash", "block_payloads", "block_words"]

MAX_NOTES = 20  # the latest notes kept for the memory panel
INDEX_INTERVAL_S = 10.0  # the LRU index is rewritten at most this often unless forced


@dataclass(frozen=True)
class TierBudgets:
    """Byte budgets of the three tiers; each tier holds as many whole blocks as its bytes allow."""

    gpu_bytes: int
    cpu_bytes: int
    disk_bytes: int

    def __post_init__(self) -> None:
        for name in ("gpu_bytes", "cpu_bytes", "disk_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")

    def num_blocks(self, key: DiskKey) -> dict[str, int]:
        """Blocks of `key`'s KV per tier: {'gpu': n, 'cpu': n, 'disk': n} (disk counts whole files)."""
        block = key.payload_bytes
        return {"gpu": self.gpu_bytes // block, "cpu": self.cpu_bytes // block,
                "disk": self.disk_bytes // key.file_bytes}


class DiskTier:
    """Block files of one KV layout in a FileStore, LRU under `budget_bytes` (see the module docstring).

    Call `await open()` once: it indexes the files already stored (a reload finds them). Files of other
    layouts count toward the budget and are evicted first. Owners (chats) name the blocks they reference;
    `forget(owner)` deletes the blocks no other owner references.
    """

    def __init__(self, store: FileStore, key: DiskKey, budget_bytes: int,
                 index_interval_s: float = INDEX_INTERVAL_S, clock=time.monotonic,
                 share_with: "DiskTier | None" = None) -> None:
        """share_with: another model's tier over the same store; this one shares its LRU and budget (its own
        budget_bytes is not used)."""
        if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be a non-negative int, got {budget_bytes!r}")
        if share_with is not None and share_with.store is not store:
            raise ValueError("a tier shares the LRU of another tier over the same store only")
        self.store = store
        self.key = key
        self._root = self if share_with is None else share_with._root  # holds the budget every sharer uses
        self._budget = budget_bytes
        # file name -> bytes, least recently used first (one object for every tier that shares it)
        self._lru: OrderedDict[str, int] = OrderedDict() if share_with is None else share_with._lru
        self._indexes: set[str] = set() if share_with is None else self._root._indexes  # not block files
        self._indexes.add(self.index_name)
        # one eviction-and-write at a time over the shared budget (two models' background writers)
        self._writes = asyncio.Lock() if share_with is None else self._root._writes
        self._owners: dict[str, set[str]] = {}  # owner -> chain hashes
        self.notes: list[str] = []
        self._dirty = False  # the LRU order changed since the index file was written
        self._order_unsaved = False  # the last index write failed (noted once)
        self.index_interval_s = index_interval_s
        self._clock = clock
        self._index_due = float("-inf")  # when an unforced flush may write the index again
        self.num_index_writes = 0
        self.num_corrupt = 0
        self.num_written = 0
        self.num_read = 0

    @property
    def budget_bytes(self) -> int:
        """Bytes every file in the store may take (the budget the sharing tiers hold together)."""
        return self._root._budget

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self._root._budget = value

    @property
    def index_name(self) -> str:
        """The file holding this layout's LRU order."""
        return self.key.hex + ".lru"

    async def open(self) -> None:
        """Index the files in the store: foreign ones first (in name order), then ours in the saved LRU order;
        ours the saved order lacks (written after it was saved) count as the most recent, in name order."""
        names = await self.store.names()
        rank = await self._saved_order(names.pop(self.index_name, None) is not None)
        for name in self._indexes:  # the other sharing tiers' index files
            names.pop(name, None)
        prefix = self.key.hex + "-"
        unsaved = len(rank)

        def key(item):
            name = item[0]
            if not name.startswith(prefix):
                return (0, 0, name)
            return (1, rank.get(name[len(prefix):], unsaved), name)
        if self._root is not self:  # the shared LRU lists the store already: ours move to the recent end
            await self.resync()
            for name, _ in sorted(((n, b) for n, b in self._lru.items() if n.startswith(prefix)), key=key):
                self._lru.move_to_end(name)
            return
        self._lru.clear()
        self._lru.update(sorted(names.items(), key=key))
        self._dirty = False

    async def resync(self) -> tuple[int, int]:
        """Follow what another tab of the origin did to the shared store since this tier listed it: files gone
        (its evictions, a chat it deleted) leave the index, files new to this tier (its writes) join at the
        recent end in name order, as at open(). Returns (files gone, files new)."""
        names = await self.store.names()
        for name in self._indexes:  # the sharing tiers' index files
            names.pop(name, None)
        gone = [name for name in self._lru if name not in names]
        for name in gone:
            del self._lru[name]
        new = sorted(name for name in names if name not in self._lru)
        for name in new:
            self._lru[name] = names[name]
        if gone or new:
            self._dirty = True
        return len(gone), len(new)

    async def _saved_order(self, present: bool) -> dict[str, int]:
        """{chain hash: rank} from the index file; a damaged index is noted and ignored (name order)."""
        data = await self.store.read(self.index_name) if present else None
        if data is None:
            return {}
        try:
            hashes = data.decode("ascii").split()
        except UnicodeDecodeError:
            hashes = ["?"]
        if any(len(h) != 32 or h.strip("0123456789abcdef") for h in hashes):
            self._note(f"{self.index_name} is not a list of block hashes; the disk's LRU order is lost")
            return {}
        return {h: i for i, h in enumerate(hashes)}

    async def flush(self, force: bool = False) -> None:
        """Write the LRU order to the index file if it changed and `index_interval_s` passed since the last
        write (or `force`); a full store leaves a note (the order is then lost on a reload, nothing else)."""
        if not self._dirty or (not force and self._clock() < self._index_due):
            return
        self._index_due = self._clock() + self.index_interval_s
        prefix = self.key.hex + "-"
        order = "".join(name[len(prefix):] + "\n" for name in self._lru if name.startswith(prefix))
        try:
            await self.store.write(self.index_name, order.encode("ascii"))
        except OSError as err:  # StoreFull, or the file went as it was written
            if not self._order_unsaved:  # once, not at every step while the store stays full
                self._note(f"the disk's LRU order was not saved ({err})")
            self._order_unsaved = True
            return  # still dirty: the next flush tries again
        self._dirty = self._order_unsaved = False
        self.num_index_writes += 1

    # -- queries -------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """Block files of this layout in the store."""
        prefix = self.key.hex + "-"
        return sum(1 for name in self._lru if name.startswith(prefix))

    @property
    def num_bytes(self) -> int:
        """Bytes of every file in the store (all layouts)."""
        return sum(self._lru.values())

    def has(self, chain_hash: str) -> bool:
        return self.key.file_name(chain_hash) in self._lru

    def lru_names(self) -> list[str]:
        """File names, least recently used first."""
        return list(self._lru)

    def present_run(self, hashes: list[str], start: int = 0) -> int:
        """How many of hashes[start:] are stored, counting from `start` until the first missing one."""
        n = 0
        while start + n < len(hashes) and self.has(hashes[start + n]):
            n += 1
        return n

    def touch(self, hashes) -> None:
        """Mark blocks used now (from any tier): the recent end of the LRU."""
        for h in hashes:
            name = self.key.file_name(h)
            if name in self._lru:
                self._lru.move_to_end(name)
                self._dirty = True

    # -- reading -------------------------------------------------------------
    async def load(self, hashes: list[str], token_ids, start: int = 0) -> list[bytes]:
        """Payloads of blocks start, start+1, ... of `token_ids` (chain `hashes`), up to the first block that
        is missing or fails its checks; a failing file is deleted (it will be recomputed). Another tab's tier
        shares the store: a file it deleted since this tier listed the store leaves the index, uncounted."""
        bs = self.key.spec.block_size
        out: list[bytes] = []
        for i in range(start, len(hashes)):
            payload = await self.load_block(hashes[i], token_ids[i * bs:(i + 1) * bs])
            if payload is None:
                break
            out.append(payload)
        return out

    async def load_block(self, chain_hash: str, block_token_ids) -> bytes | None:
        """The payload of one block (its `block_token_ids`), None when it is missing or fails its checks (a
        failing file is deleted, as in load)."""
        name = self.key.file_name(chain_hash)
        if name not in self._lru:
            return None
        data = await self.store.read(name)
        if data is None:  # another tab of the app deleted it (its own budget): gone, not damaged
            self._lru.pop(name, None)
            self._dirty = True
            return None
        try:
            payload = decode_block(self.key, chain_hash, block_token_ids, data)
        except BlockFileError as err:
            self.num_corrupt += 1
            self._note(f"{name}: {err}; recomputing it")
            await self._remove(name)
            return None
        self._lru.move_to_end(name)
        self._dirty = True
        self.num_read += 1
        return payload

    # -- writing -------------------------------------------------------------
    async def save(self, chain_hash: str, token_ids, payload: bytes) -> bool:
        """Store a block unless it is stored already (dedup). Evicts LRU files to stay under the budget;
        a full store degrades (note, lower budget). True when the block is on disk afterwards."""
        return await self.save_many([(chain_hash, token_ids, payload)]) == 1

    async def save_many(self, blocks) -> int:
        """save() for each of `blocks` ((chain hash, token ids, payload) each, in order), their files written
        at once: one wait for all of them (OPFS answers each step of a write in its own round trip), after
        the LRU files evicted to make room for them together; as many at a time as the budget holds. Returns
        how many are on disk afterwards."""
        on_disk = 0
        todo: dict[str, tuple[str, bytes]] = {}  # file name -> (chain hash, its bytes), in order
        for chain_hash, token_ids, payload in blocks:
            name = self.key.file_name(chain_hash)
            if name in self._lru:
                self._lru.move_to_end(name)
                self._dirty = True
                on_disk += 1
            elif name not in todo:
                data = encode_block(self.key, chain_hash, token_ids, payload)
                if len(data) <= self.budget_bytes:
                    todo[name] = (chain_hash, data)
        names = list(todo)
        while names:
            batch, room = [], self.budget_bytes
            while names and len(todo[names[0]][1]) <= room:
                room -= len(todo[names[0]][1])
                batch.append(names.pop(0))
            if not batch:  # the budget fell below a file (a full store lowered it): the rest are not stored
                break
            async with self._writes:  # (uncontended, as in a step driven without an event loop: no loop needed)
                await self._evict_to(room)
                writes = [self._try_write(name, todo[name][1]) for name in batch]
                done = [await writes[0]] if len(writes) == 1 else await asyncio.gather(*writes)
                full = None
                for name, err in zip(batch, done):
                    if isinstance(err, StoreFull):
                        full = err
                    elif isinstance(err, OSError):  # the file went as it was written: recomputed after a reload
                        self._note(f"block {todo[name][0]} was not written ({err}); it is recomputed after a reload")
                    elif isinstance(err, BaseException):
                        raise err
                    else:
                        self._lru[name] = len(todo[name][1])
                        self._dirty = True
                        self.num_written += 1
                        on_disk += 1
                if full is not None:
                    self.budget_bytes = self.num_bytes
                    self._note(f"disk full ({full}); KV on disk capped at {self.budget_bytes:,} bytes, "
                               "the rest is recomputed after a reload")
        return on_disk

    async def _try_write(self, name: str, data: bytes) -> Exception | None:
        """Write `name`; the exception it raised, None when it was written."""
        try:
            await self.store.write(name, data)
        except Exception as err:
            return err
        return None

    def _note(self, text: str) -> None:
        self.notes = self.notes[-(MAX_NOTES - 1):] + [text]

    async def _evict_to(self, limit: int) -> None:
        while self._lru and self.num_bytes > limit:
            await self._remove(next(iter(self._lru)))

    async def _remove(self, name: str) -> None:
        await self.store.delete(name)
        self._lru.pop(name, None)
        self._dirty = True

    async def set_budget(self, budget_bytes: int) -> None:
        """A new disk budget (memory settings); evicts LRU files past it now."""
        if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be a non-negative int, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        await self._evict_to(budget_bytes)

    # -- owners ----------------------------------------------------------------
    def refer(self, owner: str, token_ids) -> None:
        """`owner` (a chat) references the blocks of its token history, every KV group's (replaces what it
        referenced)."""
        self._owners[owner] = {h for g in range(self.key.num_groups) for h in block_chain(self.key, token_ids, group=g)}

    def held_only_by(self, owner: str) -> set[str]:
        """The chain hashes `owner` references and no other owner does: what forget(owner) deletes."""
        others = set().union(*(hashes for o, hashes in self._owners.items() if o != owner))
        return self._owners.get(owner, set()) - others

    async def forget(self, owner: str) -> int:
        """Drop `owner`; delete the block files only it referenced. Returns how many were deleted."""
        mine = self.held_only_by(owner)
        self._owners.pop(owner, None)
        n = 0
        for h in sorted(mine):
            name = self.key.file_name(h)
            if name in self._lru:
                await self._remove(name)
                n += 1
        return n

    async def clear(self) -> int:
        """Delete every block file of this layout (the disk tier switched off). Returns how many."""
        prefix = self.key.hex + "-"
        mine = [name for name in self._lru if name.startswith(prefix)]
        for name in mine:
            await self._remove(name)
        await self.store.delete(self.index_name)
        self._dirty = False
        return len(mine)
