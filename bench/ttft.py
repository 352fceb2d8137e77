"""Time to first token for turns 1..5 of one conversation, with and without prefix caching.

    python3 -m bench.ttft [--turns 5] [--quick]

The real SmolLM2-135M, greedy, through LLMEngine: on WebGPU in headless Chromium (SwiftShader on this
machine) and on the numpy CPU backend in CPython, each with prefix caching on and off. Turn k's prompt
is the conversation so far (a 200-token system prompt, earlier user messages and answers) plus a
40-token user message; answers are 8 tokens. With the cache, turn k should prefill only its new tokens.
Prints JSON (`python3 -m bench` files it). Figures only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads: BLAS threads thrash on 2 shared cores

from bench import ROOT, emit  # noqa: E402
from bench.harness import install_bench, session  # noqa: E402
from bench.page.ttft_turns import conversation_ttft  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL_DIR = ROOT / "dist" / "models" / "smollm2-135m-instruct"

WEB = """
import json
from bench.page.ttft_turns import conversation_ttft
from bench.page.webgpu_engine import bench_backend
from pagedkv.tokenizer import Tokenizer
_ctx, _b, _m, _ledger = await bench_backend()
_rows = {{}}
# A short conversation first records the step plans (one per batch-shape bucket), outside the figures.
await conversation_ttft(_b, Tokenizer.from_manifest(_m), True, turns=2, system_tokens=24, user_tokens=8,
                        answer_tokens=2, seed=99)
for _on in (True, False):
    _rows["on" if _on else "off"] = await conversation_ttft(_b, Tokenizer.from_manifest(_m), _on, **{shape!r})
_b.destroy()
json.dumps(_rows)
"""


def cpu_rows(shape: dict) -> dict:
    """Both passes on the numpy CPU backend (pool sized for the whole conversation)."""
    from pagedkv.backends.cpu import CpuBackend
    from pagedkv.engine import run_sync
    from pagedkv.model.weights import ModelWeights, read_manifest
    from pagedkv.tokenizer import Tokenizer

    weights = ModelWeights.load(MODEL_DIR)
    tok = Tokenizer.from_manifest(read_manifest(MODEL_DIR))
    rows = {}
    for on in (True, False):
        backend = CpuBackend(weights, num_blocks=256, block_size=16)
        rows["on" if on else "off"] = run_sync(conversation_ttft(backend, tok, on, **shape))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 turns, 32-token system prompt, 8-token messages, "
                                                             "4-token answers")
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be >= 1")
    shape = {"turns": args.turns, "system_tokens": 200, "user_tokens": 40, "answer_tokens": 8}
    if args.quick:
        shape.update(turns=2, system_tokens=32, user_tokens=8, answer_tokens=4)
    report = {"benchmark": "ttft", **shape, "model": "smollm2-135m-instruct"}
    report["cpu_numpy"] = cpu_rows(shape)
    print(json.dumps(report["cpu_numpy"]), file=sys.stderr)
    with session() as page:
        install_bench(page, "page/ttft_turns.py", "page/webgpu_engine.py")
        report["webgpu"] = page.py(WEB.format(shape=shape))
        report["adapter"] = json.loads(page.dataset()["adapter"])["name"]
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    emit(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
