"""The LM head's top ids on the device against the numpy reference: a check of the card, not a figure.

    python3 bench/device/lm_head_check.py [--vocab N] [--hidden N] [--seed N] [--top N]

A random Q8_0 LM head (SmolLM2-135M's shape by default, 49,152 x 576, every row drawn on its own) times one
RMS-normalised activation row, run by each matvec the plan may record for it on this adapter (the cpu family's;
the gpu family's with subgroups or its workgroup tree; its f16 dot products where the adapter has shader-f16),
then the gpu family's argmax over the logits. Each is compared with the f64 numpy product of the dequantized
weights: the `top` best ids in order (lower id first on ties), and the argmax. The reference's gaps between
consecutive top ids are printed next to the kernel's largest error, so a mismatch can be read as a real fault
(an error far below the gap) or a near tie. Prints one JSON document; exits 1 when an id differs where the
reference's gap is more than 4 times the kernel's largest error.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "py")]

from pagedkv.backends.webgpu import model_kernels as ops  # noqa: E402
from pagedkv.model.layout import dequantize, pack_q8_0, quantize_q8_0  # noqa: E402


def top_ids(logits: np.ndarray, n: int) -> list[int]:
    """The n best ids, value descending, lower id first among equal values (argmax's order)."""
    return np.lexsort((np.arange(len(logits)), -logits.astype(np.float64)))[:n].tolist()


async def run_call(ctx, call: ops.KernelCall, buffers: list) -> None:
    pipeline = await ctx.kernel(call.shader, dict(call.constants))
    params = ctx.upload(np.frombuffer(call.params, np.uint8), f"{call.shader}.params", uniform=True)
    ctx.dispatch(pipeline, [*buffers, params], call.workgroups)
    await ctx.done()


async def check(vocab: int, hidden: int, seed: int, top: int) -> dict:
    from pagedkv.backends.webgpu.native import NativeDevice

    ctx = await NativeDevice.create()
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((vocab, hidden), dtype=np.float32) * 0.05  # (vocab, hidden)
    parts = pack_q8_0(*quantize_q8_0(w))
    x = rng.standard_normal(hidden).astype(np.float32)
    x /= np.sqrt(np.mean(x.astype(np.float64) ** 2))  # (hidden,) what the final norm hands the LM head
    want = dequantize("q8_0", (vocab, hidden), parts).astype(np.float64) @ x.astype(np.float64)  # (vocab,)
    want_top = top_ids(want, top)
    gaps = [float(want[a] - want[b]) for a, b in zip(want_top, want_top[1:])]
    qs, scales = (ctx.upload(np.frombuffer(p, np.uint8), name) for name, p in parts.items())
    xb = ctx.upload(x[None, :], "x")
    features = ctx.info.features
    calls = {"cpu": ops.matvec_call("q8_0", vocab, hidden, 1),
             "gpu_tree": ops.matvec_gpu_call("q8_0", vocab, hidden, 1, subgroups=False)}
    if "subgroups" in features:
        calls["gpu_sg"] = ops.matvec_gpu_call("q8_0", vocab, hidden, 1, subgroups=True)
    if "shader-f16" in features:
        calls["gpu_f16"] = ops.matvec_gpu_call("q8_0", vocab, hidden, 1, "subgroups" in features, f16=True)
    rows, ok = [], True
    for name, call in calls.items():
        y = ctx.buffer(vocab * 4, "logits", readable=True)
        await run_call(ctx, call, [qs, scales, xb, y])
        got = await ctx.read_array(y, np.float32, (vocab,))
        ids = ctx.buffer(16, "ids", readable=True)
        await run_call(ctx, ops.argmax_call(vocab, 1, family="gpu"), [y, ids])
        argmax = int((await ctx.read_array(ids, np.uint32, (1,)))[0])
        err = float(np.abs(got - want).max())
        got_top = top_ids(got, top)
        # a differing place counts as a fault only where the reference separates the two ids by 4x the error
        faults = [i for i, (g, r) in enumerate(zip(got_top, want_top))
                  if g != r and (i == len(gaps) or gaps[i] > 4 * err) and (i == 0 or gaps[i - 1] > 4 * err)]
        faults += [-1] if argmax != want_top[0] and gaps[0] > 4 * err else []
        ok &= not faults
        rows.append({"kernel": call.shader, "variant": name, "top_ids": got_top, "argmax": argmax,
                     "equal": got_top == want_top and argmax == want_top[0], "max_abs_error": err,
                     "faults": faults})
        y.destroy()
        ids.destroy()
    return {"check": "lm_head_top_ids", "ok": ok, "adapter": ctx.info.name, "vocab": vocab, "hidden": hidden,
            "seed": seed, "reference": "f64 numpy of the dequantized Q8_0 weights", "want_top_ids": want_top,
            "want_gaps": gaps, "variants": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576, help="a multiple of 32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    if args.hidden % 32 or args.vocab < args.top or args.top < 2:
        parser.error("--hidden must be a multiple of 32 and --vocab at least --top, which is at least 2")
    t0 = time.perf_counter()
    result = asyncio.run(check(args.vocab, args.hidden, args.seed, args.top))
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
