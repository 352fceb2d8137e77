"""Quality cost of bounded KV: sliding window (with / without attention sinks) and importance eviction.

    python3 -m bench.kv_quality_window [--quick] [--partial FILE] [--reference FILE.npz] [--model DIR]

Corpus: CPython's own `pydoc_data/topics.py` (the library reference topics, natural English with some
code), its topics joined in sorted order and tokenized with our tokenizer; the full run uses the first
20,480 tokens in 10 segments of 2,048 (--quick: one segment of 256, a 64-token window). Each segment is a fresh
conversation fed through the engine's own scheduler, cache manager, retention policy and model runner
on the numpy CPU engine (real SmolLM2-135M, f32), all logits kept. Reported per policy: perplexity of
the segment's tokens and greedy next-token agreement with full attention over the same segment; the
"_tail" figures only count positions past the largest window, where every window has dropped blocks.

Speed (pagedkv/evaluate.py): each (policy, segment) pair is a lane with its own scheduler and pool; the
lanes of a group run in one forward per step, so a window's one-block steps become tall products,
and BLAS runs one thread. The chunking of each lane is the one it has alone (its scheduler decides),
and tests/test_bench_kv_lanes.py checks that stacked lanes score exactly what lanes alone score.

Then a long run past the model's 8,192-token context (full run only): one 9,216-token stretch under
window + sinks, the perplexity of the continuation past 8,192 tokens, for both RoPE position modes.
Prints one JSON object. CPU engine, not the browser: timings are not the point here.
"""
from __future__ import annotations

import os

# One BLAS thread: on 2 shared cores a second OpenBLAS thread spin-waits for a core other jobs hold, and a
# 160-row product ran 7x slower with two threads than with one (measured under load ~9).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from pagedkv.evaluate import Lane, run_lanes  # noqa: E402
from pagedkv.kv.retention import KVRetention  # noqa: E402
from pagedkv.model.weights import ModelWeights  # noqa: E402
from pagedkv.tokenizer import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BLOCK_SIZE = 16
CHUNK = 256  # prefill tokens per step where the policy allows it
CORPUS = "CPython pydoc_data/topics.py (topics sorted, joined by blank lines)"


def corpus_tokens(tokenizer: Tokenizer) -> list[int]:
    """Token ids of pydoc_data.topics (topics in sorted key order, blank line between)."""
    from pydoc_data.topics import topics
    return tokenizer.encode("\n\n".join(topics[k] for k in sorted(topics)))


def ppl(logp: np.ndarray) -> float:
    return float(np.exp(-logp.mean()))


def policies(seg_len: int, windows: list[int], h2o_percents: list[int]) -> list[dict[str, tuple]]:
    """Groups of name -> (retention, pool blocks, chunk tokens per step); each group runs as one set of
    lanes. H2O budgets: a share of the segment's blocks, half of it the most recent tokens (never
    evicted), the rest kept by attention mass; one more block for the step. Eviction is fed one block per
    step, as decode would feed it (a 256-token chunk would need 16 blocks beyond the budget)."""
    seg_blocks = seg_len // BLOCK_SIZE
    groups: list[dict[str, tuple]] = []
    mid = windows[len(windows) // 2]
    for w in windows:
        group = {f"window_{w}_no_sinks": (KVRetention(window_tokens=w, sink_tokens=0), w // BLOCK_SIZE + 1, CHUNK),
                 f"window_{w}_4_sinks": (KVRetention(window_tokens=w, sink_tokens=4), w // BLOCK_SIZE + 2, CHUNK)}
        if w == mid:
            group[f"window_{w}_4_sinks_original_positions"] = (
                KVRetention(window_tokens=w, sink_tokens=4, positions="original"), w // BLOCK_SIZE + 2, CHUNK)
        groups.append(group)
    h2o = {}
    for pct in h2o_percents:
        budget = seg_blocks * pct // 100
        if budget < 2:  # half of it goes to the most recent tokens, at least one block each side
            raise ValueError(f"H2O {pct}% of a {seg_len}-token segment is {budget} block(s); it needs at least 2")
        h2o[f"h2o_{pct}pct"] = (KVRetention(evict=True, sink_tokens=4, recent_tokens=budget // 2 * BLOCK_SIZE),
                                budget + 1, BLOCK_SIZE)
    if h2o:
        groups.insert(1, h2o)  # right after the smallest window: a partial run then holds both families
    return groups


def run_group(weights: ModelWeights, group: dict[str, tuple], segments: list[list[int]]) -> dict[str, list[Lane]]:
    """Every policy of the group over every segment, as one set of lanes; name -> lanes in segment order."""
    lanes = {name: [Lane(f"{name}/{k}", seg, r, pool, chunk, BLOCK_SIZE) for k, seg in enumerate(segments)]
             for name, (r, pool, chunk) in group.items()}
    run_lanes(weights, [lane for ls in lanes.values() for lane in ls], BLOCK_SIZE)
    return lanes


def full_reference(weights: ModelWeights, segments: list[list[int]], cache: Path | None) -> dict[str, np.ndarray]:
    """Full attention over every segment: logp and greedy, each (segments, segment_tokens - 1). With
    `cache`, loaded from that .npz when it holds these very segments, else computed and saved there."""
    tokens = np.asarray(segments, np.int64)  # (segments, segment_tokens)
    if cache is not None and cache.exists():
        saved = np.load(cache)
        if np.array_equal(saved["tokens"], tokens):
            return {"logp": saved["logp"], "greedy": saved["greedy"], "seconds": float(saved["seconds"])}
    t0 = time.perf_counter()
    pool = len(segments[0]) // BLOCK_SIZE + 1
    lanes = run_group(weights, {"full_attention": (None, pool, CHUNK)}, segments)["full_attention"]
    ref = {"logp": np.stack([x.logp for x in lanes]), "greedy": np.stack([x.greedy for x in lanes]),
           "seconds": round(time.perf_counter() - t0, 1)}
    if cache is not None:
        np.savez(cache, tokens=tokens, **ref)
    return ref


def policy_row(logp: np.ndarray, greedy: np.ndarray, full: dict, tail: slice) -> dict:
    """logp, greedy (segments, segment_tokens - 1) -> the table row (full: full_reference's arrays)."""
    agree = greedy == full["greedy"]  # (segments, segment_tokens - 1)
    return {"ppl": round(ppl(logp), 3), "ppl_tail": round(ppl(logp[:, tail]), 3),
            "agreement": round(float(agree.mean()), 4), "agreement_tail": round(float(agree[:, tail].mean()), 4)}


def long_run(weights: ModelWeights, tokens: list[int], context: int, window: int, block_size: int) -> dict:
    """Window + sinks over a stretch longer than the model's context: perplexity past `context`, for both
    RoPE position modes (two lanes). Blocks of `block_size` tokens (64: a quarter of the steps of 16, so
    the CPU run stays short; the 4 sink tokens then keep their whole first block of 64)."""
    t0 = time.perf_counter()
    pool = window // block_size + 2
    lanes = {name: Lane(name, tokens, KVRetention(window_tokens=window, sink_tokens=4, positions=name), pool,
                        CHUNK, block_size) for name in ("shifted", "original")}
    run_lanes(weights, list(lanes.values()), block_size)
    result = {"tokens": len(tokens), "model_context": context, "window_tokens": window, "sink_tokens": 4,
              "block_size": block_size, "engine": "numpy CPU (f32 KV)"}
    for name, lane in lanes.items():
        result[name] = {"ppl_before_context": round(ppl(lane.logp[:context - 1]), 3),
                        "ppl_past_context": round(ppl(lane.logp[context - 1:]), 3),
                        "max_blocks_held": lane.max_blocks_held}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"long run: {result}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "dist" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--quick", action="store_true", help="1 x 256 tokens, window 64, no long run")
    parser.add_argument("--long-only", action="store_true", help="only the run past the model's context")
    parser.add_argument("--no-long", action="store_true", help="skip the run past the model's context")
    parser.add_argument("--long-block-size", type=int, default=64)
    parser.add_argument("--policies", default="", help="only policies whose name contains this")
    parser.add_argument("--h2o", help="H2O budgets, percent of a segment's blocks (default 10,20,50; with "
                                      "--quick 25,50: a 256-token segment has 16 blocks)")
    parser.add_argument("--partial", type=Path, default=None,
                        help="rewrite this JSON after every group; rows it already holds are not rerun")
    parser.add_argument("--reference", type=Path, default=None,
                        help=".npz cache of the full-attention logp / greedy ids (reused across runs)")
    args = parser.parse_args()
    t_start = time.perf_counter()
    weights = ModelWeights.load(args.model)
    tokenizer = Tokenizer.from_manifest(weights.manifest)
    corpus = corpus_tokens(tokenizer)
    context = weights.config.context_length
    if args.long_only:
        result = {"corpus": CORPUS, "long_run": long_run(weights, corpus[:context + 1024], context, 1024,
                                                         args.long_block_size),
                  "wall_s": round(time.perf_counter() - t_start, 1)}
        print(json.dumps(result, indent=2))
        return
    seg_len, n_seg, windows = (256, 1, [64]) if args.quick else (2048, 10, [256, 512, 1024])
    segments = [corpus[i * seg_len:(i + 1) * seg_len] for i in range(n_seg)]
    tail = slice(max(windows) + BLOCK_SIZE, None)  # positions where every window differs from full attention
    result = {
        "corpus": CORPUS, "corpus_tokens_available": len(corpus), "tokens_scored": n_seg * (seg_len - 1),
        "segments": n_seg, "segment_tokens": seg_len, "block_size": BLOCK_SIZE, "engine": "numpy CPU (f32 KV)",
        "tail_from_position": tail.start, "policies": {}, "groups": [],
    }
    if args.partial is not None and args.partial.exists():
        done = json.loads(args.partial.read_text())
        if (done["segments"], done["segment_tokens"]) == (n_seg, seg_len):
            result["policies"], result["groups"] = done["policies"], done["groups"]
    full = full_reference(weights, segments, args.reference)
    result["policies"]["full_attention"] = {**policy_row(full["logp"], full["greedy"], full, tail),
                                            "max_blocks_held": seg_len // BLOCK_SIZE, "pool_blocks": seg_len // BLOCK_SIZE + 1}
    result["full_attention_seconds"] = full["seconds"]
    h2o = [int(p) for p in (args.h2o or ("25,50" if args.quick else "10,20,50")).split(",") if p]
    for group in policies(seg_len, windows, h2o):
        group = {name: spec for name, spec in group.items()
                 if args.policies in name and name not in result["policies"]}
        if not group:
            continue
        t0 = time.perf_counter()
        for name, ls in run_group(weights, group, segments).items():
            row = policy_row(np.stack([x.logp for x in ls]), np.stack([x.greedy for x in ls]), full, tail)
            result["policies"][name] = {**row, "max_blocks_held": max(x.max_blocks_held for x in ls),
                                        "pool_blocks": group[name][1],
                                        "evicted_blocks": sum(x.num_evicted_blocks for x in ls),
                                        "shifted_blocks": sum(x.shifted_blocks for x in ls)}
            print(f"{name}: {result['policies'][name]}", file=sys.stderr, flush=True)
        result["groups"].append({"policies": list(group), "lanes": len(group) * n_seg,
                                 "seconds": round(time.perf_counter() - t0, 1)})
        print(f"group: {result['groups'][-1]}", file=sys.stderr, flush=True)
        if args.partial is not None:
            args.partial.write_text(json.dumps(result, indent=2) + "\n")
    if not (args.quick or args.no_long):
        result["long_run"] = long_run(weights, corpus[:context + 1024], context, 1024, args.long_block_size)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
