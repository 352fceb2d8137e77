"""Two models in one page under one GPU budget: per-model contiguous KV reservations vs one shared paged KV pool.

    python3 -m bench.two_models --json [--budget-gib 1] [--seed 0] [--quick] [--no-tab]

Also, under "tab" (unless --no-tab), two models streaming at once in the tab: tokens/s of each alone and
together (bench/two_models_tab.py, whose docstring says which models and why not this pair).

Models: SmolLM2-135M-Instruct (the pinned Q4_1 GGUF; f16 KV 23,040 B/token) and the synthetic 1.5B-class model
(bench/harness/model_ledger.py's synthetic-1.5b: Q4_K, 24 layers x 8 KV heads x 64; f16 KV 49,152 B/token).

Budget: each model's weights, scratch and staging (its GPU ledger, counted once per model) come off
--budget-gib; the rest is the KV memory, the same bytes in every row. When it holds fewer pages than one
2,048-token session of the 1.5B model needs, the run moves to 1.5 GiB and says why ("budget_note").

Workload: bench/kv_sim.py's on each model at once, two independent session streams (seeds S and S + 1) on one
simulated clock in 1 s ticks (the model served first alternates every tick). Each stream has half kv_sim's
sessions arriving at half its rate (200 sessions, one every 6 s on average; --quick 100), so the pair's load
is one kv_sim run's (400 sessions, one every 3 s).

Rows:
- contiguous: each model gets a static share of the bytes in proportion to its bytes per token (the same
  number of tokens each: the two streams are the same load), ContiguousAllocator reservations of 2,048 tokens
  per session; a refused allocation fails the turn (kv_sim's contiguous).
- contiguous_equal_bytes: the same, half the bytes each.
- paged_split_no_wait: each model its own paged pool of its contiguous share, failing a refused turn.
- paged_shared_no_wait: one SharedKVBudget pool for both, failing a refused turn.
- paged_shared: the SharedKVBudget pool served as the engine serves it: a prompt that finds no pages waits and
  retries every second, a refused decode is preempted by recompute (kv_sim's preempt mode); cached pages of
  either model are evicted LRU by either. A page is 16 tokens of the 1.5B model; SmolLM2 gets 32-token blocks
  (the largest allowed block fitting the page: 93.75 % of it, "page_fill").

Metrics, per model and for the pair ("pair"):
- turns: distinct turns begun (a waiting or preempted turn's retries are not counted again, unlike kv_sim's
  turns_started); turns_failed; oom_rate = turns_failed / turns.
- max_context_tokens, preemptions, deferred_ticks as kv_sim's; mean_wait_s = deferred_ticks / turns (seconds
  a turn waited for pages to start, on average; a preempted turn's recompute is not counted).
- prefix_hit_rate: prompt tokens whose KV came from the prefix cache / prompt tokens given slots (the manager's
  rate; a preempted turn's retry counts again, mostly hitting its own cached blocks). kv_sim divides by every
  attempt's prompt tokens instead, which a waiting prompt's retries would swell.
- utilization_mean / _p5: bytes allocated (pages held by running turns, or reserved ranges) / the KV bytes,
  over the ticks from warm-up (300 s) to the earlier of the two streams' last arrivals; a model's figure is its
  part of the same bytes, so the two add up to the pair's.
- token_utilization_mean / _p5: bytes holding usable KV (stored tokens and full cached blocks) / the KV bytes.
- slot_efficiency: bytes of stored tokens / bytes allocated, mean over the same ticks (a page's unused tail
  counts as allocated).
- peak_used_bytes: the most bytes allocated at any tick of the run; sim_seconds: when the last turn ended;
  sessions_served: sessions that ended without a refusal.
- series: every 120 s of the whole run, each model's bytes allocated and the pair's usable KV (/ the KV bytes).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, replace

from bench.kv_sim import GIB, Replay, SessionPlan, WorkloadConfig, _percentile, cached_blocks_of, make_workload
from pagedkv.kv.accounting import SharedKVBudget, kv_stats
from pagedkv.kv.spec import KVSpec

FALLBACK_GIB = 1.5
MIN_SESSION_TOKENS = 2048   # a useful pool holds one session of this many tokens of the widest model
SERIES_EVERY_S = 120
SPLITS = ("tokens", "bytes")


@dataclass(frozen=True)
class Model:
    """One model of the pair: its name (it namespaces its prefix hashes), KV geometry and workload seed."""
    name: str
    spec: KVSpec
    seed: int


@dataclass(frozen=True)
class Row:
    """One way of holding both models' KV: allocator, one pool or a static split, and whether turns wait."""
    allocator: str         # "paged" or "contiguous"
    pool: str              # "shared" (one SharedKVBudget) or "split" (a static share each)
    waits: bool            # wait / preempt as the engine does, instead of failing a refused turn
    split: str = "tokens"  # how a split divides the bytes: "tokens" (in proportion to bytes per token), "bytes"

    def __post_init__(self) -> None:
        if self.allocator not in ("paged", "contiguous"):
            raise ValueError(f"allocator must be 'paged' or 'contiguous', got {self.allocator!r}")
        if self.pool not in ("shared", "split") or (self.pool == "shared" and self.allocator != "paged"):
            raise ValueError(f"pool must be 'split', or 'shared' for a paged allocator; got {self.pool!r}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")


ROWS = {
    "contiguous": Row("contiguous", "split", False),
    "contiguous_equal_bytes": Row("contiguous", "split", False, "bytes"),
    "paged_split_no_wait": Row("paged", "split", False),
    "paged_shared_no_wait": Row("paged", "shared", False),
    "paged_shared": Row("paged", "shared", True),
}


def split_bytes(kv_bytes: int, bytes_per_token: list[int], how: str) -> list[int]:
    """Each model's static share of kv_bytes: the same number of tokens each ("tokens") or of bytes ("bytes")."""
    if how == "tokens":
        tokens = kv_bytes // sum(bytes_per_token)
        return [tokens * bpt for bpt in bytes_per_token]
    if how == "bytes":
        return [kv_bytes // len(bytes_per_token)] * len(bytes_per_token)
    raise ValueError(f"split must be one of {SPLITS}, got {how!r}")


class PairReplay:
    """Both models' kv_sim Replays of one row on one simulated clock, and the bytes they hold every tick."""

    def __init__(self, row: Row, models: list[Model], plans: list[list[SessionPlan]], cfg: WorkloadConfig,
                 kv_bytes: int, max_context: int = 2048) -> None:
        self.row, self.models, self.cfg, self.kv_bytes = row, models, cfg, kv_bytes
        self.bpt = [m.spec.bytes_per_token for m in models]
        self.page_bytes = SharedKVBudget.page_bytes_for(self.bpt)
        block_sizes = [SharedKVBudget.block_size_in(self.page_bytes, b, m.name) for m, b in zip(models, self.bpt)]
        self.shared: SharedKVBudget | None = None
        self.shares: list[int] | None = None
        if row.pool == "shared":
            self.shared = SharedKVBudget(kv_bytes, self.page_bytes)
            self.replays = [Replay("paged", p, cfg, kv_bytes, b, preempt=row.waits,
                                   manager=self.shared.add_model(m.name, m.spec))
                            for m, p, b in zip(models, plans, self.bpt)]
            self.unit_bytes = [self.page_bytes] * len(models)  # bytes of one used_blocks unit
        else:
            self.shares = split_bytes(kv_bytes, self.bpt, row.split)
            self.replays = [Replay(row.allocator, p, cfg, share, b, block_size=bs, contiguous_max_context=max_context,
                                   preempt=row.waits)
                            for p, share, b, bs in zip(plans, self.shares, self.bpt, block_sizes)]
            self.unit_bytes = [bs * b if row.allocator == "paged" else b for b, bs in zip(self.bpt, block_sizes)]
        self.window_end = min(r.last_arrival for r in self.replays)
        self.now = 0
        self.peak_used_bytes = 0
        self.samples: list[list[tuple[int, int, int]]] = [[] for _ in models]  # per model: (used, stored, held) B
        self.series: list[list[float]] = []

    @property
    def done(self) -> bool:
        return all(r.done for r in self.replays)

    def held_bytes(self) -> list[tuple[int, int, int]]:
        """Per model, now: (bytes allocated, bytes of stored tokens, bytes holding usable KV incl. cached)."""
        out = []
        for r, unit, bpt in zip(self.replays, self.unit_bytes, self.bpt):
            paged = r.kind == "paged"
            st = kv_stats(r.alloc) if paged else r.alloc.stats()
            cached = cached_blocks_of(r.alloc) if self.shared else st.cached_blocks if paged else 0
            stored = st.physical_tokens * bpt
            out.append((st.used_blocks * unit, stored, stored + cached * r.block_size * bpt))
        return out

    def tick(self) -> None:
        """One simulated second of both streams (the one served first alternates), then a sample."""
        order = self.replays if self.now % 2 == 0 else self.replays[::-1]
        for r in order:
            if not r.done:
                r.tick()
        held = self.held_bytes()
        used = sum(h[0] for h in held)
        self.peak_used_bytes = max(self.peak_used_bytes, used)
        if self.cfg.warmup_s <= self.now <= self.window_end:
            for samples, h in zip(self.samples, held):
                samples.append(h)
        if self.now % SERIES_EVERY_S == 0:
            self.series.append([self.now, *(round(h[0] / self.kv_bytes, 4) for h in held),
                                round(sum(h[2] for h in held) / self.kv_bytes, 4)])
        self.now += 1

    def run(self) -> dict:
        while not self.done:
            self.tick()
        return self.result()

    def _bytes_metrics(self, samples: list[tuple[int, int, int]]) -> dict:
        if not samples:
            raise ValueError(f"no tick between the warm-up ({self.cfg.warmup_s} s) and the earlier last arrival "
                             f"({self.window_end} s): more sessions or a shorter warm-up")
        util = [u / self.kv_bytes for u, _, _ in samples]
        tok = [h / self.kv_bytes for _, _, h in samples]
        eff = [s / u for u, s, _ in samples if u]
        return {"utilization_mean": sum(util) / len(util), "utilization_p5": _percentile(util, 0.05),
                "token_utilization_mean": sum(tok) / len(tok), "token_utilization_p5": _percentile(tok, 0.05),
                "slot_efficiency": sum(eff) / len(eff) if eff else 1.0}

    def result(self) -> dict:
        """The metrics described in the module docstring, per model and for the pair."""
        models, rs = {}, [r.result() for r in self.replays]
        for i, (m, r, res) in enumerate(zip(self.models, self.replays, rs)):
            turns = res["turns_started"] - res["deferred_ticks"] - res["preemptions"]
            models[m.name] = {
                "turns": turns, "turns_failed": res["turns_failed"],
                "oom_rate": res["turns_failed"] / turns if turns else 0.0,
                "sessions": res["sessions"], "sessions_served": res["sessions_served"],
                "max_context_tokens": res["max_context_tokens"],
                **self._bytes_metrics(self.samples[i]),
                "prefix_hit_rate": r.alloc.prefix_hit_rate if r.kind == "paged" else 0.0,
                "preemptions": res["preemptions"], "deferred_ticks": res["deferred_ticks"],
                "mean_wait_s": res["deferred_ticks"] / turns if turns else 0.0,
                "sim_seconds": res["sim_seconds"], "realloc_copied_tokens": res["realloc_copied_tokens"],
                "bytes_per_token": self.bpt[i], "allocator_config": res["config"],
            }
            if self.shared is not None:
                models[m.name]["page_fill"] = self.shared.page_fill()[r.alloc.namespace]
            else:
                models[m.name]["kv_bytes_share"] = self.shares[i]
        paged = [r.alloc for r in self.replays if r.kind == "paged"]
        lookups = sum(a.num_lookup_tokens for a in paged)
        turns = sum(v["turns"] for v in models.values())
        failed = sum(v["turns_failed"] for v in models.values())
        pair = {
            "turns": turns, "turns_failed": failed, "oom_rate": failed / turns if turns else 0.0,
            "sessions": sum(v["sessions"] for v in models.values()),
            "sessions_served": sum(v["sessions_served"] for v in models.values()),
            "max_context_tokens": max(v["max_context_tokens"] for v in models.values()),
            **self._bytes_metrics([tuple(map(sum, zip(*hs))) for hs in zip(*self.samples)]),
            "prefix_hit_rate": sum(a.num_hit_tokens for a in paged) / lookups if lookups else 0.0,
            "preemptions": sum(v["preemptions"] for v in models.values()),
            "deferred_ticks": sum(v["deferred_ticks"] for v in models.values()),
            "mean_wait_s": sum(v["deferred_ticks"] for v in models.values()) / turns if turns else 0.0,
            "peak_used_bytes": self.peak_used_bytes, "ticks_sampled": len(self.samples[0]),
            "sim_seconds": self.now,
        }
        return {**asdict(self.row), "models": models, "pair": pair,
                "series": {"every_s": SERIES_EVERY_S, "columns": ["t", *(f"utilization {m.name}" for m in self.models),
                                                                    "token_utilization pair"],
                           "rows": self.series}}


def run_rows(models: list[Model], cfg: WorkloadConfig, kv_bytes: int, max_context: int = 2048,
             rows: dict[str, Row] = ROWS) -> dict:
    """Every row on the same sessions (each model's plans drawn once from its seed)."""
    plans = [make_workload(cfg, m.seed) for m in models]
    return {name: PairReplay(row, models, plans, cfg, kv_bytes, max_context).run() for name, row in rows.items()}


# -- the budget: the two models' ledgers ----------------------------------------------------------------------------
def model_files() -> dict:
    """name -> GGUF of the pair (SmolLM2 from the models cache, the synthetic 1.5B written on first use)."""
    from bench.harness.model_ledger import CACHE, model_path  # CPython only: converts the files
    from pagedkv.model.convert import fetch_smollm2_gguf

    return {"SmolLM2-135M-Instruct": fetch_smollm2_gguf(CACHE / "models"),
            "synthetic-1.5b": model_path("synthetic-1.5b")}


def pair_plan(budget_bytes: int, files: dict) -> dict:
    """Both models' ledgers at budget_bytes and the KV memory their fixed costs leave."""
    from bench.harness.model_ledger import model_ledger

    keep = ("file", "weights_bytes", "scratch_bytes", "staging_bytes", "fixed_bytes", "bytes_per_token", "kv_bytes")
    ledgers = {}
    for name, path in files.items():
        full = model_ledger(path, budget_bytes=budget_bytes, kv_dtype="f16", refusal_mib=())
        ledgers[name] = {k: full[k] for k in keep}
        ledgers[name]["kv_bytes_alone"] = ledgers[name].pop("kv_bytes")
        ledgers[name]["kv_spec"] = {k: full["config"][c] for k, c in (("num_layers", "n_layers"),
                                                                       ("num_kv_heads", "n_kv_heads"),
                                                                       ("head_dim", "head_dim"))}
    fixed = sum(v["fixed_bytes"] for v in ledgers.values())
    kv = budget_bytes - fixed
    page = SharedKVBudget.page_bytes_for([v["bytes_per_token"] for v in ledgers.values()])
    pages = max(0, kv) // page
    return {"budget_bytes": budget_bytes, "models": ledgers, "fixed_bytes": fixed, "kv_bytes": kv,
            "page_bytes": page, "num_pages": pages, "widest_model_tokens": pages * 16}


def choose_budget(requested_bytes: int, files: dict) -> tuple[dict, str | None, dict | None]:
    """(the plan run, the note saying why it is not the requested budget, the requested budget's plan)."""
    plan = pair_plan(requested_bytes, files)
    if plan["widest_model_tokens"] >= MIN_SESSION_TOKENS:
        return plan, None, None
    why = (f"at {requested_bytes / GIB:g} GiB the two models' weights, scratch and staging ({plan['fixed_bytes']:,} B) "
           f"leave {plan['kv_bytes']:,} B of KV: {plan['num_pages']} pages of 16 synthetic-1.5b tokens = "
           f"{plan['widest_model_tokens']:,} tokens, fewer than one {MIN_SESSION_TOKENS:,}-token session")
    fallback = int(FALLBACK_GIB * GIB)
    if requested_bytes >= fallback:
        raise SystemExit(why + "; raise --budget-gib")
    plan_fb = pair_plan(fallback, files)
    if plan_fb["widest_model_tokens"] < MIN_SESSION_TOKENS:
        raise SystemExit(why + f"; {FALLBACK_GIB:g} GiB is short too; raise --budget-gib")
    return plan_fb, why + f"; ran at {FALLBACK_GIB:g} GiB instead", plan


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the full JSON result")
    ap.add_argument("--budget-gib", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="100 sessions per model instead of 200")
    ap.add_argument("--no-tab", action="store_true", help="skip the tab's part (two models streaming at once in "
                    "headless Chromium: bench/two_models_tab.py)")
    args = ap.parse_args(argv)
    if args.budget_gib <= 0:
        ap.error("--budget-gib must be positive")
    plan, note, requested = choose_budget(int(args.budget_gib * GIB), model_files())
    models = [Model(name, KVSpec(**v["kv_spec"], dtype="f16"), args.seed + i)
              for i, (name, v) in enumerate(plan["models"].items())]
    for m in models:
        if m.spec.bytes_per_token != plan["models"][m.name]["bytes_per_token"]:
            raise RuntimeError(f"{m.name}: KVSpec gives {m.spec.bytes_per_token} B/token, its ledger "
                               f"{plan['models'][m.name]['bytes_per_token']}")
    sessions = 100 if args.quick else 200
    cfg = replace(WorkloadConfig(), num_sessions=sessions, mean_arrival_gap_s=2 * WorkloadConfig().mean_arrival_gap_s)
    out = {
        "budget_requested_bytes": int(args.budget_gib * GIB), "budget_bytes": plan["budget_bytes"],
        "budget_note": note, "ledger": plan, "ledger_at_requested_budget": requested,
        "kv_bytes": plan["kv_bytes"], "seeds": {m.name: m.seed for m in models},
        "workload": asdict(cfg),
        "load_note": (f"each model: {sessions} sessions, one every {cfg.mean_arrival_gap_s:g} s on average (half of "
                      f"kv_sim's sessions at half its rate): the pair's arrivals are one kv_sim run's"),
        "contiguous_split": ("contiguous and paged_split_no_wait: the KV bytes split in proportion to bytes per "
                             "token (the same number of tokens each, for two equal loads); contiguous_equal_bytes: "
                             "half the bytes each"),
        "contiguous_max_context": 2048,
        "rows": run_rows(models, cfg, plan["kv_bytes"]),
    }
    if not args.no_tab:  # both models streaming in the tab, alone vs together (its docstring says which models)
        from bench.two_models_tab import measure

        out["tab"] = measure(24 if args.quick else 48)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    keys = ("oom_rate", "turns_failed", "max_context_tokens", "utilization_mean", "utilization_p5",
            "token_utilization_mean", "slot_efficiency", "prefix_hit_rate", "preemptions", "mean_wait_s")
    print(note or f"budget {plan['budget_bytes'] / GIB:g} GiB", f"KV {plan['kv_bytes']:,} B")
    for name, row in out["rows"].items():
        print(f"== {name}")
        for who, r in [*row["models"].items(), ("pair", row["pair"])]:
            print(f"  {who:24s} " + "  ".join(f"{k} {r[k]:.4g}" for k in keys))


if __name__ == "__main__":
    main()
