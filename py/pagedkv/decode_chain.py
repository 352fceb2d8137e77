"""A pipelined decode: step n + 1 is on the GPU before the host reads step n's token ids.

Without it the host's part of every token (Python under Pyodide, the crossing into JS, the read back) sits
between two GPU steps. When every request of a step draws its token on the device (greedy, or
Sampler.on_device with a backend that samples there) and nothing else waits to be scheduled, the lane
submits the step and at once the next one (Backend.submit): each sequence gets the KV slot of the token
still being drawn, under a placeholder id, its block kept out of the prefix cache until the id is known
(KVCacheManager.allocate_slots(register=False)), and the backend copies the drawn ids into the next step's
token ids on the GPU (feed). Only then does the lane wait for step n's ids, put each in its placeholder
and hand the tokens out, while the GPU runs step n + 1.

A request that stops on step n's token (EOS or a stop id) is seen one step late: step n + 1 ran for it in
vain, and the placeholder's slot is released (KVCacheManager.truncate), so the pool ends exactly where an
unpipelined engine leaves it; that step's token for it is dropped. A request whose token finishes it by
length is never chained. A new request waiting, a swapped one, a request the step budget left out, a beam,
a fork of n samples or a retention policy ends the chain: the step in flight is read, and the next one is
scheduled as usual. Greedy ids and seeded samples are the unpipelined engine's (the samplers' random
numbers are taken in the same order).
"""
from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass

from .kv.block_pool import OutOfBlocks
from .kv.moves import BlockMoves
from .model_runner import build_batch
from .request import Request
from .sequence import SequenceStatus

__all__ = ["DecodeChain", "InFlight"]

PLACEHOLDER = 0  # the token id a slot holds while its real id is drawn on the GPU (the feed overwrites it)


@dataclass
class InFlight:
    """A submitted step whose ids the host has not read yet."""

    scheduled: list[tuple[Request, int]]  # (request, tokens) in the step's row order
    landing: Awaitable  # Backend.submit's: the (S,) drawn ids, or a shaped step's DrawnTokens
    submit_s: float  # host seconds the submit took (forward_s counts them with the wait)
    marked: bool = False  # its rows' KV already counted as computed (the next step's batch needed it)


class DecodeChain:
    """The lane's pipelined decode (module docstring); `lane` is its lanes.ModelLane."""

    def __init__(self, lane) -> None:
        self.lane = lane
        self.placeholders: set[int] = set()  # id() of the requests whose last token id is a placeholder

    def allows(self, scheduled: list[tuple[Request, int]], greedy: bool, draws) -> bool:
        """Whether the step of `scheduled` (its ids drawn on the device: greedy or draws) may be followed by
        the next one before its ids are read."""
        lane = self.lane
        backend, sched = lane.backend, lane.scheduler
        if not (getattr(backend, "pipelines", False) and lane.config.pipeline_decode):
            return False
        if not (greedy or draws is not None) or sched.waiting or sched.swapped:
            return False
        if len(sched.running) != len(scheduled):  # the step budget left a running request out
            return False
        members = lane.groups.members
        for req, n in scheduled:
            m = members.get(req.request_id)
            seq = req.seq
            if m is None or seq.status is not SequenceStatus.RUNNING or req.retention is not None:
                return False
            if m.beam is not None or m.fork_params is not None:
                return False
            if not (m.sampler.argmax_only or (m.sampler.on_device and backend.samples_on_device)):
                return False
            if seq.num_computed_tokens + n != seq.num_tokens or len(req.output_ids) + 1 >= req.max_tokens:
                return False  # a prefill chunk draws nothing; this token finishes it by length
        return True

    async def submit_next(self, flight: InFlight) -> InFlight | None:
        """Give every sequence of `flight` the slot of the token it is drawing and submit the step that computes
        it, fed the drawn ids on the GPU; None (nothing changed) when the pool is short of a block. Called
        right after allows() said yes: no await between, so every row still runs here; the batch and the
        draws are made before the first await (a request aborted during one keeps its row, its output is
        dropped when the step lands)."""
        lane = self.lane
        rows = [req for req, _ in flight.scheduled]
        given: list[Request] = []
        moves = BlockMoves()
        try:
            for req in rows:
                req.seq.token_ids.append(PLACEHOLDER)
                given.append(req)
                moves.copies.extend(lane.kv.allocate_slots(req.seq, 1, register=False))
        except OutOfBlocks:  # the pool is short: read this step's ids first, then schedule as usual
            for req in given:
                self._release(req)
            moves.swap_out.extend(lane.kv.take_demotions())
            await lane.mover.run(moves)  # a copy-on-write already given stays the sequence's block
            return None
        self.placeholders.update(id(r) for r in rows)
        moves.swap_out.extend(lane.kv.take_demotions())  # cached blocks those allocations evicted
        if not flight.marked:
            for req, n in flight.scheduled:  # submitted: every later step reads their KV after it is written
                lane.kv.mark_computed(req.seq, n)
            flight.marked = True
        scheduled = [(r, 1) for r in rows]
        batch = build_batch(scheduled, lane.kv.block_size)
        members = lane.groups.members
        kw = {"greedy": True}
        if not all(members[r.request_id].sampler.argmax_only for r in rows):
            kw = lane.draw_kw([(r, members[r.request_id].sampler, True) for r in rows])
        await lane.mover.run(moves)
        t0 = time.perf_counter()
        landing = await lane.backend.submit(batch, feed=True, **kw)
        return InFlight(scheduled, landing, time.perf_counter() - t0)

    def is_placeholder(self, req: Request) -> bool:
        return id(req) in self.placeholders

    def resolve(self, req: Request, token: int, finished: bool) -> None:
        """The drawn id of `req`'s placeholder arrived: it takes its place (and the block it fills becomes
        findable), or, when it finishes the request, the slot the extra step computed is released and the id
        stays without one, as an unpipelined step leaves it."""
        self.placeholders.discard(id(req))
        seq = req.seq
        if finished:
            self.lane.kv.truncate(seq, seq.num_tokens - 1)
            seq.token_ids.append(token)
        else:
            seq.token_ids[-1] = token
            self.lane.kv.register_blocks(seq)
        req.output_ids.append(token)

    def drop(self, req: Request) -> None:
        """`req` was aborted or requeued with a placeholder pending: its history loses the placeholder."""
        if id(req) in self.placeholders:
            self.placeholders.discard(id(req))
            del req.seq.token_ids[-1]

    def _release(self, req: Request) -> None:
        seq = req.seq
        if seq.num_kv_tokens == seq.num_tokens:  # its slot was given
            self.lane.kv.truncate(seq, seq.num_tokens - 1)
        else:
            del seq.token_ids[-1]
