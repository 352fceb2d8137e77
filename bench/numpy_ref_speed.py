"""Numpy reference forward speed on the converted model: prefill and decode tokens per second.

    python3 bench/numpy_ref_speed.py [--model DIR] [--prompt-lens 64,256] [--decode 32]

Prints one JSON object. Figures depend on the machine and on BLAS threading
(OPENBLAS_NUM_THREADS=1 avoids thread thrash on a busy 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache  # noqa: E402
from pagedkv.model.weights import ModelWeights  # noqa: E402
from pagedkv.model_runner import ForwardBatch  # noqa: E402

BLOCK_SIZE = 16


def i32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=ROOT / "dist" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--prompt-lens", default="64,256")
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="one 64-token prompt, 8 decode steps")
    args = parser.parse_args()
    if args.quick:
        args.prompt_lens, args.decode = "64", 8

    t0 = time.perf_counter()
    weights = ModelWeights.load(args.model)
    load_s = time.perf_counter() - t0
    model = NumpyModel(weights)
    rng = np.random.default_rng(0)
    runs = []
    for n in (int(x) for x in args.prompt_lens.split(",")):
        total = n + args.decode
        num_blocks = -(-total // BLOCK_SIZE)
        kv = PagedKVCache.allocate(model.config, num_blocks, BLOCK_SIZE)
        table = i32([rng.permutation(num_blocks)])  # (1, num_blocks), scattered
        ids = rng.integers(0, model.config.vocab, n)
        slots = i32([table[0, p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(total)])
        t0 = time.perf_counter()
        logits = model.forward(ForwardBatch(i32(ids), i32(np.arange(n)), slots[:n], i32([0, n]), table, i32([n])), kv)
        prefill_s = time.perf_counter() - t0
        token = int(logits[0].argmax())
        t0 = time.perf_counter()
        for p in range(n, total):
            batch = ForwardBatch(i32([token]), i32([p]), slots[p : p + 1], i32([0, 1]), table, i32([p + 1]))
            token = int(model.forward(batch, kv)[0].argmax())
        decode_s = time.perf_counter() - t0
        runs.append(
            {
                "prompt_tokens": n,
                "prefill_tok_per_s": round(n / prefill_s, 1),
                "decode_tokens": args.decode,
                "decode_tok_per_s": round(args.decode / decode_s, 2),
            }
        )
    print(
        json.dumps(
            {
                "model": str(args.model),
                "load_and_dequantize_s": round(load_s, 2),
                "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "numpy": np.__version__,
                "runs": runs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
