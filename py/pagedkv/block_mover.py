"""The engine's one executor of block moves: every copy between GPU blocks, CPU blocks and disk runs here.

The KV hierarchy (pool, manager, CPU and disk tiers) decides what moves and returns kv.moves.BlockMoves;
the scheduler's output carries the step's. BlockMover runs them on the backend in the order the plan fixes.
"""
from __future__ import annotations

import numpy as np

from .kv.moves import BlockMoves, BlockRead

__all__ = ["BlockMover"]


class BlockMover:
    """Runs BlockMoves and BlockReads on one backend."""

    def __init__(self, backend) -> None:
        self.backend = backend

    async def run(self, moves: BlockMoves) -> None:
        """Evicted and preempted blocks out first, then swap-ins, copy-on-write copies, key shifts, and loads."""
        b = self.backend
        if moves.swap_out:
            await b.swap_out(moves.swap_out)
        if moves.swap_in:
            await b.swap_in(moves.swap_in)
        if moves.copies:
            await b.copy_blocks(moves.copies)
        if moves.shifts:
            await b.shift_keys(moves.shifts)
        for write in moves.writes:
            await b.write_blocks(write.block_ids, write.words)

    async def read(self, plan: BlockRead) -> np.ndarray:
        """The blocks' words (n, layers, 2, block_size, token_u32s) u32, in one backend call."""
        return await self.backend.read_blocks(plan.block_ids)
