"""Why int4-asym and not per-channel key smoothing: errors of q.k on SmolLM2-135M's real keys and queries.

    python3 -m bench.studies.kv_key_smoothing [--window 512] [--model DIR]

One window (the first `--window` tokens of bench.kv_quality_dtypes' corpus) runs through the numpy forward
with an f32 cache; the post-RoPE queries and keys of every layer are kept. Each variant quantizes the keys
and reports the relative RMS error of the keys (original units) and of the attention scores q.k (RMS error
over the standard deviation of the scores; every 8th query against every 4th key, all layers and heads),
which is what the softmax sees. Variants:
  int4 / int4-asym                   the registered dtypes (pagedkv.kv.dtypes);
  int4 + smoothing (...)             keys stored as k / s and queries as q * s, s = 2^e per (layer, kv head,
                                     RoPE pair), e from the pair's RMS magnitude in these very rows (an upper
                                     bound for any factor a calibration text or the weights could give):
                                     "k": e = round(log2 |k|) - median, "k, down only": e >= 0 only,
                                     "q-aware": e = round(0.5 log2 |k| - 0.3 log2 |q|) - median (the best of
                                     a small grid), q.k itself is unchanged bit for bit;
  int4-asym g16                      16 channels per (step, minimum) instead of 32 (12 u32 per row, not 10);
  per-channel over 16-token blocks   KIVI's key layout (min / max per channel over a block of tokens), float
                                     estimate of what a block-quantized cache would reach (not a dtype here).
Prints one JSON document.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np

from bench.kv_quality_dtypes import ROOT, corpus_ids, real_kv_rows, rel_rms
from pagedkv.backends import numpy_ref
from pagedkv.backends.numpy_ref import NumpyModel
from pagedkv.kv.dtypes import KVDtype, dequantize_with, kv_dtype, quantize_with
from pagedkv.model.weights import ModelWeights, read_manifest
from pagedkv.tokenizer import Tokenizer


def rotated_qk(model: NumpyModel, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Post-RoPE queries (layers, n, n_heads, head_dim) and keys (layers, n, n_kv_heads, head_dim) of one window."""
    seen: list[np.ndarray] = []
    rope = numpy_ref.rope_adjacent

    def keep(x, positions, inv_freq):
        out = rope(x, positions, inv_freq)
        seen.append(out)
        return out

    with mock.patch.object(numpy_ref, "rope_adjacent", keep):
        real_kv_rows(model, ids)
    return np.stack(seen[0::2]), np.stack(seen[1::2])  # _attention rotates q, then k, layer by layer


def pair_rms(x: np.ndarray) -> np.ndarray:
    """(layers, n, heads, head_dim) -> (layers, heads, head_dim / 2) RMS norm of each RoPE pair over tokens."""
    pairs = x.reshape(x.shape[:3] + (-1, 2))
    return np.sqrt((pairs ** 2).sum(-1).mean(1))


def smoothing(log_mag: np.ndarray, down_only: bool = False) -> np.ndarray:
    """(layers, n_kv, head_dim / 2) log2 magnitudes -> per-channel factors 2^e, (layers, 1, n_kv, head_dim)."""
    e = np.rint(log_mag - np.median(log_mag, axis=-1, keepdims=True))
    if down_only:
        e = np.maximum(e, 0)
    return np.repeat(2.0 ** e, 2, axis=-1)[:, None].astype(np.float32)


def round_trip_with(k: np.ndarray, dt: KVDtype, s: np.ndarray | None = None) -> np.ndarray:
    """Keys after quantization with dt, smoothed by s (divided before, multiplied after) when given."""
    s = np.ones((1,), np.float32) if s is None else s
    return dequantize_with(*quantize_with(k / s, dt), dt) * s


def per_channel_blocks(k: np.ndarray, block: int = 16, levels: int = 15) -> np.ndarray:
    """KIVI-style keys: min / max per (layer, kv head, channel) over each block of `block` tokens (float)."""
    n = k.shape[1] // block * block
    kb = k[:, :n].reshape(k.shape[0], n // block, block, *k.shape[2:])  # (layers, blocks, block, n_kv, hd)
    lo = kb.min(2, keepdims=True)
    d = (kb.max(2, keepdims=True) - lo) / levels
    out = np.clip(np.rint((kb - lo) / np.where(d > 0, d, 1)), 0, levels) * d + lo
    return np.concatenate([out.reshape(k.shape[0], n, *k.shape[2:]), k[:, n:]], axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / "dist" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--window", type=int, default=512)
    args = parser.parse_args()
    model = NumpyModel(ModelWeights.load(args.model))
    ids = corpus_ids(Tokenizer.from_manifest(read_manifest(args.model)), args.window)
    q, k = rotated_qk(model, ids)
    layers, n, n_kv, hd = k.shape
    qg = q.reshape(layers, n, n_kv, -1, hd)  # (layers, n, n_kv, q_per_kv, head_dim)
    scores = np.einsum("lqhgd,lkhd->lhgqk", qg[:, ::8], k[:, ::4])

    def errors(approx: np.ndarray) -> dict:
        got = np.einsum("lqhgd,lkhd->lhgqk", qg[:, ::8], approx[:, ::4])
        return {"k_rel_rms": round(rel_rms(k, approx), 4),
                "score_rel_err": round(float(np.sqrt(np.mean((got - scores) ** 2) / scores.var())), 4)}

    int4, asym = kv_dtype("int4"), kv_dtype("int4-asym")
    log_k, log_q = np.log2(pair_rms(k)), np.log2(pair_rms(qg.reshape(layers, n, -1, hd)).reshape(layers, n_kv, -1,
                                                                                                 hd // 2).mean(2))
    q_aware = smoothing(0.5 * log_k - 0.3 * log_q)
    variants = {
        "int4": errors(round_trip_with(k, int4)),
        "int4 + smoothing (k)": errors(round_trip_with(k, int4, smoothing(log_k))),
        "int4 + smoothing (k, down only)": errors(round_trip_with(k, int4, smoothing(log_k, down_only=True))),
        "int4 + smoothing (q-aware)": errors(round_trip_with(k, int4, q_aware)),
        "int4-asym": errors(round_trip_with(k, asym)),
        "int4-asym + smoothing (q-aware)": errors(round_trip_with(k, asym, q_aware)),
        "int4-asym g16": errors(round_trip_with(k, KVDtype("int4-asym-g16", 4, 16, 5, qmax=15, asymmetric=True))),
        "per-channel over 16-token blocks": errors(per_channel_blocks(k)),
    }
    print(json.dumps({"benchmark": "kv_key_smoothing", "model": args.model.name, "window": args.window,
                      "corpus": "first window of bench.kv_quality_dtypes' corpus", "keys": variants}, indent=2))


if __name__ == "__main__":
    main()
