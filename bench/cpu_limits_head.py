"""How many of Gemma 3 270M's 262,144 head rows a PROVABLE screen must keep: the measured case against a
candidate-only head for greedy decoding on the tab's CPU path (issue 51).

    python3 -m bench.cpu_limits_head [--prompts 2] [--steps 4]

A candidate-only head computes a cheap score S_r for every row r with a bound B_r >= |S_r - E_r| on its distance
from the exact logit E_r (the kernel's: the q8_0 codes times 16-bit activations x16), then E_r only for the rows
with S_r + B_r >= max_r (S_r - B_r): every other row's E_r is below the largest exact logit, so the argmax is
among the candidates. The bounds here are Cauchy-Schwarz's, row by row, from the screen's error vectors (the
tightest bound that needs no knowledge of x beyond its norm):
- q4: S = w4 . x8, w4 the row requantized to 4-bit codes with a min (q4_1, the fast 4-bit layout, half the
  bytes); B = |w4| |x8 - x16| + |w4 - w| |x16|.
- x8: S = w . x8, the same 8-bit codes with 8-bit activations (no bytes saved, only cheaper arithmetic);
  B = |w| |x8 - x16|.
Both bounds leave out f32 rounding, which would only widen them. The hidden states are the numpy reference's, at
the first `--steps` greedy steps of the first `--prompts` prompts of tests/golden/gemma3_golden.json. It prints
JSON: per step the candidates each screen keeps, the top-3 exact logits, and max |S - E| / B (how loose the bound
is against the error it bounds).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from bench import ROOT, emit

GOLDEN = ROOT / "tests" / "golden" / "gemma3_golden.json"


def hidden_states(prompts: list[list[int]], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The head (vocab, hidden) f32 and (prompts * steps, hidden) f32: the normed final hidden state it multiplies
    at each greedy step."""
    sys.path.insert(0, str(ROOT / "tests"))
    from model_fixtures import cached_gemma3_gguf

    from pagedkv.backends.cpu import CpuBackend
    from pagedkv.engine import EngineConfig, LLMEngine, run_sync
    from pagedkv.model.convert import convert_cached
    from pagedkv.model.weights import ModelWeights, read_manifest
    from pagedkv.sampling import SamplingParams
    from pagedkv.tokenizer import Tokenizer

    converted = convert_cached(cached_gemma3_gguf(), ROOT / ".cache" / "models")
    weights = ModelWeights.load(converted)
    head = weights.tensors["token_embd.weight"]  # (vocab, hidden) f32, the q8_0 rows dequantized exactly
    seen: list[np.ndarray] = []

    class Recorder:  # the tied embedding: lookups pass through, the head product records its input
        __array_ufunc__ = None
        shape = head.shape

        def __getitem__(self, rows):
            return head[rows]

        @property
        def T(self):  # noqa: N802  (ndarray's name)
            return self

        def __rmatmul__(self, x):
            seen.append(np.array(x, np.float32))
            return x @ head.T

    backend = CpuBackend(weights, 64, 16)
    backend.model.w["token_embd.weight"] = Recorder()
    engine = LLMEngine(backend, Tokenizer.from_manifest(read_manifest(converted)),
                       EngineConfig(enable_prefix_caching=False))
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=steps, stop_token_ids=(10**6,)))
        while engine.has_unfinished:
            run_sync(engine.step())
    return head, np.concatenate(seen)


def requantize_q4(w: np.ndarray) -> np.ndarray:
    """(rows, cols) -> the same rows through 4-bit codes and a min per 32-weight block (q4_1), dequantized."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32)
    lo, hi = blocks.min(axis=2, keepdims=True), blocks.max(axis=2, keepdims=True)
    d = (hi - lo) / 15
    codes = np.clip(np.rint((blocks - lo) / np.where(d > 0, d, 1)), 0, 15)
    return (codes * d + lo).astype(np.float32).reshape(rows, cols)


def main(argv: list[str] | None = None) -> int:
    from pagedkv.backends.cpu_wasm import quantize_activations

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="--prompts 1 --steps 2")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.steps = 1, 2
    t0 = time.perf_counter()
    cases = json.loads(GOLDEN.read_text())["cases"][:args.prompts]
    w, xs = hidden_states([c["prompt_ids"] for c in cases], args.steps)
    w4 = requantize_q4(w)
    w64, w4_64 = w.astype(np.float64), w4.astype(np.float64)
    norm_w, norm_w4 = np.linalg.norm(w64, axis=1), np.linalg.norm(w4_64, axis=1)
    norm_e = np.linalg.norm(w4_64 - w64, axis=1)
    rows = []
    for x in xs:
        dequant = {}
        for bits in (16, 8):
            _, d, q = quantize_activations(x, bits)
            dequant[bits] = (d[:, None].astype(np.float64) * q).reshape(-1)
        exact = w64 @ dequant[16]
        gap = np.linalg.norm(dequant[8] - dequant[16])
        screens = {"q4": (w4_64 @ dequant[8], norm_w4 * gap + norm_e * np.linalg.norm(dequant[16])),
                   "x8": (w64 @ dequant[8], norm_w * gap)}
        row = {"top3_exact": [round(float(v), 3) for v in np.sort(exact)[-3:][::-1]]}
        for name, (score, bound) in screens.items():
            keep = np.flatnonzero(score + bound >= (score - bound).max())
            if int(exact.argmax()) not in set(keep.tolist()):
                raise AssertionError(f"the {name} screen dropped the argmax: its bound is wrong")
            row[f"{name}_candidates"] = int(keep.size)
            row[f"{name}_error_over_bound"] = round(float((np.abs(score - exact) / bound).max()), 4)
        rows.append(row)
    emit({"benchmark": "cpu_limits_head", "vocab": int(w.shape[0]), "hidden": int(w.shape[1]),
          "prompts": args.prompts, "steps": args.steps, "rows": rows,
          "median_candidates": {s: int(np.median([r[f"{s}_candidates"] for r in rows])) for s in ("q4", "x8")},
          "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_s": round(time.perf_counter() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
