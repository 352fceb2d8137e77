"""The baseline: static contiguous KV reservation, with the KV cache manager's interface.

Each sequence reserves `max_context` token slots up front as one contiguous
range of a fixed arena (first fit). Outgrowing the reservation reallocates:
in place if the hole right after the range is big enough, otherwise a new
range of double the size is found and the live tokens are copied (a
CopyRange op for the backend), then the old range is released. Allocation
fails when no single hole is big enough, even if the holes together would
be: that is the external fragmentation paging removes. There is no prefix
sharing: lookup_prefix always misses and fork copies.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

from .block_pool import OutOfBlocks
from .accounting import KVStats
from .manager import DoubleFree, NeverFits, SequenceFreed
from ..sequence import Sequence, SequenceStatus, append_then_allocate


class ContiguousOOM(OutOfBlocks):
    """No hole of the arena is large enough for the requested range."""


class CopyRange(NamedTuple):
    """Copy `length` token slots from slot `src` to slot `dst` (ranges of two arenas/pools)."""
    src: int
    dst: int
    length: int


class Arena:
    """First-fit allocator of contiguous slot ranges; holes kept sorted and merged."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.holes: list[list[int]] = [[0, num_slots]] if num_slots else []  # [start, length]

    @property
    def free_slots(self) -> int:
        return sum(h[1] for h in self.holes)

    @property
    def largest_hole(self) -> int:
        return max((h[1] for h in self.holes), default=0)

    def find(self, n: int) -> int | None:
        """Start of the first hole holding `n` slots, or None."""
        for start, length in self.holes:
            if length >= n:
                return start
        return None

    def take(self, start: int, n: int) -> None:
        i = bisect.bisect_right(self.holes, [start, self.num_slots + 1]) - 1
        hole = self.holes[i]
        if not (hole[0] <= start and start + n <= hole[0] + hole[1]):
            raise AssertionError(f"range [{start}, {start + n}) is not free")
        before, after = start - hole[0], hole[0] + hole[1] - (start + n)
        pieces = ([[hole[0], before]] if before else []) + ([[start + n, after]] if after else [])
        self.holes[i:i + 1] = pieces

    def release(self, start: int, n: int) -> None:
        i = bisect.bisect_left(self.holes, [start, 0])
        self.holes.insert(i, [start, n])
        if i + 1 < len(self.holes) and start + n == self.holes[i + 1][0]:
            self.holes[i][1] += self.holes.pop(i + 1)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:
            self.holes[i - 1][1] += self.holes.pop(i)[1]

    def hole_after(self, end: int) -> int:
        """Length of the hole starting exactly at slot `end` (0 if none)."""
        i = bisect.bisect_left(self.holes, [end, 0])
        return self.holes[i][1] if i < len(self.holes) and self.holes[i][0] == end else 0


class ContiguousAllocator:
    """Static max-length reservation over an arena of `num_slots` token slots."""

    def __init__(self, num_slots: int, max_context: int, num_cpu_slots: int = 0) -> None:
        for name, v, lo in (("num_slots", num_slots, 1), ("max_context", max_context, 1),
                            ("num_cpu_slots", num_cpu_slots, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if max_context > num_slots:
            raise ValueError(f"max_context {max_context} exceeds the arena ({num_slots} slots)")
        self.arena = Arena(num_slots)
        self.cpu_arena = Arena(num_cpu_slots)
        self.max_context = max_context
        self.ranges: dict[int, tuple[int, int]] = {}     # seq id -> (start, capacity)
        self.live: dict[int, Sequence] = {}
        self.pending: dict[int, list[CopyRange]] = {}    # fork copies, reported on next growth
        self.num_copied_tokens = 0

    # -- interface shared with KVCacheManager --------------------------------
    def lookup_prefix(self, token_ids) -> tuple[int, list[int]]:
        """No prefix cache in the baseline: always (0, [])."""
        return 0, []

    def get_block_ids(self, seq: Sequence) -> list[int]:
        """[start slot] of the sequence's one range (empty if it has none)."""
        return [self.ranges[seq.seq_id][0]] if seq.seq_id in self.ranges else []

    def _plan(self, seq: Sequence, num_new_tokens: int):
        if seq.status is SequenceStatus.FINISHED:
            raise SequenceFreed(f"cannot allocate slots for sequence {seq.seq_id}: it was freed")
        if seq.status is SequenceStatus.SWAPPED:
            raise ValueError(f"sequence {seq.seq_id} is swapped out; swap_in first")
        if not isinstance(num_new_tokens, int) or num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be a non-negative int, got {num_new_tokens!r}")
        end = seq.num_kv_tokens + num_new_tokens
        if end > seq.num_tokens:
            raise ValueError(f"sequence {seq.seq_id} has {seq.num_tokens} token ids; append the "
                             f"token ids before allocating slots up to {end}")
        if end > self.arena.num_slots:
            raise NeverFits(f"sequence {seq.seq_id} needs {end} contiguous slots; the arena "
                            f"only has {self.arena.num_slots}")
        if seq.seq_id not in self.ranges:
            cap = max(self.max_context, end)
            return ("new", self.arena.find(cap), cap)
        start, cap = self.ranges[seq.seq_id]
        if end <= cap:
            return ("fits", start, cap)
        new_cap = min(max(2 * cap, end), self.arena.num_slots)
        if self.arena.hole_after(start + cap) >= new_cap - cap:
            return ("extend", start, new_cap)
        return ("move", self.arena.find(new_cap), new_cap)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether allocate_slots(seq, num_new_tokens) would succeed now."""
        try:
            kind, start, _ = self._plan(seq, num_new_tokens)
        except NeverFits:
            return False
        return start is not None

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> list[CopyRange]:
        """Give slots to the next `num_new_tokens` token ids; returns realloc copies.
        Raises ContiguousOOM (state unchanged) when no hole is large enough."""
        kind, start, cap = self._plan(seq, num_new_tokens)
        if start is None:
            raise ContiguousOOM(
                f"sequence {seq.seq_id} needs {cap} contiguous slots; largest hole is "
                f"{self.arena.largest_hole} of {self.arena.free_slots} free")
        ops = self.pending.pop(seq.seq_id, [])
        if kind == "new":
            self.arena.take(start, cap)
        elif kind == "extend":
            old_cap = self.ranges[seq.seq_id][1]
            self.arena.take(start + old_cap, cap - old_cap)
        elif kind == "move":
            old_start, old_cap = self.ranges[seq.seq_id]
            self.arena.take(start, cap)
            ops.append(CopyRange(old_start, start, seq.num_kv_tokens))
            self.num_copied_tokens += seq.num_kv_tokens
            self.arena.release(old_start, old_cap)
        self.ranges[seq.seq_id] = (start, cap)
        seq.num_kv_tokens += num_new_tokens
        seq.status = SequenceStatus.RUNNING
        self.live[seq.seq_id] = seq
        return ops

    def append_tokens(self, seq: Sequence, token_ids: list[int]) -> list[CopyRange]:
        """Append token ids and give them slots; token ids rolled back on failure."""
        if seq.status is SequenceStatus.FINISHED:
            raise SequenceFreed(f"cannot append to sequence {seq.seq_id}: it was freed")
        return append_then_allocate(seq, token_ids, self.allocate_slots)

    def fork(self, seq: Sequence, session: str | None = None) -> Sequence:
        """A child with its own copy of the range (no sharing in the baseline); the copy
        is returned by the child's next allocate_slots call."""
        if seq.status is not SequenceStatus.RUNNING:
            raise SequenceFreed(f"cannot fork sequence {seq.seq_id}: it is {seq.status.value}")
        start, cap = self.ranges[seq.seq_id]
        dst = self.arena.find(cap)
        if dst is None:
            raise ContiguousOOM(f"fork needs {cap} contiguous slots; largest hole is "
                                f"{self.arena.largest_hole}")
        child = Sequence(seq.token_ids, session=seq.session if session is None else session)
        self.arena.take(dst, cap)
        child.num_kv_tokens, child.num_computed_tokens = seq.num_kv_tokens, seq.num_computed_tokens
        child.status = SequenceStatus.RUNNING
        self.ranges[child.seq_id] = (dst, cap)
        self.live[child.seq_id] = child
        self.pending[child.seq_id] = [CopyRange(start, dst, seq.num_kv_tokens)]
        return child

    def free(self, seq: Sequence) -> None:
        """Release the sequence's range."""
        if seq.status is SequenceStatus.FINISHED:
            raise DoubleFree(f"sequence {seq.seq_id} was already freed")
        if seq.seq_id in self.ranges:
            start, cap = self.ranges.pop(seq.seq_id)
            arena = self.cpu_arena if seq.status is SequenceStatus.SWAPPED else self.arena
            arena.release(start, cap)
        self.live.pop(seq.seq_id, None)
        self.pending.pop(seq.seq_id, None)
        seq.num_kv_tokens = seq.num_computed_tokens = 0
        seq.status = SequenceStatus.FINISHED

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll back to `num_tokens` tokens; the reservation is kept (it is static)."""
        if seq.status is not SequenceStatus.RUNNING:
            raise ValueError(f"cannot truncate sequence {seq.seq_id}: it is {seq.status.value}")
        if not isinstance(num_tokens, int) or not 0 <= num_tokens <= seq.num_tokens:
            raise ValueError(f"num_tokens must be in [0, {seq.num_tokens}], got {num_tokens!r}")
        del seq.token_ids[num_tokens:]
        seq.num_kv_tokens = min(seq.num_kv_tokens, num_tokens)
        seq.num_computed_tokens = min(seq.num_computed_tokens, num_tokens)

    def swap_out(self, seq: Sequence) -> list[CopyRange]:
        """Move the whole reservation to the CPU arena (GPU range -> CPU range)."""
        return self._swap(seq, SequenceStatus.RUNNING, self.arena, self.cpu_arena,
                          SequenceStatus.SWAPPED)

    def swap_in(self, seq: Sequence) -> list[CopyRange]:
        """Bring the reservation back into a GPU hole (CPU range -> GPU range)."""
        return self._swap(seq, SequenceStatus.SWAPPED, self.cpu_arena, self.arena,
                          SequenceStatus.RUNNING)

    def _swap(self, seq, need, src_arena, dst_arena, then) -> list[CopyRange]:
        if seq.status is not need:
            raise ValueError(f"sequence {seq.seq_id} is {seq.status.value}, needs {need.value}")
        start, cap = self.ranges[seq.seq_id]
        dst = dst_arena.find(cap)
        if dst is None:
            raise ContiguousOOM(f"swap needs {cap} contiguous slots; largest hole is "
                                f"{dst_arena.largest_hole}")
        dst_arena.take(dst, cap)
        src_arena.release(start, cap)
        self.ranges[seq.seq_id] = (dst, cap)
        seq.status = then
        return [CopyRange(start, dst, seq.num_kv_tokens)]

    def stats(self) -> KVStats:
        """Same metrics as kv_stats(), with one-slot "blocks": used = reserved slots."""
        reserved = sum(cap for sid, (_, cap) in self.ranges.items()
                       if self.live[sid].status is SequenceStatus.RUNNING)
        stored = sum(s.num_kv_tokens for s in self.live.values()
                     if s.status is SequenceStatus.RUNNING)
        per_session: dict[str, int] = {}
        for sid, (_, cap) in self.ranges.items():
            s = self.live[sid]
            if s.status is SequenceStatus.RUNNING:
                per_session[s.session] = per_session.get(s.session, 0) + cap
        total = self.arena.num_slots
        return KVStats(total_blocks=total, used_blocks=reserved, free_blocks=total - reserved,
                       cached_blocks=0, utilization=reserved / total,
                       slot_efficiency=stored / reserved if reserved else 1.0,
                       sharing_factor=1.0, logical_tokens=stored, physical_tokens=stored,
                       per_session_blocks=dict(sorted(per_session.items())))
