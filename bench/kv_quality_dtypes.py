"""Quality and capacity of each KV cache dtype on the real SmolLM2-135M (numpy CPU engine path).

    python3 -m bench.kv_quality_dtypes [--quick] [--tokens N] [--window 512] [--model DIR]

Corpus: the topic texts of CPython's own `pydoc_data/topics.py` (the reference documentation shipped with
the interpreter: natural English with some code), joined in sorted topic order and tokenized with our
tokenizer; the first N tokens are used (20,480 by default, one 256-token window with --quick).
Quality: chunked perplexity with a fixed window (stride = window): each window is one prefill through the
paged forward (backends/numpy_ref.py) whose K/V pools hold the dtype's quantized values, so every token
attends to quantized keys and values exactly as on the GPU. Greedy agreement: the share of positions
whose argmax equals the f32 run's. Row error: relative RMS error of K and V rows of real activations
(first window) after the round trip, int8 with a per-head scale vs 32-channel groups (why int8 uses groups).
Capacity: max tokens under a 1 GiB GPU budget, from WebGpuBackend's own plan (ledger: weights + scratch +
staging first, then kv_blocks_that_fit), with the default 256 batched tokens / 16 sequences / 16-token blocks.
Prints one JSON document.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache  # noqa: E402
from pagedkv.model_runner import ForwardBatch  # noqa: E402
from pagedkv.backends.webgpu.memory_plan import plan_kv_pool  # noqa: E402
from pagedkv.gpu_budget import GIB  # noqa: E402
from pagedkv.kv.dtypes import KV_DTYPES, KVDtype, dequantize_with, quantize_with, round_trip  # noqa: E402
from pagedkv.model.weights import ModelWeights, read_manifest  # noqa: E402
from pagedkv.tokenizer import Tokenizer  # noqa: E402

BLOCK_SIZE = 16
WEBGPU_DEFAULT_MAX_BINDING = 128 << 20  # the WebGPU default maxStorageBufferBindingSize


def corpus_ids(tokenizer: Tokenizer, n_tokens: int) -> list[int]:
    """The first n_tokens of pydoc_data.topics' texts, in sorted topic order."""
    from pydoc_data import topics

    ids: list[int] = []
    for name in sorted(topics.topics):
        ids.extend(tokenizer.encode(topics.topics[name] + "\n\n", allow_special=False))
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    raise ValueError(f"the corpus has only {len(ids)} tokens, fewer than the {n_tokens} asked for")


def window_logits(model: NumpyModel, ids: list[int], kv_dtype: str) -> np.ndarray:
    """All-token logits (n, vocab) of one window prefilled from an empty cache of `kv_dtype`."""
    n = len(ids)
    blocks = -(-n // BLOCK_SIZE)
    kv = PagedKVCache.allocate(model.config, blocks, BLOCK_SIZE, kv_dtype)
    table = np.arange(blocks, dtype=np.int32)[::-1].copy()[None]  # (1, blocks), scattered (reversed)
    pos = np.arange(n, dtype=np.int32)
    slots = (table[0][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE).astype(np.int32)
    batch = ForwardBatch(np.asarray(ids, np.int32), pos, slots, np.asarray([0, n], np.int32), table,
                         np.asarray([n], np.int32))
    return model.forward(batch, kv, all_logits=True)  # (n, vocab)


def window_scores(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """(summed negative log-likelihood of targets (n,), argmax (n,)) of logits (n, vocab)."""
    logits = logits.astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return -float(logp[np.arange(targets.size), targets].sum()), logits.argmax(axis=1)


def evaluate(model: NumpyModel, ids: list[int], window: int, dtypes: list[str], partial: Path | None,
             extra: dict) -> dict:
    """Perplexity and agreement with f32 (dtypes[0]) per dtype, window by window (all dtypes of a window
    before the next, so a partial file written after each window is a consistent table)."""
    acc = {name: {"nll": 0.0, "agree": 0, "seconds": 0.0} for name in dtypes}
    count = 0
    starts = list(range(0, len(ids) - 1, window))
    for w, start in enumerate(starts):
        chunk = ids[start:start + window + 1]
        targets = np.asarray(chunk[1:])
        ref_top = None
        for name in dtypes:
            t0 = time.perf_counter()
            nll, top = window_scores(window_logits(model, chunk[:-1], name), targets)
            a = acc[name]
            a["nll"] += nll
            a["seconds"] += time.perf_counter() - t0
            if ref_top is None:
                ref_top = top
            a["agree"] += int((top == ref_top).sum())
        count += targets.size
        table = summarize(acc, count)
        print(f"window {w + 1}/{len(starts)}: {count} tokens " +
              " ".join(f"{n} {r['perplexity']:.3f}/{r['agreement_vs_f32']:.4f}" for n, r in table.items()),
              file=sys.stderr, flush=True)
        if partial is not None:
            partial.write_text(json.dumps({"tokens_done": count, "windows_done": w + 1, "windows": len(starts),
                                           "quality": table, **extra}, indent=2))
    return summarize(acc, count)


def summarize(acc: dict, count: int) -> dict:
    f32 = math.exp(next(iter(acc.values()))["nll"] / count)
    out = {}
    for name, a in acc.items():
        ppl = math.exp(a["nll"] / count)
        out[name] = {"perplexity": round(ppl, 4), "delta_ppl_vs_f32": round(ppl - f32, 4),
                     "agreement_vs_f32": round(a["agree"] / count, 5), "seconds": round(a["seconds"], 1)}
    return out


def real_kv_rows(model: NumpyModel, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Post-RoPE K and V rows (layers * n, n_kv_heads, head_dim) of one window, f32 cache."""
    cfg = model.config
    n = len(ids)
    pos = np.arange(n, dtype=np.int32)
    kv = PagedKVCache.allocate(cfg, -(-n // BLOCK_SIZE), BLOCK_SIZE)
    table = np.arange(kv.num_blocks, dtype=np.int32)[None]
    batch = ForwardBatch(np.asarray(ids, np.int32), pos, pos, np.asarray([0, n], np.int32), table,
                         np.asarray([n], np.int32))
    model.forward(batch, kv)
    ks = [kv.k[i].reshape(-1, cfg.n_kv_heads, cfg.head_dim)[:n] for i in range(cfg.n_layers)]
    vs = [kv.v[i].reshape(-1, cfg.n_kv_heads, cfg.head_dim)[:n] for i in range(cfg.n_layers)]
    return np.concatenate(ks), np.concatenate(vs)


def rel_rms(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x - y) ** 2) / np.mean(x ** 2)))


def row_errors(k: np.ndarray, v: np.ndarray) -> dict:
    """Relative RMS round-trip error of real K/V rows per dtype, plus int8 with one scale per head."""
    variants = dict(KV_DTYPES)
    variants["int8-per-head"] = KVDtype("int8-per-head", 8, 1 << 30, 2, qmax=127)
    variants["int4-per-head"] = KVDtype("int4-per-head", 4, 1 << 30, 4, qmax=7)
    out = {}
    for name, dt in variants.items():
        if dt.quantized:
            rk = dequantize_with(*quantize_with(k, dt), dt)
            rv = dequantize_with(*quantize_with(v, dt), dt)
        else:
            rk, rv = round_trip(k, name), round_trip(v, name)
        out[name] = {"k_rel_rms": round(rel_rms(k, rk), 6), "v_rel_rms": round(rel_rms(v, rv), 6)}
    return out


def capacity(manifest: dict, dtypes: list[str]) -> dict:
    """Max KV tokens under 1 GiB per dtype, from the WebGPU backend's ledger plan."""
    out = {}
    for name in dict.fromkeys([*dtypes, "f16"]):  # f16 is the baseline of vs_f16 even when not evaluated
        plan = plan_kv_pool(manifest, budget_bytes=GIB, block_size=BLOCK_SIZE, kv_dtype=name,
                            max_num_batched_tokens=256, max_num_seqs=16, max_binding=WEBGPU_DEFAULT_MAX_BINDING)
        out[name] = {"bytes_per_token": plan["bytes_per_token"], "num_blocks": plan["num_blocks"],
                     "max_tokens": plan["num_blocks"] * BLOCK_SIZE, "fixed_bytes": plan["fixed_bytes"]}
    base = out["f16"]["max_tokens"]
    for name in out:
        out[name]["vs_f16"] = round(out[name]["max_tokens"] / base, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "dist" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--quick", action="store_true", help="one 256-token window instead of 20,480 tokens "
                                                             "in windows of 512")
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--window", type=int, default=None, help="512 (256 with --quick)")
    parser.add_argument("--dtypes", default=",".join(KV_DTYPES))
    parser.add_argument("--partial", type=Path, default=None, help="rewrite this JSON after every window")
    args = parser.parse_args()
    args.window = args.window or (256 if args.quick else 512)
    n_tokens = args.tokens or (args.window if args.quick else 20480)
    dtypes = args.dtypes.split(",")
    if dtypes[0] != "f32":
        raise SystemExit("--dtypes must start with f32 (the reference)")

    manifest = read_manifest(args.model)
    weights = ModelWeights.load(args.model)
    model = NumpyModel(weights)
    tokenizer = Tokenizer.from_manifest(manifest)
    ids = corpus_ids(tokenizer, n_tokens + 1)
    k, v = real_kv_rows(model, ids[:args.window])
    extra = {"row_error_real_kv": row_errors(k, v), "capacity_1gib": capacity(manifest, dtypes)}
    results = evaluate(model, ids, args.window, dtypes, args.partial, extra)
    print(json.dumps({
        "model": str(args.model.name), "corpus": "CPython pydoc_data/topics.py topic texts (sorted topics)",
        "python": sys.version.split()[0], "tokens": n_tokens, "window": args.window, "stride": args.window,
        "block_size": BLOCK_SIZE, "quality": results, **extra,
    }, indent=2))


if __name__ == "__main__":
    main()
