"""The disk tier's side of a step: which prefixes to load before it, which full blocks to store after it.

Restore: a waiting sequence without blocks whose prefix misses the GPU prefix cache past block k loads the
blocks k, k+1, ... that the disk holds (the tier's own file reads), gives them fresh GPU blocks registered as
cached prefix blocks (KVCacheManager.adopt_blocks) and returns the write of their K/V there (a BlockWrite,
after the demotions those GPU blocks caused); the scheduler's allocate_slots then finds them as ordinary
prefix hits, so the sequence prefills only the rest. The CPU tier is looked up before this (tiers.py), so disk
loads start after the blocks it held.

Write-behind: after a forward, blocks that became full and computed are planned for one read back (a
BlockRead, which the engine's mover runs) and stored unless the disk holds them already; a step reads back
only when a block fills, and never for a block that is on disk (a restored or shared prefix). In the step by
default; with `background=True` (the page) the read-back payloads queue instead and a writer task stores
them, WRITE_BATCH files at once: all of them once the engine is idle (its last request ended:
`write_when_idle`), and once a reply has ended while others run, one batch in each step (`write_slice`: that
reply is on disk a few steps later, where it waited for the engine to be idle before, and a reload a moment
after its end found nothing). In the
tab, OPFS writes ~80-150 MB/s on this machine (a 737 KB f32 block of SmolLM2 ~5-12 ms, most of it the browser
copying and writing the bytes on another core the kernel threads use too), so the steps of a reply pay none of
it; the reply's blocks are on disk a moment after its turn ends (the page's flush when it is hidden or left
writes what is still queued). Past MAX_QUEUED_BYTES of queued payloads (a long prompt, replies that never
leave the engine idle) a step writes the oldest itself, down to the bound; a flush or a forget writes the queue
first; an error the writer raises comes out of the next step.

Flush: every full block the GPU holds computed, of a chat's history (refer) or a live sequence, that the disk
lacks (a write that failed, a file another tab of the origin deleted: the tier lists the store again first) is
planned for one read back, the same BlockRead as write-behind's; the page asks for it when it is hidden or left.

Nothing here calls a backend: the plans go to the engine's mover (block_mover.py).
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

import numpy as np

from .block_files import DiskKey, block_chain, block_payloads, block_words
from .disk_tier import DiskTier
from .groups import first_needed_block
from .moves import BlockMoves, BlockRead, BlockWrite
from .spec import KVSpec

__all__ = ["DiskCache"]

WRITE_BATCH = 4  # block files the background writer writes at once
MAX_QUEUED_BYTES = 64 << 20  # payloads queued for the background writer past which a step writes the oldest


class DiskCache:
    """The engine's view of one opened DiskTier (see the module docstring)."""

    def __init__(self, tier: DiskTier, background: bool = False, on_written=None) -> None:
        """background: write-behind queued for a writer task that runs when the engine is idle (module
        docstring); on_written(n): n block files the writer stored (its steps' counter)."""
        self.tier = tier
        self.key = tier.key
        self.background = background
        self.on_written = on_written or (lambda n: None)
        self._queue: deque[tuple[str, list[int], bytes]] = deque()  # (chain hash, token ids, payload)
        self._queued_bytes = 0
        self._writer: asyncio.Task | None = None
        self._saved: dict[int, int] = {}  # seq id -> full blocks already handled by write-behind
        self._ended = False  # a sequence with queued blocks left the engine: write_slice writes the queue
        self._planned_by: dict[str, int] = {}  # chain hash of a block planned or queued -> its sequence's id
        self._histories: dict[str, tuple[int, ...]] = {}  # owner (a chat) -> its token history, for flushes
        self.restored_tokens = 0
        self.last_restored_tokens = 0

    def holds(self, spec: KVSpec) -> bool:
        """Whether the tier's files hold KV of `spec` (dtype, block size, layers, heads)."""
        return self.key == DiskKey(self.key.model_hash, spec)

    def check_spec(self, spec: KVSpec, who: str) -> None:
        """ValueError unless the tier's files hold KV of `spec` (`who` names its holder in the message)."""
        if not self.holds(spec):
            raise ValueError(f"the disk tier holds {self.key} but the {who} KV is {DiskKey(self.key.model_hash, spec)}")

    async def restores(self, kv, requests) -> AsyncIterator[tuple[int, BlockMoves]]:
        """For each of `requests` (waiting, no blocks, not looked up since their last token: KVTiers picks
        them) whose prefix the disk holds past the GPU cache: (tokens restored, the moves that put them on the
        GPU). The caller runs each yield's moves before the next request is looked at: a later request's
        blocks may evict these."""
        bs = self.key.spec.block_size
        for req in requests:
            seq = req.seq
            self.last_restored_tokens = 0  # "restored from disk" tells about the newest request looked up
            usable = (seq.num_tokens - 1) // bs  # leave one token to compute: the model needs its logits
            prefix = seq.token_ids[:usable * bs]
            hashes = [block_chain(self.key, prefix, usable, group=g) for g in range(self.key.num_groups)]
            start = kv.lookup_prefix(prefix)[0] // bs
            # A GPU hit counts as a use for the disk's LRU too (the blocks each group's hit holds).
            self.tier.touch(h for g, w in enumerate(kv.windows)
                            for h in hashes[g][first_needed_block(w, start * bs, bs):start])
            loaded: dict[tuple[int, int], bytes] = {}
            while True:  # a file that fails its checks is deleted: plan again without it (each pass loses one)
                hit = kv.tier_hit(prefix, lambda g, i: (g, i) in loaded or self.tier.has(hashes[g][i]))
                for g, i in hit.blocks:
                    if (g, i) not in loaded:
                        payload = await self.tier.load_block(hashes[g][i], prefix[i * bs:(i + 1) * bs])
                        if payload is None:
                            break
                        loaded[g, i] = payload
                else:
                    break
            ids = kv.adopt_hit(prefix, hit)
            if ids:
                # The adopted GPU blocks may have held demoted blocks: those copies run before the write.
                payloads = [loaded[b] for b in hit.blocks]
                moves = BlockMoves(swap_out=kv.take_demotions(), writes=[BlockWrite(ids, block_words(self.key, payloads))])
                tokens = (hit.num_blocks - hit.start) * bs
                self.last_restored_tokens = tokens
                self.restored_tokens += tokens
                yield tokens, moves
        await self.tier.flush()  # a GPU hit or a load moved blocks in the disk's LRU

    def holder(self, prefix) -> Callable[[int, int], bool]:
        """held(group, table index) for KVCacheManager.tier_hit: whether the tier has that block of `prefix`
        (its full blocks) on disk now. Reads nothing."""
        n = len(prefix) // self.key.spec.block_size
        hashes = [block_chain(self.key, prefix, n, group=g) for g in range(self.key.num_groups)]
        return lambda g, i: self.tier.has(hashes[g][i])

    def plan_store(self, kv, seqs) -> BlockRead | None:
        """The newly full, computed blocks of `seqs` that the disk lacks, to read back (None: nothing new)."""
        bs = self.key.spec.block_size
        block_ids: list[int] = []
        keys: list[tuple[str, list[int]]] = []  # (chain hash, token ids) per block
        queued: set[str] = set()  # two live sequences with one prefix fill the same hash: stored once
        for seq in seqs:
            full = seq.num_computed_tokens // bs
            done = self._saved.get(seq.seq_id, 0)
            # After a sliding-window eviction the K/V is no longer that prefix's: never stored.
            if seq.num_evicted_tokens or full <= done:
                continue
            for g, table in enumerate(seq.block_tables):  # every KV group's page (one group without groups)
                hashes = block_chain(self.key, seq.token_ids, full, group=g)
                for i in range(done, full):
                    if self.tier.has(hashes[i]):
                        self.tier.touch(hashes[i:i + 1])
                    elif hashes[i] not in queued and table[i] != kv.null_block:  # a window's: while it is held
                        queued.add(hashes[i])
                        block_ids.append(table[i])
                        keys.append((hashes[i], seq.token_ids[i * bs:(i + 1) * bs]))
                        self._planned_by[hashes[i]] = seq.seq_id
            self._saved[seq.seq_id] = full
        if any(sid not in kv.live for sid in self._saved):
            self._ended = True  # a reply ended (or was aborted) while others run: its blocks go out now
        self._saved = {sid: n for sid, n in self._saved.items() if sid in kv.live}
        return BlockRead(block_ids, keys) if block_ids else None

    def refer(self, owner: str, token_ids) -> None:
        """`owner` (a chat) holds the history `token_ids`: its block files are kept, and a flush writes its
        blocks the GPU holds."""
        self._histories[owner] = tuple(token_ids)
        self.tier.refer(owner, token_ids)

    async def forget(self, owner: str) -> int:
        """Drop `owner` (a deleted chat): its queued blocks that no other owner references are dropped
        unwritten, and the block files only it referenced deleted. Returns how many blocks went (both)."""
        self._histories.pop(owner, None)
        gone = self.tier.held_only_by(owner)
        kept = [b for b in self._queue if b[0] not in gone]
        dropped = len(self._queue) - len(kept)
        self._queued_bytes -= sum(len(b[2]) for b in self._queue if b[0] in gone)
        self._queue.clear()
        self._queue.extend(kept)
        await self.settle()  # a batch the writer has begun may hold some: they land before their files go
        return dropped + await self.tier.forget(owner)

    def plan_flush(self, kv) -> BlockRead | None:
        """Every full block of the chats' histories and the live sequences that the GPU prefix cache holds
        computed and the disk lacks, to read back (None: nothing). Call it between steps: a block is findable
        in the prefix cache from the step that computes it on."""
        bs = self.key.spec.block_size
        histories = list(self._histories.values())
        # After a sliding-window eviction the K/V is no longer that prefix's: never stored (as in plan_store).
        histories += [seq.token_ids[:seq.num_computed_tokens] for seq in kv.live.values()
                      if not seq.num_evicted_tokens]
        block_ids: list[int] = []
        keys: list[tuple[str, list[int]]] = []
        queued: set[str] = set()
        for ids in histories:
            for g, cached in enumerate(kv.cached_tables(ids)):  # a window group's: its window at the hit's end
                for i, (h, block_id) in enumerate(zip(block_chain(self.key, ids, len(cached), group=g), cached)):
                    if not self.tier.has(h) and h not in queued and block_id != kv.null_block:
                        queued.add(h)
                        block_ids.append(block_id)
                        keys.append((h, list(ids[i * bs:(i + 1) * bs])))
        return BlockRead(block_ids, keys) if block_ids else None

    async def store(self, plan: BlockRead | None, words: np.ndarray | None, now: bool = False) -> int:
        """Store the blocks `plan` read back (`words`, as Backend.read_blocks returns them): in this call, or
        with `background` (and not `now`) queued for the writer (past MAX_QUEUED_BYTES the oldest written
        here). Returns how many files this call wrote (the writer's go to on_written). Writes the LRU index
        when it is due, also with nothing to store."""
        self._raise_writer_error()
        blocks = [(h, tokens, payload) for (h, tokens), payload in zip(plan.keys, block_payloads(words))] \
            if plan is not None else []
        if self.background and not now:
            self._queue.extend(blocks)
            self._queued_bytes += sum(len(b[2]) for b in blocks)
            written = 0
            while self._queued_bytes > MAX_QUEUED_BYTES:  # the engine is not idle soon enough: the oldest now
                if self._writer is not None and not self._writer.done():
                    await self.settle()
                    self._raise_writer_error()
                    continue
                batch = []
                while self._queued_bytes > MAX_QUEUED_BYTES and len(batch) < WRITE_BATCH:
                    batch.append(self._queue.popleft())
                    self._queued_bytes -= len(batch[-1][2])
                saved = await self.tier.save_many(batch)
                written += saved
            return written
        await self.drain()  # `now` (a flush): what is queued first, so nothing is written twice
        written = 0
        for h, tokens, payload in blocks:
            written += int(await self.tier.save(h, tokens, payload))
        await self.tier.flush()
        return written

    @property
    def writing(self) -> bool:
        """Whether blocks wait for the background writer or it is writing them."""
        return bool(self._queue) or (self._writer is not None and not self._writer.done())

    def write_when_idle(self) -> bool:
        """The engine is idle: the writer stores what is queued, then the LRU order. False with nothing queued
        (and no writer running)."""
        if self._queue and (self._writer is None or self._writer.done()):
            self._raise_writer_error()
            self._writer = asyncio.ensure_future(self._write_queue())
        return self.writing

    async def write_slice(self, live) -> int:
        """A step ended and requests still run (`live`: their sequences by id): once a reply has ended, this step
        stores one batch of what is queued (WRITE_BATCH files at once: the ended replies' blocks first, then the
        oldest), until the queue is empty; returns the files written.
        So a reply that ended while another chat streams is on disk a few steps later, not when the engine is
        next idle, and a step pays at most one batch's writes; while no reply has ended the steps pay for none
        (the replies' blocks wait for their ends). Nothing while the idle writer runs."""
        if not self._queue:
            self._ended = False
            self._planned_by.clear()
        if not self._ended or not self._queue or (self._writer is not None and not self._writer.done()):
            return 0
        self._raise_writer_error()
        ended = [b for b in self._queue if self._planned_by.get(b[0]) not in live][:WRITE_BATCH]
        first = {b[0] for b in ended}
        batch = ended + [b for b in self._queue if b[0] not in first][:WRITE_BATCH - len(ended)]
        chosen = {b[0] for b in batch}
        kept = [b for b in self._queue if b[0] not in chosen]
        self._queue.clear()
        self._queue.extend(kept)
        for h in chosen:
            self._planned_by.pop(h, None)
        try:
            landed = await self.tier.save_many(batch)
        finally:
            self._queued_bytes -= sum(len(b[2]) for b in batch)
        await self.tier.flush()  # the LRU order when it is due (a reload lists the files themselves)
        return landed

    async def drain(self) -> None:
        """Write everything queued now and wait for it; raises what the writer raised."""
        if self.write_when_idle():
            await self.settle()
        self._raise_writer_error()

    async def settle(self) -> None:
        """Until the writer has stored what it is writing (what is queued and not started waits for the
        engine to be idle); what it raised is left for the next step (_raise_writer_error)."""
        while self._writer is not None and not self._writer.done():
            try:
                await asyncio.shield(self._writer)  # a waiter cancelled leaves the writer running
            except asyncio.CancelledError:
                if not self._writer.cancelled():
                    raise
            except Exception:
                pass

    async def _write_queue(self) -> None:
        while self._queue:  # checked again after the index write: a block queued during it is not left behind
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(WRITE_BATCH, len(self._queue)))]
                try:
                    landed = await self.tier.save_many(batch)
                finally:
                    self._queued_bytes -= sum(len(b[2]) for b in batch)
                self.on_written(landed)
            await self.tier.flush(force=True)

    def _raise_writer_error(self) -> None:
        writer = self._writer
        if writer is not None and writer.done():
            self._writer = None
            if not writer.cancelled() and writer.exception() is not None:
                self._queue.clear()
                self._queued_bytes = 0
                raise writer.exception()

    def stats(self) -> dict:
        """Plain data for the memory panel."""
        return {"disk_blocks": self.tier.num_blocks, "disk_bytes": self.tier.num_bytes,
                "disk_budget_bytes": self.tier.budget_bytes, "last_disk_restored_tokens": self.last_restored_tokens,
                "disk_corrupt_blocks": self.tier.num_corrupt, "disk_index_writes": self.tier.num_index_writes,
                "disk_notes": list(self.tier.notes)}
