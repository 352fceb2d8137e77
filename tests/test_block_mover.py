"""The engine's one mover: every block move of a plan runs on the backend in the plan's order, and no module
but the mover (and the backends that implement them) calls the backend's block methods."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pagedkv.block_mover import BlockMover
from pagedkv.config import CacheConfig
from pagedkv.engine import run_sync
from pagedkv.kv.block_pool import BlockPool, CopyOp
from pagedkv.kv.manager import KVCacheManager
from pagedkv.kv.moves import BlockMoves, BlockRead, BlockWrite
from pagedkv.kv.retention import ShiftOp
from pagedkv.sequence import Sequence

PY = Path(__file__).resolve().parent.parent / "py" / "pagedkv"
BLOCK_METHODS = ("swap_out", "swap_in", "copy_blocks", "shift_keys", "read_blocks", "write_blocks")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        async def record(*args):
            self.calls.append((name, *args))
            return np.zeros((len(args[0]), 1, 2, 1, 4), np.uint32) if name == "read_blocks" else None
        return record


def test_a_plan_runs_outs_first_then_ins_copies_shifts_and_writes():
    backend = Recorder()
    words = np.ones((1, 1, 2, 1, 4), np.uint32)
    moves = BlockMoves(swap_out=[CopyOp(3, 0)], swap_in=[CopyOp(1, 3)], copies=[CopyOp(4, 5)],
                       shifts=[ShiftOp(5, 16)], writes=[BlockWrite([6], words)])
    run_sync(BlockMover(backend).run(moves))
    assert [c[0] for c in backend.calls] == ["swap_out", "swap_in", "copy_blocks", "shift_keys", "write_blocks"]
    assert backend.calls[0][1] == [CopyOp(3, 0)] and backend.calls[4][1] == [6]
    run_sync(BlockMover(backend).run(BlockMoves()))  # an empty plan calls nothing
    assert len(backend.calls) == 5 and not BlockMoves()
    assert run_sync(BlockMover(backend).read(BlockRead([2, 7], [("a", []), ("b", [])]))).shape[0] == 2
    assert backend.calls[-1] == ("read_blocks", [2, 7])


def test_only_the_mover_calls_the_backends_block_methods():
    # The KV hierarchy plans; backends implement the methods (and call their own pools).
    call = re.compile(r"\b(backend|b)\.(%s)\(" % "|".join(BLOCK_METHODS))
    callers = sorted(str(f.relative_to(PY)) for f in PY.rglob("*.py")
                     if call.search(f.read_text()) and "backends" not in f.parts)
    assert callers == ["block_mover.py"]


def test_a_shared_pool_cannot_demote_into_one_models_cpu_tier():
    pool = BlockPool(4)
    with pytest.raises(ValueError, match="a shared GPU pool cannot demote"):
        KVCacheManager(CacheConfig(num_blocks=4, num_cpu_blocks=2, demote_to_cpu=True), pool=pool)
    with pytest.raises(ValueError, match="demote_to_cpu must be a bool"):
        CacheConfig(num_blocks=4, demote_to_cpu=1)
    # Without the flag the CPU pool only holds swapped-out sequences: a GPU eviction copies nothing.
    kv = KVCacheManager(CacheConfig(num_blocks=2, block_size=8, num_cpu_blocks=2), namespace="m")
    for base in (0, 100):  # the second chat evicts the first's two cached blocks
        seq = Sequence(list(range(base, base + 16)))
        kv.allocate_slots(seq, 16)
        kv.mark_computed(seq, 16)
        kv.free(seq)
    assert kv.take_demotions() == [] and kv.cpu.num_demoted == 0
