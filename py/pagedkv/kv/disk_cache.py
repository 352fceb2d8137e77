"""The disk tier's side of a step: which prefixes to load before it, which full blocks to store after it.

Restore: a waiting sequence without blocks whose prefix misses the GPU prefix cache past block k loads the
blocks k, k+1, ... that the disk holds (the tier's own file reads), gives them fresh GPU blocks registered as
cached prefix blocks (KVCacheManager.adopt_blocks) and returns the write of their K/V there (a BlockWrite,
after the demotions those GPU blocks caused); the scheduler's allocate_slots then finds them as ordinary
prefix hits, so the sequence prefills only the rest. The CPU tier is looked up before this (tiers.py), so disk
loads start after the blocks it held.

Write-behind: after a forward, blocks that became full and computed are planned for one read back (a
BlockRead, which the engine's mover runs) and stored unless the disk holds them already; a step reads back
only when a block fills, and never for a block that is on disk (a restored or shared prefix).

Flush: every full block the GPU holds computed, of a chat's history (refer) or a live sequence, that the disk
lacks (a write that failed, a file another tab of the origin deleted: the tier lists the store again first) is
planned for one read back, the same BlockRead as write-behind's; the page asks for it when it is hidden or left.

Nothing here calls a backend: the plans go to the engine's mover (block_mover.py).
"""
from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from .block_files import DiskKey, block_chain, block_payloads, block_words
from .disk_tier import DiskTier
from .moves import BlockMoves, BlockRead, BlockWrite
from .spec import KVSpec

__all__ = ["DiskCache"]


class DiskCache:
    """The engine's view of one opened DiskTier (see the module docstring)."""

    def __init__(self, tier: DiskTier) -> None:
        self.tier = tier
        self.key = tier.key
        self._saved: dict[int, int] = {}  # seq id -> full blocks already handled by write-behind
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
            hashes = block_chain(self.key, seq.token_ids, usable)
            start = kv.lookup_prefix(seq.token_ids[:usable * bs])[0] // bs
            self.tier.touch(hashes[:start])  # a GPU hit counts as a use for the disk's LRU too
            run = min(self.tier.present_run(hashes, start), kv.pool.num_available)
            if not run:
                continue
            payloads = await self.tier.load(hashes[:start + run], seq.token_ids, start)
            ids = kv.adopt_blocks(seq.token_ids[:(start + len(payloads)) * bs], start, len(payloads))
            if ids:
                # The adopted GPU blocks may have held demoted blocks: those copies run before the write.
                moves = BlockMoves(swap_out=kv.take_demotions(),
                                   writes=[BlockWrite(ids, block_words(self.key, payloads[:len(ids)]))])
                self.last_restored_tokens = len(ids) * bs
                self.restored_tokens += len(ids) * bs
                yield len(ids) * bs, moves
        await self.tier.flush()  # a GPU hit or a load moved blocks in the disk's LRU

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
            hashes = block_chain(self.key, seq.token_ids, full)
            for i in range(done, full):
                if self.tier.has(hashes[i]):
                    self.tier.touch(hashes[i:i + 1])
                elif hashes[i] not in queued:
                    queued.add(hashes[i])
                    block_ids.append(seq.block_table[i])
                    keys.append((hashes[i], seq.token_ids[i * bs:(i + 1) * bs]))
            self._saved[seq.seq_id] = full
        self._saved = {sid: n for sid, n in self._saved.items() if sid in kv.live}
        return BlockRead(block_ids, keys) if block_ids else None

    def refer(self, owner: str, token_ids) -> None:
        """`owner` (a chat) holds the history `token_ids`: its block files are kept, and a flush writes its
        blocks the GPU holds."""
        self._histories[owner] = tuple(token_ids)
        self.tier.refer(owner, token_ids)

    async def forget(self, owner: str) -> int:
        """Drop `owner`; delete the block files only it referenced. Returns how many were deleted."""
        self._histories.pop(owner, None)
        return await self.tier.forget(owner)

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
            _, cached = kv.lookup_prefix(ids)
            for i, (h, block_id) in enumerate(zip(block_chain(self.key, ids, len(cached)), cached)):
                if not self.tier.has(h) and h not in queued:
                    queued.add(h)
                    block_ids.append(block_id)
                    keys.append((h, list(ids[i * bs:(i + 1) * bs])))
        return BlockRead(block_ids, keys) if block_ids else None

    async def store(self, plan: BlockRead | None, words: np.ndarray | None) -> int:
        """Store the blocks `plan` read back (`words`, as Backend.read_blocks returns them); returns how many
        files it wrote. Writes the LRU index when it is due, also with nothing to store."""
        written = 0
        if plan is not None:
            for (h, tokens), payload in zip(plan.keys, block_payloads(words)):
                written += int(await self.tier.save(h, tokens, payload))
        await self.tier.flush()
        return written

    def stats(self) -> dict:
        """Plain data for the memory panel."""
        return {"disk_blocks": self.tier.num_blocks, "disk_bytes": self.tier.num_bytes,
                "disk_budget_bytes": self.tier.budget_bytes, "last_disk_restored_tokens": self.last_restored_tokens,
                "disk_corrupt_blocks": self.tier.num_corrupt, "disk_index_writes": self.tier.num_index_writes,
                "disk_notes": list(self.tier.notes)}
