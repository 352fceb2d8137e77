"""The KV hierarchy's part of a step: GPU <- CPU <- disk before the schedule, GPU -> disk after the forward.

A waiting request's prefix that the GPU prefix cache lacks comes back from the CPU tier first
(KVCacheManager.promote_from_cpu), then from disk (disk_cache.DiskCache) for what follows. Each request's
moves are handed out as soon as they are decided, and the engine's mover runs them before the next request
is looked at: a later request's promotion may evict these blocks again. Plans only, as everywhere in kv/.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NamedTuple

from .disk_cache import DiskCache
from .manager import KVCacheManager
from .moves import BlockMoves

__all__ = ["Restore", "KVTiers"]


class Restore(NamedTuple):
    """Moves that bring `tokens` of one request's prefix back to the GPU from `tier` ("cpu" or "disk")."""
    tier: str
    tokens: int
    moves: BlockMoves


class KVTiers:
    """The restore side of the CPU and disk tiers over one manager (see the module docstring)."""

    def __init__(self, kv: KVCacheManager, disk: DiskCache | None = None) -> None:
        self.kv = kv
        self.disk = disk
        self._checked: dict[int, int] = {}  # seq id -> token count when its prefix was last looked up

    def _fresh(self, requests) -> list:
        """The requests without blocks whose prefix was not looked up since their last token (a request that
        keeps waiting is not looked up again every step)."""
        requests = list(requests)
        waiting = {req.seq.seq_id for req in requests}
        self._checked = {sid: n for sid, n in self._checked.items() if sid in waiting}
        fresh = [req for req in requests
                 if not req.seq.block_table and self._checked.get(req.seq.seq_id) != req.seq.num_tokens]
        for req in fresh:
            self._checked[req.seq.seq_id] = req.seq.num_tokens
        return fresh

    async def restores(self, requests) -> AsyncIterator[Restore]:
        """The moves that restore the prefixes of `requests` (waiting, no blocks) the GPU cache lacks, one
        request at a time: the CPU tier's for every request, then the disk's."""
        kv = self.kv
        fresh = self._fresh(requests)
        for req in fresh:
            seq = req.seq
            usable = (seq.num_tokens - 1) // kv.block_size  # leave one token to compute: the model needs logits
            prefix = seq.token_ids[:usable * kv.block_size]
            before = kv.lookup_prefix(prefix)[0] if kv.cpu is not None else 0
            ops = kv.promote_from_cpu(prefix)
            # The GPU blocks the promotion took may have held demoted blocks: their copies run first.
            moves = BlockMoves(swap_out=kv.take_demotions(), swap_in=ops)
            if moves:  # with KV groups a block of the hit is several pages (or none, a window's released one)
                yield Restore("cpu", kv.lookup_prefix(prefix)[0] - before if ops else 0, moves)
        if self.disk is not None:
            async for tokens, moves in self.disk.restores(kv, fresh):
                yield Restore("disk", tokens, moves)
