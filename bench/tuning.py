"""The gpu family's first-boot tuning on this machine's native device (wgpu-py: lavapipe here), every candidate
timed (no budget): the matvec threads, matmul shapes, decode attention's split, and each projection's
(threads, row groups), for SmolLM2-135M's shapes (dispatch_geometry.SMOLLM2).

    python3 -m bench.tuning [--runs 2]

Prints JSON: per run, the timings (ms, GPU timestamps where the device has them) and the choice. Figures
only; never asserts on time. Not in `python3 -m bench`'s list (the kernels benchmarks time the shapes the
tuning picked); run it alone.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench import emit
from pagedkv.backends.webgpu import tuning
from pagedkv.backends.webgpu.dispatch_geometry import SMOLLM2
from pagedkv.backends.webgpu.native import NativeDevice


async def run(runs: int) -> dict:
    ctx = await NativeDevice.create()
    features = ctx.info.features
    out = {"adapter": ctx.info.name, "runs": []}
    for i in range(runs):
        store = tuning.JsonFileStore(Path(tempfile.mkdtemp()) / "tuning.json")  # a fresh cache: tune every run
        r = await tuning.tune(ctx, SMOLLM2, store, "bench.tuning", "subgroups" in features, "shader-f16" in features,
                              budget_ms=600_000.0)
        shapes = r["shapes"]
        out["runs"].append({"timings": r["timings"], "choice": {
            "matvec": shapes.matvec, "matmul": list(shapes.matmul), "split": shapes.split,
            "matvec_slots": {slot: [t, g] for slot, t, g in shapes.matvec_slots},
            "matvec_whole": list(shapes.matvec_whole)}})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    emit(asyncio.run(run(args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
