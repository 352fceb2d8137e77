"""Perplexity evaluation: score texts under KV retention policies through the engine path (`evaluate`: one
text under one policy); many independent (text, policy) lanes run with one forward per step.

A lane is one prompt fed to its OWN scheduler + KV cache manager (its own pool of `pool_blocks` blocks,
so pool pressure, window drops and importance eviction are exactly those of a conversation alone in
that pool), retention policy and model runner (`build_batch`). What lanes share is the forward: every
step, each lane's scheduled tokens are built into a batch, the batches are stacked into one
ForwardBatch (each lane's block ids offset into its own range of one CpuBackend pool) and run as one
`NumpyModel.forward`. Attention is per sequence, so a lane sees exactly the K/V it would see alone; the
stacking only makes the matrix products tall (16-token window steps of 30 lanes are 480 rows instead
of 16), which is where the CPU time goes. Results differ from one-lane runs only by float rounding of
the longer products.

All logits are kept: every lane records, per predicted token, log p(true next token) and the argmax.
"""
from __future__ import annotations

import numpy as np

from .backends.cpu import CpuBackend
from .block_mover import BlockMover
from .config import CacheConfig
from .engine import run_sync
from .kv.block_pool import CopyOp
from .kv.manager import KVCacheManager
from .kv.moves import BlockMoves
from .kv.retention import KVRetention, ShiftOp
from .model.weights import ModelWeights
from .model_runner import ForwardBatch, build_batch
from .request import Request
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence


def log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """logits (n, vocab) f32, targets (n,) -> (n,) log p(target)."""
    m = logits.max(axis=1, keepdims=True)  # (n, 1)
    lse = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]  # (n,)
    return logits[np.arange(len(targets)), targets] - lse


class Lane:
    """One text under one policy: a one-request scheduler over its own cache manager, plus its scores."""

    def __init__(self, name: str, tokens: list[int], retention: KVRetention | None, pool_blocks: int,
                 chunk: int, block_size: int) -> None:
        if len(tokens) < 2:
            raise ValueError(f"lane {name}: needs at least 2 tokens to score one, got {len(tokens)}")
        self.name = name
        self.tokens = tokens
        self.pool_blocks = pool_blocks
        self.chunk = chunk
        self.kv = KVCacheManager(CacheConfig(num_blocks=pool_blocks, block_size=block_size,
                                             enable_prefix_caching=False))
        self.sched = Scheduler(SchedulerConfig(max_num_batched_tokens=chunk, max_num_seqs=1), self.kv)
        self.req = Request(name, Sequence(tokens), num_prompt_tokens=len(tokens), max_tokens=1,
                           retention=retention)
        self.sched.add(self.req)
        self.tracks_mass = retention is not None and retention.evict
        self.logp = np.zeros(len(tokens) - 1, np.float64)  # (len - 1,) log p(token i + 1 | cache)
        self.greedy = np.zeros(len(tokens) - 1, np.int64)  # (len - 1,) argmax after token i
        self.max_blocks_held = self.shifted_blocks = self.steps = 0

    @property
    def done(self) -> bool:
        return self.req.seq.num_computed_tokens >= len(self.tokens)

    def schedule(self) -> tuple[int, list[CopyOp], list[ShiftOp], ForwardBatch]:
        """One scheduler step: (tokens scheduled, copies, key shifts, this lane's batch)."""
        out = self.sched.schedule()
        if out.preempted:
            raise RuntimeError(f"lane {self.name}: the policy preempted the only sequence "
                               f"({self.req.retention}); give it more blocks")
        self.shifted_blocks += len(out.shifts)
        return out.scheduled[0][1], out.copies, out.shifts, build_batch(out.scheduled, self.kv.block_size)

    def record(self, n: int, logits: np.ndarray, mass: np.ndarray | None) -> None:
        """Take this step's logits (n, vocab) and attention mass (1, max_blocks); advance the sequence."""
        seq = self.req.seq
        if self.tracks_mass:
            self.kv.add_attention_mass([seq], mass)
        start = seq.num_computed_tokens
        rows = min(n, len(self.tokens) - 1 - start)  # the last token predicts nothing we can score
        if rows > 0:
            targets = np.asarray(self.tokens[start + 1:start + 1 + rows])  # (rows,)
            self.logp[start:start + rows] = log_softmax_at(logits[:rows], targets)
            self.greedy[start:start + rows] = logits[:rows].argmax(axis=1)
        self.kv.mark_computed(seq, n)
        self.max_blocks_held = max(self.max_blocks_held, len(seq.block_table))
        self.steps += 1

    @property
    def num_evicted_blocks(self) -> int:
        return self.sched.num_evicted_blocks


def stack_batches(batches: list[ForwardBatch], offsets: list[int], block_size: int) -> ForwardBatch:
    """Lane batches (block ids local to each lane) -> one ForwardBatch over the shared pool."""
    width = max(b.block_tables.shape[1] for b in batches)
    tables = np.zeros((len(batches), width), np.int32)  # (S, max_blocks); padding is never read
    qsl = [0]
    for i, (b, off) in enumerate(zip(batches, offsets)):
        tables[i, :b.block_tables.shape[1]] = b.block_tables[0] + off
        qsl.append(qsl[-1] + b.token_ids.shape[0])
    return ForwardBatch(
        token_ids=np.concatenate([b.token_ids for b in batches]),  # (T,)
        positions=np.concatenate([b.positions for b in batches]),  # (T,)
        slot_mapping=np.concatenate([b.slot_mapping + off * block_size
                                     for b, off in zip(batches, offsets)]).astype(np.int32),  # (T,)
        query_start_loc=np.asarray(qsl, np.int32),  # (S + 1,)
        block_tables=tables,
        context_lens=np.concatenate([b.context_lens for b in batches]),  # (S,)
    )


def run_lanes(weights: ModelWeights, lanes: list[Lane], block_size: int, max_rows: int = 1024) -> None:
    """Step every lane to the end of its text; a step stacks lanes (in order) while their chunks fit
    in max_rows (bounds the (rows, vocab) logits held at once), at least one."""
    offsets = list(np.cumsum([0] + [lane.pool_blocks for lane in lanes[:-1]]))
    # Every layer full: the lanes' batches stack into one table per sequence (stack_batches); a model with window
    # layers computes the same there (tests/test_kv_retention_groups.py holds the grouped engine to it).
    backend = CpuBackend(weights, num_blocks=sum(lane.pool_blocks for lane in lanes), block_size=block_size,
                         kv_groups=False)
    mover = BlockMover(backend)
    while True:
        active = [i for i, lane in enumerate(lanes) if not lane.done]
        if not active:
            return
        step, rows = [], 0
        for i in active:
            if step and rows + lanes[i].chunk > max_rows:
                break
            step.append(i)
            rows += lanes[i].chunk
        plans = [lanes[i].schedule() for i in step]
        copies = [CopyOp(src + offsets[i], dst + offsets[i]) for i, p in zip(step, plans) for src, dst in p[1]]
        shifts = [ShiftOp(op.block + offsets[i], op.delta) for i, p in zip(step, plans) for op in p[2]]
        run_sync(mover.run(BlockMoves(copies=copies, shifts=shifts)))
        batch = stack_batches([p[3] for p in plans], [int(offsets[i]) for i in step], block_size)
        track = any(lanes[i].tracks_mass for i in step)
        mass = np.zeros(batch.block_tables.shape, np.float32) if track else None  # (S, max_blocks)
        logits = backend.model.forward(batch, backend.kv, all_logits=True, attention_mass=mass)  # (T, vocab)
        qsl = batch.query_start_loc
        for s, (i, plan) in enumerate(zip(step, plans)):
            lanes[i].record(plan[0], logits[qsl[s]:qsl[s + 1]], None if mass is None else mass[s:s + 1])


def evaluate(weights: ModelWeights, tokens: list[int], retention: KVRetention | None, pool_blocks: int,
             chunk: int = 256, block_size: int = 16) -> dict:
    """One text under one policy, alone: per predicted token (len - 1,) the log-prob of the true next token
    ("logp") and the greedy choice ("greedy"), with the most blocks held, blocks evicted and shifted, steps."""
    lane = Lane("text", tokens, retention, pool_blocks, chunk, block_size)
    run_lanes(weights, [lane], block_size)
    return {"logp": lane.logp, "greedy": lane.greedy, "max_blocks_held": lane.max_blocks_held,
            "evicted_blocks": lane.num_evicted_blocks, "shifted_blocks": lane.shifted_blocks, "steps": lane.steps}
