"""Multi-session chat workload replayed against the paged and the contiguous KV allocator.

    python3 -m bench.kv_sim --json [--budget-gib 1] [--seed N]

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
23,040 B/token unless --bytes-per-token):
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

from . import _path  # noqa: F401
from pagedkv.block_pool import OutOfBlocks
from pagedkv.config import CacheConfig
from pagedkv.contiguous import ContiguousAllocator
from pagedkv.kv_accounting import SMOLLM2_135M, bytes_per_token, kv_stats
from pagedkv.kv_cache_manager import KVCacheManager, NeverFits
from pagedkv.sequence import Sequence

GIB = 1 << 30


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


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def simulate(kind: str, plans: list[SessionPlan], cfg: WorkloadConfig, budget_bytes: int,
             bpt: int, block_size: int = 16, contiguous_max_context: int = 2048) -> dict:
    """Replay `plans` against one allocator; returns the metrics described above."""
    if kind == "paged":
        cache = CacheConfig.from_budget(budget_bytes, bpt, block_size)
        alloc = KVCacheManager(cache, namespace=SMOLLM2_135M.name)
        total_slots = cache.num_blocks * block_size
        config = {"num_blocks": cache.num_blocks, "block_size": block_size}
    else:
        total_slots = budget_bytes // bpt
        alloc = ContiguousAllocator(total_slots, contiguous_max_context)
        config = {"num_slots": total_slots, "max_context": contiguous_max_context}
    config.update(budget_bytes=budget_bytes, bytes_per_token=bpt)
    sessions = [_Session(i, p) for i, p in enumerate(plans)]
    last_arrival = max(p.arrival for p in plans)
    started = failed = prompt_tokens = reused_tokens = max_ctx = 0
    util, tok_util, eff, share = [], [], [], []

    def end_session(s: _Session) -> None:
        if s.seq is not None and s.seq.status.value != "finished":
            alloc.free(s.seq)
        s.done = True

    def start_turn(s: _Session) -> None:
        nonlocal started, failed, prompt_tokens, reused_tokens
        turn = s.plan.turns[s.turn]
        if len(s.history) + len(turn.user) + len(turn.answer) > cfg.model_context:
            end_session(s)
            return
        started += 1
        prompt = s.history + turn.user
        prompt_tokens += len(prompt)
        try:
            if kind == "paged":
                s.seq = Sequence(prompt, session=f"s{s.sid}")
                alloc.allocate_slots(s.seq, len(prompt))
                reused_tokens += s.seq.num_computed_tokens
            else:
                if s.seq is None:
                    s.seq = Sequence([], session=f"s{s.sid}")
                reused_tokens += s.seq.num_kv_tokens
                alloc.append_tokens(s.seq, turn.user if s.seq.num_kv_tokens else prompt)
        except (OutOfBlocks, NeverFits):
            failed += 1
            end_session(s)
            return
        s.answer_left = list(turn.answer)

    now = 0
    while not all(s.done for s in sessions):
        for s in sessions:
            if not s.done and not s.answer_left and s.wake == now:
                start_turn(s)
        for s in sessions:
            if s.done or not s.answer_left:
                continue
            step, s.answer_left = (s.answer_left[:cfg.decode_tokens_per_s],
                                   s.answer_left[cfg.decode_tokens_per_s:])
            try:
                alloc.append_tokens(s.seq, step)
            except (OutOfBlocks, NeverFits):
                failed += 1
                s.answer_left = []
                end_session(s)
                continue
            if not s.answer_left:                      # turn complete
                turn = s.plan.turns[s.turn]
                s.history += turn.user + turn.answer
                max_ctx = max(max_ctx, len(s.history))
                if kind == "paged":
                    alloc.free(s.seq)
                s.wake = now + s.plan.thinks[s.turn]
                s.turn += 1
                if s.turn == len(s.plan.turns):
                    end_session(s)
        if cfg.warmup_s <= now <= last_arrival:
            st = kv_stats(alloc) if kind == "paged" else alloc.stats()
            used_slots = st.used_blocks * (block_size if kind == "paged" else 1)
            util.append(used_slots / total_slots)
            held = st.physical_tokens + (st.cached_blocks * block_size if kind == "paged" else 0)
            tok_util.append(held / total_slots)
            if used_slots:
                eff.append(st.slot_efficiency)
            if st.physical_tokens:
                share.append(st.sharing_factor)
        now += 1

    hit = alloc.num_hit_tokens / prompt_tokens if kind == "paged" and prompt_tokens else 0.0
    return {
        "allocator": kind, "seed": None, "config": config,
        "max_context_tokens": max_ctx,
        "utilization_mean": sum(util) / len(util), "utilization_p5": _percentile(util, 0.05),
        "token_utilization_mean": sum(tok_util) / len(tok_util),
        "token_utilization_p5": _percentile(tok_util, 0.05),
        "slot_efficiency": sum(eff) / len(eff) if eff else 1.0,
        "oom_rate": failed / started if started else 0.0,
        "prefix_hit_rate": hit,
        "kv_reuse_rate": reused_tokens / prompt_tokens if prompt_tokens else 0.0,
        "sharing_factor": sum(share) / len(share) if share else 1.0,
        "turns_started": started, "turns_failed": failed, "sessions": len(sessions),
        "ticks_sampled": len(util), "sim_seconds": now,
        "realloc_copied_tokens": getattr(alloc, "num_copied_tokens", 0),
    }


def run(budget_gib: float, seed: int, bpt: int, max_context: int) -> dict:
    cfg = WorkloadConfig()
    plans = make_workload(cfg, seed)
    budget = int(budget_gib * GIB)
    out = {}
    for kind in ("paged", "contiguous"):
        r = simulate(kind, plans, cfg, budget, bpt, contiguous_max_context=max_context)
        r["seed"] = seed
        out[kind] = r
    out["workload"] = asdict(cfg)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the full JSON result")
    ap.add_argument("--budget-gib", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bytes-per-token", type=int, default=bytes_per_token(SMOLLM2_135M, "f16"))
    ap.add_argument("--contiguous-max-context", type=int, default=2048)
    args = ap.parse_args(argv)
    if args.budget_gib <= 0 or args.bytes_per_token <= 0:
        ap.error("--budget-gib and --bytes-per-token must be positive")
    out = run(args.budget_gib, args.seed, args.bytes_per_token, args.contiguous_max_context)
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
