"""Multi-session chat workload replayed against the paged and the contiguous KV allocator.

    python3 -m bench.kv_sim --json [--budget-gib 1] [--seed N] [--model synthetic-1.5b | --gguf FILE]

Workload (fixed parameters, chosen before measuring; see WorkloadConfig):
sessions arrive as a Poisson process (mean gap 3 s); each picks one of four
shared system prompts (40/120/300/600 tokens) and chats for 1 + Geometric(0.25)
turns (mean 4, at most 20). A turn's prompt is the whole conversation so far
plus a user message of LogNormal(median 50, sigma 1.0) tokens (4..2000); the
answer is LogNormal(median 250, sigma 0.7) tokens (8..1500), decoded at
20 tokens/s; the user then thinks Exp(mean 30 s) before the next turn. A turn
that would pass the model's 8192-token context ends the session normally.
Time advances in 1 s ticks. The same seed gives both allocators the same
sessions; a session whose allocation fails ends there (so later turns differ).
Neither allocator queues or preempts: a refused allocation fails the turn
(a real scheduler would swap or wait instead; this measures raw headroom).

Allocators, both sized from the same byte budget (SmolLM2-135M f16 KV,
23,040 B/token unless --bytes-per-token). With --model or --gguf, the budget is the KV pool that the
model's weights, scratch and staging leave in --budget-gib, and the bytes per token are its own (the GPU
ledger's plan, bench/harness/model_ledger.py; the result carries it under "ledger"):
- paged: KVCacheManager, num_blocks = budget // (16 x B/token). Each turn is a
  new sequence (history + user message) that shares whatever prefix is still
  cached; when the turn's answer is done the sequence is freed, its full
  blocks stay cached (evictable) until the next turn.
- contiguous: ContiguousAllocator, num_slots = budget // B/token. A session
  reserves max_context (2048) slots at its first turn and keeps the range,
  with its KV, until it ends; outgrowing it reallocates (double, copy).

Metrics (each allocator):
- max_context_tokens: the longest context (prompt + answer tokens) any turn
  reached with every one of its allocations succeeding.
- oom_rate: failed turns / started turns. A turn fails when any allocation
  for it (prompt, or a decode step) is refused for lack of memory.
- utilization_mean / utilization_p5: over every tick from 300 s (warm-up) to
  the last arrival, allocated slots / total slots. Allocated = slots of blocks
  with ref count > 0 (paged), reserved slots (contiguous). p5 = 5th percentile.
- token_utilization_mean / _p5: slots holding a token's KV that is still
  usable / total slots: tokens in used blocks plus full cached blocks (paged),
  tokens stored in reserved ranges (contiguous). Comparable across both.
- slot_efficiency: mean over the same ticks of tokens stored in allocated
  slots / allocated slots (internal fragmentation; ticks with nothing
  allocated are skipped).
- prefix_hit_rate: prompt tokens whose KV came from the prefix cache / prompt
  tokens of started turns (contiguous has no prefix cache: 0).
- kv_reuse_rate: prompt tokens not recomputed / prompt tokens: cache hits
  (paged) or history still held in the session's own range (contiguous).
- sharing_factor: mean over the ticks of logical tokens of running sequences
  / physical token slots they fill (1.0 = no sharing).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pagedkv.kv.block_pool import OutOfBlocks
from pagedkv.config import CacheConfig
from pagedkv.kv.contiguous import ContiguousAllocator
from pagedkv.kv.accounting import kv_stats
from pagedkv.kv.spec import SMOLLM2_135M
from pagedkv.kv.manager import KVCacheManager, NeverFits
from pagedkv.sequence import Sequence

GIB = 1 << 30
TRACE_EVERY_S = 5  # the utilization series for plots: one sample per 5 simulated seconds


@dataclass(frozen=True)
class WorkloadConfig:
    num_sessions: int = 400
    mean_arrival_gap_s: float = 3.0
    system_prompt_lens: tuple[int, ...] = (40, 120, 300, 600)
    turn_continue_p: float = 0.75        # geometric number of turns, mean 4
    max_turns: int = 20
    user_median: float = 50.0
    user_sigma: float = 1.0
    user_range: tuple[int, int] = (4, 2000)
    answer_median: float = 250.0
    answer_sigma: float = 0.7
    answer_range: tuple[int, int] = (8, 1500)
    decode_tokens_per_s: int = 20
    mean_think_s: float = 30.0
    model_context: int = 8192
    warmup_s: int = 300
    vocab: int = 49152


@dataclass
class Turn:
    user: list[int]
    answer: list[int]


@dataclass
class SessionPlan:
    arrival: int
    system: list[int]
    turns: list[Turn]
    thinks: list[int]


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


def make_workload(cfg: WorkloadConfig, seed: int) -> list[SessionPlan]:
    """The sessions, fully drawn up front so both allocators replay the same ones."""
    rng = random.Random(seed)
    systems = [[rng.randrange(cfg.vocab) for _ in range(n)] for n in cfg.system_prompt_lens]
    plans, t = [], 0.0
    for _ in range(cfg.num_sessions):
        t += rng.expovariate(1.0 / cfg.mean_arrival_gap_s)
        n_turns = 1
        while n_turns < cfg.max_turns and rng.random() < cfg.turn_continue_p:
            n_turns += 1
        turns = [Turn([rng.randrange(cfg.vocab) for _ in range(
                          _lognormal(rng, cfg.user_median, cfg.user_sigma, *cfg.user_range))],
                      [rng.randrange(cfg.vocab) for _ in range(
                          _lognormal(rng, cfg.answer_median, cfg.answer_sigma,
                                     *cfg.answer_range))])
                 for _ in range(n_turns)]
        thinks = [max(1, round(rng.expovariate(1.0 / cfg.mean_think_s))) for _ in turns]
        plans.append(SessionPlan(int(t), rng.choice(systems), turns, thinks))
    return plans


class _Session:
    def __init__(self, sid: int, plan: SessionPlan) -> None:
        self.sid, self.plan = sid, plan
        self.history: list[int] = list(plan.system)
        self.turn = 0
        self.seq: Sequence | None = None    # paged: this turn's sequence; contiguous: the session's
        self.answer_left: list[int] = []
        self.wake = plan.arrival
        self.done = False
        self.failed = False                  # ended by a refused allocation


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def token_slots(alloc, seq: Sequence, first: int, block_size: int) -> np.ndarray:
    """(n,) int64 physical slots of tokens [first, seq.num_kv_tokens): block * block_size + offset (paged),
    or the arena slot (contiguous: one range starting at get_block_ids(seq)[0])."""
    pos = np.arange(first, seq.num_kv_tokens, dtype=np.int64)  # (n,)
    if isinstance(alloc, ContiguousAllocator):
        return alloc.get_block_ids(seq)[0] + pos
    table = np.asarray(seq.block_table, dtype=np.int64)
    return table[pos // block_size] * block_size + pos % block_size


class Replay:
    """One allocator replaying `plans`, one 1 s tick per `tick()` call (see `simulate`).

    Every slot given to a token is reported to `on_slots(seq, first, n, slots)` (slots: (n,) int64 physical
    token slots, block * block_size + offset for paged, arena slot for contiguous) and every contiguous
    reallocation to `on_copy(dst_slots)`: bench/kv_browser.py turns them into kv_write dispatches.
    `trace` keeps the per-tick utilization series and the block map at the last arrival (for plots).
    `manager`: replay on this paged allocator instead of a fresh one (one of several models' managers on a
    SharedKVBudget's pool, bench/two_models.py); budget_bytes and bpt are then only recorded, and the cached
    blocks counted are those of the manager's namespace."""

    def __init__(self, kind: str, plans: list[SessionPlan], cfg: WorkloadConfig, budget_bytes: int, bpt: int,
                 block_size: int = 16, contiguous_max_context: int = 2048, enable_prefix_caching: bool = True,
                 on_slots=None, on_copy=None, trace: bool = False, preempt: bool = False,
                 manager: KVCacheManager | None = None) -> None:
        if kind not in ("paged", "contiguous"):
            raise ValueError(f"allocator kind must be 'paged' or 'contiguous', got {kind!r}")
        if manager is not None and kind != "paged":
            raise ValueError(f"a KVCacheManager is a paged allocator; got kind {kind!r}")
        self.kind, self.cfg, self.block_size = kind, cfg, block_size
        self.shared_pool = manager is not None
        if manager is not None:
            self.alloc, self.block_size = manager, manager.block_size
            self.total_slots = manager.pool.num_blocks * manager.block_size
            self.config = {"num_blocks": manager.pool.num_blocks, "block_size": manager.block_size,
                           "enable_prefix_caching": manager.config.enable_prefix_caching, "shared_pool": True}
        elif kind == "paged":
            cache = CacheConfig.from_budget(budget_bytes, bpt, block_size,
                                            enable_prefix_caching=enable_prefix_caching)
            self.alloc = KVCacheManager(cache, namespace="SmolLM2-135M-Instruct")
            self.total_slots = cache.num_blocks * block_size
            self.config = {"num_blocks": cache.num_blocks, "block_size": block_size,
                           "enable_prefix_caching": enable_prefix_caching}
        else:
            self.total_slots = budget_bytes // bpt
            self.alloc = ContiguousAllocator(self.total_slots, contiguous_max_context)
            self.config = {"num_slots": self.total_slots, "max_context": contiguous_max_context}
        self.config.update(budget_bytes=budget_bytes, bytes_per_token=bpt)
        self.on_slots, self.on_copy, self.trace, self.preempt = on_slots, on_copy, trace, preempt
        self.preemptions = 0       # running turns evicted (decode refused)
        self.deferred_ticks = 0    # ticks a turn waited because its prompt did not fit
        self.sessions = [_Session(i, p) for i, p in enumerate(plans)]
        self.last_arrival = max(p.arrival for p in plans)
        self.now = 0
        self.started = self.failed = self.prompt_tokens = self.reused_tokens = self.max_ctx = 0
        self.util: list[float] = []
        self.tok_util: list[float] = []
        self.eff: list[float] = []
        self.share: list[float] = []
        self.series: list[tuple[int, float, float]] = []  # (tick, utilization, token utilization), whole run
        self.block_map: dict | None = None

    @property
    def done(self) -> bool:
        return all(s.done for s in self.sessions)

    def _end_session(self, s: _Session) -> None:
        if s.seq is not None and s.seq.status.value != "finished":
            self.alloc.free(s.seq)
        s.done = True

    def _report(self, seq: Sequence, first: int, ops=()) -> None:
        """Slots of tokens [first, seq.num_kv_tokens) of `seq` (and the ranges a reallocation copied)."""
        if self.on_copy is not None:
            for op in ops:
                if hasattr(op, "length"):  # contiguous CopyRange: the moved tokens are rewritten at dst
                    self.on_copy(np.arange(op.dst, op.dst + op.length, dtype=np.int64))
        if self.on_slots is None or seq.num_kv_tokens <= first:
            return
        slots = token_slots(self.alloc, seq, first, self.block_size)
        self.on_slots(seq, first, len(slots), slots)

    def _start_turn(self, s: _Session) -> None:
        turn = s.plan.turns[s.turn]
        if len(s.history) + len(turn.user) + len(turn.answer) > self.cfg.model_context:
            self._end_session(s)
            return
        self.started += 1
        prompt = s.history + turn.user
        self.prompt_tokens += len(prompt)
        try:
            if self.kind == "paged":
                s.seq = Sequence(prompt, session=f"s{s.sid}")
                ops = self.alloc.allocate_slots(s.seq, len(prompt))
                self.reused_tokens += s.seq.num_computed_tokens
                self._report(s.seq, s.seq.num_computed_tokens, ops)
            else:
                if s.seq is None:
                    s.seq = Sequence([], session=f"s{s.sid}")
                first = s.seq.num_kv_tokens
                self.reused_tokens += first
                ops = self.alloc.append_tokens(s.seq, turn.user if first else prompt)
                self._report(s.seq, first, ops)
        except (OutOfBlocks, NeverFits) as exc:
            if self.preempt and isinstance(exc, OutOfBlocks):  # wait for memory: the turn is retried next tick
                self.deferred_ticks += 1
                self._requeue(s)
                return
            self.failed += 1
            s.failed = True
            self._end_session(s)
            return
        s.answer_left = list(turn.answer)

    def _decode(self, s: _Session) -> None:
        step = self.cfg.decode_tokens_per_s
        chunk, s.answer_left = s.answer_left[:step], s.answer_left[step:]
        first = s.seq.num_kv_tokens
        try:
            ops = self.alloc.append_tokens(s.seq, chunk)
        except (OutOfBlocks, NeverFits) as exc:
            if self.preempt and isinstance(exc, OutOfBlocks):  # NeverFits: no wait makes the pool hold it
                self.preemptions += 1
                self._requeue(s)
                return
            self.failed += 1
            s.failed = True
            s.answer_left = []
            self._end_session(s)
            return
        self._report(s.seq, first, ops)
        if not s.answer_left:                      # turn complete
            turn = s.plan.turns[s.turn]
            s.history += turn.user + turn.answer
            self.max_ctx = max(self.max_ctx, len(s.history))
            if self.kind == "paged":
                self.alloc.free(s.seq)
            s.wake = self.now + s.plan.thinks[s.turn]
            s.turn += 1
            if s.turn == len(s.plan.turns):
                self._end_session(s)

    def _requeue(self, s: _Session) -> None:
        """Preemption by recompute, as the engine's scheduler does instead of failing: free what the turn
        holds (paged: its full blocks stay cached, so the retry mostly hits the prefix cache; contiguous: the
        whole range) and restart the turn next tick. The retry counts as another started turn."""
        if s.seq is not None and s.seq.status.value != "finished":
            self.alloc.free(s.seq)
        s.seq = None
        s.answer_left = []
        s.wake = self.now + 1

    def tick(self) -> None:
        """Advance one second: start the turns due now, decode one second of every answer, sample."""
        for s in self.sessions:
            if not s.done and not s.answer_left and s.wake == self.now:
                self._start_turn(s)
        for s in self.sessions:
            if not s.done and s.answer_left:
                self._decode(s)
        in_window = self.cfg.warmup_s <= self.now <= self.last_arrival
        if in_window or (self.trace and self.now % TRACE_EVERY_S == 0):
            self._sample(in_window)
        if self.trace and self.now == self.last_arrival:
            self.block_map = block_map(self)
        self.now += 1

    def _sample(self, in_window: bool) -> None:
        paged = self.kind == "paged"
        st = kv_stats(self.alloc) if paged else self.alloc.stats()
        used_slots = st.used_blocks * (self.block_size if paged else 1)
        util = used_slots / self.total_slots
        cached = cached_blocks_of(self.alloc) if self.shared_pool else st.cached_blocks if paged else 0
        held = st.physical_tokens + cached * self.block_size
        if self.trace and self.now % TRACE_EVERY_S == 0:
            self.series.append((self.now, round(util, 5), round(held / self.total_slots, 5)))
        if not in_window:
            return
        self.util.append(util)
        self.tok_util.append(held / self.total_slots)
        if used_slots:
            self.eff.append(st.slot_efficiency)
        if st.physical_tokens:
            self.share.append(st.sharing_factor)

    def result(self) -> dict:
        """The metrics described in the module docstring."""
        alloc, paged, util = self.alloc, self.kind == "paged", self.util
        hit = alloc.num_hit_tokens / self.prompt_tokens if paged and self.prompt_tokens else 0.0
        out = {
            "allocator": self.kind, "seed": None, "config": self.config,
            "max_context_tokens": self.max_ctx,
            "utilization_mean": sum(util) / len(util), "utilization_p5": _percentile(util, 0.05),
            "token_utilization_mean": sum(self.tok_util) / len(self.tok_util),
            "token_utilization_p5": _percentile(self.tok_util, 0.05),
            "slot_efficiency": sum(self.eff) / len(self.eff) if self.eff else 1.0,
            "oom_rate": self.failed / self.started if self.started else 0.0,
            "prefix_hit_rate": hit,
            "kv_reuse_rate": self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "sharing_factor": sum(self.share) / len(self.share) if self.share else 1.0,
            "turns_started": self.started, "turns_failed": self.failed, "sessions": len(self.sessions),
            "sessions_served": sum(1 for s in self.sessions if not s.failed),  # ended without a refusal
            "ticks_sampled": len(util), "sim_seconds": self.now,
            "realloc_copied_tokens": getattr(alloc, "num_copied_tokens", 0),
            "preempt": self.preempt, "preemptions": self.preemptions, "deferred_ticks": self.deferred_ticks,
        }
        if self.trace:
            out["series"] = self.series
            out["block_map"] = self.block_map
        return out


def cached_blocks_of(manager: KVCacheManager) -> int:
    """Cached (evictable) blocks of the manager's pool holding the manager's own prefixes (its namespace): on a
    pool shared by several models, the pool's num_cached counts every model's."""
    return sum(1 for b in manager.pool.block_states()
               if b.ref_count == 0 and b.block_hash is not None and b.salt == manager.namespace)


def block_map(replay: Replay) -> dict:
    """Per 16-slot block of the pool: 0 free, 1 cached (paged, evictable), 2 allocated,
    3.. = 2 + slots of it holding a live token (so 2 + block_size = full)."""
    bs = replay.block_size
    alloc = replay.alloc
    if replay.kind == "paged":
        state = np.array([1 if alloc.pool.state_of(b) == "cached" else 0 for b in range(alloc.pool.num_blocks)])
        for seq in alloc.live.values():
            for i, bid in enumerate(seq.block_table):
                state[bid] = max(state[bid], 2 + min(bs, seq.num_kv_tokens - i * bs))
    else:
        slots = np.zeros(replay.total_slots, np.int64)  # 0 free, 1 reserved, 2 holds a token
        for seq_id, (start, cap) in alloc.ranges.items():
            slots[start:start + cap] = 1
            slots[start:start + alloc.live[seq_id].num_kv_tokens] = 2
        n = replay.total_slots // bs
        chunks = slots[:n * bs].reshape(n, bs)  # (blocks, bs)
        state = np.where(chunks.max(1) == 0, 0, 2 + (chunks == 2).sum(1))
    return {"tick": replay.now, "block_size": bs, "state": [int(x) for x in state]}


def simulate(kind: str, plans: list[SessionPlan], cfg: WorkloadConfig, budget_bytes: int,
             bpt: int, block_size: int = 16, contiguous_max_context: int = 2048, **kw) -> dict:
    """Replay `plans` against one allocator; returns the metrics described above."""
    replay = Replay(kind, plans, cfg, budget_bytes, bpt, block_size, contiguous_max_context, **kw)
    while not replay.done:
        replay.tick()
    return replay.result()


def run(budget: int, seed: int, bpt: int, max_context: int, num_sessions: int = 400, preempt: bool = False) -> dict:
    """paged and contiguous results (and with `preempt`, "paged_preempt": the paged allocator waiting and
    preempting instead of failing, as the engine's scheduler does)."""
    cfg = WorkloadConfig(num_sessions=num_sessions)
    plans = make_workload(cfg, seed)
    out = {}
    rows = [("paged", "paged", False), ("contiguous", "contiguous", False)]
    if preempt:
        rows.append(("paged_preempt", "paged", True))
    for key, kind, waits in rows:
        r = simulate(kind, plans, cfg, budget, bpt, contiguous_max_context=max_context, preempt=waits)
        r["seed"] = seed
        out[key] = r
    out["workload"] = asdict(cfg)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the full JSON result")
    ap.add_argument("--budget-gib", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bytes-per-token", type=int, default=SMOLLM2_135M.bytes_per_token)
    ap.add_argument("--contiguous-max-context", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="200 sessions instead of 400")
    ap.add_argument("--preempt", action="store_true", help="also the paged allocator waiting / preempting (slow "
                    "on small pools: every waiting turn retries its prompt each simulated second)")
    model = ap.add_mutually_exclusive_group()
    model.add_argument("--model", choices=("synthetic-1.5b",), help="the budget left by this model's ledger")
    model.add_argument("--gguf", type=Path, help="the budget left by this GGUF's ledger")
    args = ap.parse_args(argv)
    if args.budget_gib <= 0 or args.bytes_per_token <= 0:
        ap.error("--budget-gib and --bytes-per-token must be positive")
    budget, bpt, ledger = int(args.budget_gib * GIB), args.bytes_per_token, None
    if args.model or args.gguf:
        from bench.harness.model_ledger import model_ledger, resolve  # CPython only (kv_sim also runs in the page)

        ledger = model_ledger(resolve(args.gguf, args.model), budget_bytes=budget)
        budget, bpt = ledger["kv_bytes"], ledger["bytes_per_token"]
    out = run(budget, args.seed, bpt, args.contiguous_max_context, 200 if args.quick else 400, args.preempt)
    if ledger is not None:
        out["ledger"] = ledger
    if args.json:
        print(json.dumps(out, indent=2))
        return
    keys = ("max_context_tokens", "utilization_mean", "utilization_p5", "token_utilization_mean",
            "slot_efficiency", "oom_rate", "prefix_hit_rate", "kv_reuse_rate", "sharing_factor")
    print(f"budget {args.budget_gib} GiB, seed {args.seed}")
    print(f"{'metric':24s} {'paged':>12s} {'contiguous':>12s}")
    for k in keys:
        print(f"{k:24s} {out['paged'][k]:12.4g} {out['contiguous'][k]:12.4g}")


if __name__ == "__main__":
    main()
