"""Block moves: what the KV hierarchy hands the engine's mover, in the order it must run.

The pool, the manager and the tiers decide what moves between GPU blocks, CPU blocks and disk; they never
touch a backend. They return a BlockMoves, and the engine's one mover (block_mover.py) runs it on the backend.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .block_pool import CopyOp
from .retention import ShiftOp

__all__ = ["BlockWrite", "BlockMoves", "BlockRead"]


@dataclass(frozen=True)
class BlockWrite:
    """Whole GPU blocks filled from host data (the disk tier's loads)."""
    block_ids: list[int]
    words: np.ndarray  # (n, layers, 2 (K, V), block_size, token_u32s) u32, in the GPU layout of the KV dtype


@dataclass(frozen=True)
class BlockRead:
    """Whole GPU blocks read back for the disk tier (write-behind); `keys` says what each block is to the tier."""
    block_ids: list[int]
    keys: list  # one per block: the tier's (chain hash, token ids)


@dataclass
class BlockMoves:
    """Moves to run, in field order: first copy out what is about to be reused, then fill blocks."""
    swap_out: list[CopyOp] = field(default_factory=list)  # (gpu, cpu): preemption and demotion
    swap_in: list[CopyOp] = field(default_factory=list)   # (cpu, gpu): swap-in and promotion
    copies: list[CopyOp] = field(default_factory=list)    # (gpu, gpu): copy-on-write
    shifts: list[ShiftOp] = field(default_factory=list)   # key re-rotations, after the copies
    writes: list[BlockWrite] = field(default_factory=list)  # host -> gpu (disk loads)

    def __bool__(self) -> bool:
        return bool(self.swap_out or self.swap_in or self.copies or self.shifts or self.writes)
