"""Policy only: which requests run this step, with how many tokens, and who is preempted.

One loop, no separate prefill and decode paths: every running request gets the
tokens it has not computed yet (1 when decoding, a chunk when prefilling), then
waiting requests get prefill chunks, all under one token budget, and the step
runs them in the same forward (a mixed batch). Prefix-cache hits skip tokens
already computed. When the pool cannot give a running request its slots, the
lowest-priority running request is preempted: swapped out to the CPU pool when
it is small (a copy is cheaper than recomputing it), freed and later recomputed
from its token history when it is large or the CPU pool is full. The GPU is
never asked for memory the pool does not have.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import SchedulerConfig
from .kv.block_pool import CopyOp, OutOfBlocks
from .kv.manager import KVCacheManager, NeverFits
from .kv.moves import BlockMoves
from .kv.retention import ShiftOp, evictable, window_chunk, window_drops
from .request import Request
from .sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    """What the engine must do this step, in this order: the block moves (kv.moves.BlockMoves: swap-outs and
    the CPU tier's demotions, swap-ins, copy-on-write copies, key shifts), then the forward."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens to compute)
    moves: BlockMoves = field(default_factory=BlockMoves)
    preempted: list[Request] = field(default_factory=list)

    @property
    def swap_out(self) -> list[CopyOp]:
        """(gpu block, cpu block) copies: preemptions, then demotions of the GPU blocks this step evicted."""
        return self.moves.swap_out

    @property
    def swap_in(self) -> list[CopyOp]:
        """(cpu block, gpu block) copies."""
        return self.moves.swap_in

    @property
    def copies(self) -> list[CopyOp]:
        """Copy-on-write (gpu block, gpu block) copies."""
        return self.moves.copies

    @property
    def shifts(self) -> list[ShiftOp]:
        """Key re-rotations, after the copies."""
        return self.moves.shifts

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    """Keeps the waiting / running / swapped queues and decides each step."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, peer_victim=None) -> None:
        self.config = config
        self.kv = kv
        # With a pool shared by several models: peer_victim(req) preempts (by recompute) a running request of
        # another model that ranks below req, and returns whether it found one (the engine's lanes.py).
        self.peer_victim = peer_victim
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.num_preemptions = {"swap": 0, "recompute": 0}
        self.num_evicted_blocks = 0  # by importance eviction (window drops not counted)

    # ---------------------------------------------------------------- queues

    def check_fits(self, request: Request) -> None:
        """Raise NeverFits if the request could not run even alone in an empty pool."""
        bs = self.kv.block_size
        if request.retention is not None:
            request.retention.check_block_size(bs)
        # Every KV group's blocks: a window group holds at most its window and a chunk (kv/groups.py); a request's
        # window bounds every table, and eviction needs room for its protected blocks and one chunk.
        needed = self.kv.blocks_needed(request.max_total_tokens, self.config.max_num_batched_tokens,
                                       request.retention)
        capacity = self.kv.pool.capacity  # a shared pool's pages less those models' weights hold
        if needed > capacity:
            raise NeverFits(
                f"request {request.request_id} needs up to {request.max_total_tokens:,} tokens "
                f"({request.num_prompt_tokens:,} prompt + {request.max_tokens:,} new) = {needed:,} blocks of "
                f"{bs}, but the KV pool only has {capacity:,} blocks "
                f"({capacity * bs:,} tokens); shorten the prompt, lower max tokens, or raise the budget")

    def add(self, request: Request) -> None:
        """Queue a new request (checked to fit the pool first)."""
        self.check_fits(request)
        self.waiting.append(request)

    def requeue(self, request: Request) -> None:
        """Queue a request that ran on another pool (now gone): it recomputes its whole token history."""
        request.seq = Sequence(list(request.seq.token_ids), session=request.seq.session)
        self.add(request)
        request.num_preemptions += 1  # its cached-prompt count stays the one measured on admission

    def fork(self, parent: Request, request_id: str, index: int) -> Request:
        """Queue a request continuing `parent`'s token history (a parallel sample or a beam). It shares the
        parent's blocks (ref counts up; the last partial block is copied on its first append) and runs
        from the next step on without a prefill. A parent preempted meanwhile cannot share: the fork
        waits and recomputes its history (the prefix cache still serves the full blocks it finds)."""
        src = parent.seq
        if src.status is SequenceStatus.RUNNING and src.num_computed_tokens == src.num_tokens:
            seq = self.kv.fork(src)
        else:
            seq = Sequence(src.token_ids, session=src.session)
        child = Request(request_id, seq, parent.num_prompt_tokens, parent.max_tokens, parent.priority,
                        arrival=parent.arrival, output_ids=list(parent.output_ids), index=index,
                        num_cached_prompt_tokens=parent.num_cached_prompt_tokens, retention=parent.retention)
        if seq.block_table:
            self.running.append(child)
        else:
            self.add(child)
        return child

    def remove(self, request: Request) -> None:
        """Take a request out of every queue and free its blocks (finish or abort)."""
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
        self.kv.free(request.seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # ---------------------------------------------------------------- preemption

    def _preempt(self, victim: Request, out: SchedulerOutput, swap: bool = True) -> None:
        self.running.remove(victim)
        blocks = self.kv.num_held_blocks(victim.seq)
        cpu = self.kv.cpu_pool
        use_swap = (
            swap and self.config.preemption != "recompute" and cpu is not None and cpu.num_available >= blocks
            and (self.config.preemption == "swap" or blocks <= self.config.swap_max_blocks)
        )
        if use_swap:
            out.swap_out.extend(self.kv.swap_out(victim.seq))
            self.swapped.append(victim)
            self.num_preemptions["swap"] += 1
        else:
            tokens = list(victim.seq.token_ids)
            self.kv.free(victim.seq)
            victim.seq = Sequence(tokens, session=victim.seq.session)
            self.waiting.append(victim)
            self.num_preemptions["recompute"] += 1
        victim.num_preemptions += 1
        out.preempted.append(victim)

    def preempt_for_peer(self, victim: Request) -> None:
        """Preempt a running request by recompute for another model's request (its blocks are free at once: no
        copy of this model's has to run before the other model's forward writes them)."""
        self._preempt(victim, SchedulerOutput(), swap=False)

    # ---------------------------------------------------------------- retention

    def _slide(self, req: Request, n: int, out: SchedulerOutput) -> int:
        """Drop the blocks that left req's sliding window; returns n capped so the window bound holds."""
        r = req.retention
        req.seq.retention = r  # the manager's window groups keep what the policy may show again (pinned_blocks)
        if r is None or r.window_tokens is None:
            return n
        bs = self.kv.block_size
        copies, shifts = self.kv.evict_blocks(req.seq, window_drops(req.seq, r, bs), r.shifts_positions)
        out.copies.extend(copies)
        out.shifts.extend(shifts)
        return window_chunk(req.seq, r, bs, n)

    def _evict_for(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Under pressure, evict the lowest-scoring evictable blocks of the lowest-priority running
        request that allows it (req itself included); False when no request has any to give."""
        bs = self.kv.block_size
        short = self.kv.num_blocks_short(req.seq, n)
        for victim in sorted(self.running, key=Request.sort_key, reverse=True):
            r = victim.retention
            if r is None or not r.evict:
                continue
            # an entry holds a block in each KV group that still has it: take only as many as free `short`
            candidates = self.kv.entries_freeing(victim.seq, evictable(victim.seq, r, bs), short)
            if candidates:
                try:
                    copies, shifts = self.kv.evict_blocks(victim.seq, candidates, r.shifts_positions)
                except OutOfBlocks:  # re-rotating blocks it shares would need copies the pool lacks
                    continue
                out.copies.extend(copies)
                out.shifts.extend(shifts)
                self.num_evicted_blocks += len(candidates)
                return True
        return False

    # ---------------------------------------------------------------- the step

    def _full(self, budget: int, out: SchedulerOutput) -> bool:
        return budget == 0 or len(out.scheduled) >= self.config.max_num_seqs

    def _admit(self, req: Request, queue: list[Request]) -> None:
        """Move a request whose sequence got its blocks from the waiting or swapped queue to running."""
        queue.remove(req)
        self.running.append(req)

    @staticmethod
    def _add_compute(req: Request, out: SchedulerOutput, scheduled: set[int]) -> int:
        """Schedule the tokens that have slots but no KV yet; returns how many (0: nothing to run)."""
        computing = req.seq.num_kv_tokens - req.seq.num_computed_tokens
        if computing:
            out.scheduled.append((req, computing))
            scheduled.add(id(req))
        return computing

    def schedule(self) -> SchedulerOutput:
        """Decide one step. Running requests first (priority order), then swapped, then waiting."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        self.running.sort(key=Request.sort_key)
        scheduled: set[int] = set()

        for req in list(self.running):
            if req not in self.running:  # preempted by a higher-priority request this step
                continue
            if self._full(budget, out):
                break
            n = self._slide(req, min(req.seq.num_tokens - req.seq.num_kv_tokens, budget), out)
            while not self.kv.can_allocate(req.seq, n):
                if self._evict_for(req, n, out):
                    continue
                victims = [r for r in self.running if id(r) not in scheduled]
                victim = max(victims, key=Request.sort_key)  # lowest priority, latest arrival
                if victim is req and self.peer_victim is not None and self.peer_victim(req):
                    continue  # another model's request gave its blocks back
                self._preempt(victim, out)
                if victim is req:
                    break
            if req not in self.running:
                continue
            out.copies.extend(self.kv.allocate_slots(req.seq, n))
            budget -= self._add_compute(req, out, scheduled)

        if not out.preempted:
            self.swapped.sort(key=Request.sort_key)
            for req in list(self.swapped):
                if self._full(budget, out):
                    break
                try:
                    ops = self.kv.swap_in(req.seq)
                except OutOfBlocks:
                    break
                out.swap_in.extend(ops)
                self._admit(req, self.swapped)
                n = self._slide(req, min(req.seq.num_tokens - req.seq.num_kv_tokens, budget), out)
                if n and self.kv.can_allocate(req.seq, n):
                    out.copies.extend(self.kv.allocate_slots(req.seq, n))
                budget -= self._add_compute(req, out, scheduled)

        if not out.preempted and not self.swapped:
            self.waiting.sort(key=Request.sort_key)
            for req in list(self.waiting):
                if self._full(budget, out):
                    break
                seq = req.seq
                cached, _ = self.kv.lookup_prefix(seq.token_ids[: seq.num_tokens - 1])
                want = self._slide(req, cached + min(seq.num_tokens - cached, budget), out)
                if not self.kv.can_allocate(seq, want):
                    break  # first come first served: do not let later requests jump the queue
                out.copies.extend(self.kv.allocate_slots(seq, want))
                if req.num_preemptions == 0:
                    req.num_cached_prompt_tokens = seq.num_computed_tokens
                self._admit(req, self.waiting)
                budget -= self._add_compute(req, out, scheduled)
        # GPU blocks the allocations above evicted: copied to the CPU tier before anything writes them.
        out.swap_out.extend(self.kv.take_demotions())
        return out
