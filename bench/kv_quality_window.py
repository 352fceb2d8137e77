"""Quality cost of bounded KV: sliding window (with / without attention sinks) and importance eviction.

    python3 -m bench.kv_quality_window [--quick] [--model DIR]

Corpus: CPython's own `pydoc_data/topics.py` (the library reference topics, natural English with some
code), its topics joined in sorted order and tokenized with our tokenizer; the full run uses the first
20,480 tokens in 10 segments of 2,048 (--quick: one segment of 256, a 64-token window). Each segment is a fresh
conversation fed through the engine's own scheduler, cache manager, retention policy and model runner
on the numpy CPU engine (real SmolLM2-135M, f32), all logits kept. Reported per policy: perplexity of
the segment's tokens and greedy next-token agreement with full attention over the same segment.

Then a long run past the model's 8,192-token context (full run only): one 9,216-token stretch under
window + sinks, the perplexity of the continuation past 8,192 tokens, for both RoPE position modes.
Prints one JSON object. CPU engine, not the browser: timings are not the point here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from . import _path  # noqa: F401
from pagedkv.backends.cpu import CpuBackend
from pagedkv.config import CacheConfig
from pagedkv.engine import run_sync
from pagedkv.kv_cache_manager import KVCacheManager
from pagedkv.kv_retention import KVRetention, add_attention_mass
from pagedkv.model.weights import ModelWeights
from pagedkv.model_runner import build_batch
from pagedkv.request import Request
from pagedkv.scheduler import Scheduler, SchedulerConfig
from pagedkv.sequence import Sequence
from pagedkv.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
BLOCK_SIZE = 16
CHUNK = 256  # prefill tokens per step where the policy allows it


def corpus_tokens(tokenizer: Tokenizer) -> list[int]:
    """Token ids of pydoc_data.topics (topics in sorted key order, blank line between)."""
    from pydoc_data.topics import topics
    return tokenizer.encode("\n\n".join(topics[k] for k in sorted(topics)))


def log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """logits (n, vocab) f32, targets (n,) -> (n,) log p(target)."""
    m = logits.max(axis=1, keepdims=True)  # (n, 1)
    lse = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]  # (n,)
    return logits[np.arange(len(targets)), targets] - lse


def evaluate(weights: ModelWeights, tokens: list[int], retention: KVRetention | None, pool_blocks: int,
             chunk: int = CHUNK, block_size: int = BLOCK_SIZE) -> dict:
    """Feed `tokens` as one prompt through scheduler + manager + runner; per predicted token (len - 1,):
    log-prob of the true next token and the greedy choice. Also the most blocks held."""
    backend = CpuBackend(weights, num_blocks=pool_blocks, block_size=block_size)
    kv = KVCacheManager(CacheConfig(num_blocks=pool_blocks, block_size=block_size, enable_prefix_caching=False))
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=chunk, max_num_seqs=1), kv)
    req = Request("segment", Sequence(tokens), num_prompt_tokens=len(tokens), max_tokens=1, retention=retention)
    sched.add(req)
    seq, n_tok = req.seq, len(tokens)
    logp = np.zeros(n_tok - 1, np.float64)  # (len - 1,)
    greedy = np.zeros(n_tok - 1, np.int64)  # (len - 1,)
    track = retention is not None and retention.evict
    held = shifted = steps = 0
    while seq.num_computed_tokens < n_tok:
        out = sched.schedule()
        if out.preempted:
            raise RuntimeError(f"the policy preempted the only sequence ({retention}); give it more blocks")
        run_sync(backend.copy_blocks(out.copies))
        run_sync(backend.shift_keys(out.shifts))
        shifted += len(out.shifts)
        batch = build_batch(out.scheduled, block_size)
        mass = np.zeros(batch.block_tables.shape, np.float32) if track else None  # (1, max_blocks)
        logits = backend.model.forward(batch, backend.kv, all_logits=True, attention_mass=mass)  # (n, vocab)
        if track:
            add_attention_mass([seq], mass)
        start, n = seq.num_computed_tokens, out.scheduled[0][1]
        rows = min(n, n_tok - 1 - start)  # the last token predicts nothing we can score
        if rows > 0:
            logp[start:start + rows] = log_softmax_at(logits[:rows], np.asarray(tokens[start + 1:start + 1 + rows]))
            greedy[start:start + rows] = logits[:rows].argmax(axis=1)
        seq.num_computed_tokens += n
        held = max(held, len(seq.block_table))
        steps += 1
    return {"logp": logp, "greedy": greedy, "max_blocks_held": held, "evicted_blocks": sched.num_evicted_blocks,
            "shifted_blocks": shifted, "steps": steps}


def ppl(logp: np.ndarray) -> float:
    return float(np.exp(-logp.mean()))


def policies(seg_len: int, windows: list[int]) -> dict[str, tuple[KVRetention, int]]:
    """name -> (retention, pool blocks). H2O budgets: a fraction of the segment's blocks, half of it the
    most recent tokens (never evicted), the rest kept by attention mass; one more block for the step."""
    seg_blocks = seg_len // BLOCK_SIZE
    out: dict[str, tuple[KVRetention, int]] = {}
    for w in windows:
        out[f"window_{w}_no_sinks"] = (KVRetention(window_tokens=w, sink_tokens=0), w // BLOCK_SIZE + 1)
        out[f"window_{w}_4_sinks"] = (KVRetention(window_tokens=w, sink_tokens=4), w // BLOCK_SIZE + 2)
    w = windows[len(windows) // 2]
    out[f"window_{w}_4_sinks_original_positions"] = (
        KVRetention(window_tokens=w, sink_tokens=4, positions="original"), w // BLOCK_SIZE + 2)
    for frac in (0.2, 0.5):
        budget = int(seg_blocks * frac)
        recent = budget // 2 * BLOCK_SIZE
        out[f"h2o_{int(frac * 100)}pct"] = (KVRetention(evict=True, sink_tokens=4, recent_tokens=recent),
                                            budget + 1)
    return out


def long_run(weights: ModelWeights, tokens: list[int], context: int, window: int, block_size: int) -> dict:
    """Window + sinks over a stretch longer than the model's context: perplexity past `context`, for both
    RoPE position modes. Blocks of `block_size` tokens (64: a quarter of the steps of 16, so the CPU run
    stays short; the 4 sink tokens then keep their whole first block of 64)."""
    result = {"tokens": len(tokens), "model_context": context, "window_tokens": window, "sink_tokens": 4,
              "block_size": block_size, "engine": "numpy CPU (f32 KV)"}
    for name, r in (("shifted", KVRetention(window_tokens=window, sink_tokens=4)),
                    ("original", KVRetention(window_tokens=window, sink_tokens=4, positions="original"))):
        t0 = time.perf_counter()
        res = evaluate(weights, tokens, r, pool_blocks=window // block_size + 2, block_size=block_size)
        result[name] = {"ppl_before_context": round(ppl(res["logp"][:context - 1]), 3),
                        "ppl_past_context": round(ppl(res["logp"][context - 1:]), 3),
                        "max_blocks_held": res["max_blocks_held"], "seconds": round(time.perf_counter() - t0, 1)}
        print(f"long run {name}: {result[name]}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "dist" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--quick", action="store_true", help="1 x 256 tokens, window 64, no long run")
    parser.add_argument("--long-only", action="store_true", help="only the run past the model's context")
    parser.add_argument("--long-block-size", type=int, default=64)
    parser.add_argument("--policies", default="", help="only policies whose name contains this")
    args = parser.parse_args()
    t_start = time.perf_counter()
    weights = ModelWeights.load(args.model)
    tokenizer = Tokenizer.from_manifest(weights.manifest)
    corpus = corpus_tokens(tokenizer)
    context = weights.config.context_length
    if args.long_only:
        result = {"corpus": "CPython pydoc_data/topics.py (topics sorted, joined by blank lines)",
                  "long_run": long_run(weights, corpus[:context + 1024], context, 1024, args.long_block_size),
                  "wall_s": round(time.perf_counter() - t_start, 1)}
        print(json.dumps(result, indent=2))
        return
    seg_len, n_seg, windows = (256, 1, [64]) if args.quick else (2048, 10, [256, 512, 1024])
    segments = [corpus[i * seg_len:(i + 1) * seg_len] for i in range(n_seg)]
    full = [evaluate(weights, seg, None, seg_len // BLOCK_SIZE + 1) for seg in segments]
    full_logp = np.concatenate([f["logp"] for f in full])
    full_greedy = np.concatenate([f["greedy"] for f in full])
    tail = slice(max(windows) + BLOCK_SIZE, None)  # positions where every window differs from full attention
    tail_full = np.concatenate([f["logp"][tail] for f in full])
    rows = {"full_attention": {"ppl": round(ppl(full_logp), 3), "ppl_tail": round(ppl(tail_full), 3),
                               "agreement": 1.0, "max_blocks_held": seg_len // BLOCK_SIZE}}
    print(f"full: {rows['full_attention']}", file=sys.stderr, flush=True)
    for name, (r, pool) in policies(seg_len, windows).items():
        if args.policies not in name:
            continue
        t0 = time.perf_counter()
        # Eviction needs room for one step beyond its budget: feed it a block per step.
        res = [evaluate(weights, seg, r, pool, chunk=BLOCK_SIZE if r.evict else CHUNK) for seg in segments]
        logp = np.concatenate([x["logp"] for x in res])
        agree = np.concatenate([x["greedy"] for x in res]) == full_greedy
        rows[name] = {"ppl": round(ppl(logp), 3),
                      "ppl_tail": round(ppl(np.concatenate([x["logp"][tail] for x in res])), 3),
                      "agreement": round(float(agree.mean()), 4),
                      "agreement_tail": round(float(np.concatenate([(x["greedy"] == f["greedy"])[tail]
                                                                    for x, f in zip(res, full)]).mean()), 4),
                      "max_blocks_held": max(x["max_blocks_held"] for x in res), "pool_blocks": pool,
                      "evicted_blocks": sum(x["evicted_blocks"] for x in res),
                      "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{name}: {rows[name]}", file=sys.stderr, flush=True)
    result = {
        "corpus": "CPython pydoc_data/topics.py (topics sorted, joined by blank lines)",
        "corpus_tokens_available": len(corpus), "tokens_scored": n_seg * (seg_len - 1),
        "segments": n_seg, "segment_tokens": seg_len, "block_size": BLOCK_SIZE, "engine": "numpy CPU (f32 KV)",
        "tail_from_position": tail.start, "policies": rows,
    }
    if not args.quick:
        result["long_run"] = long_run(weights, corpus[:context + 1024], context, 1024, args.long_block_size)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
