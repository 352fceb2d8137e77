"""Concurrency benchmark in headless Chromium on WebGPU (SwiftShader on this machine).

    python3 build.py && python3 -m bench.concurrency [--quick]

Generated tok/s with 1, 2, 4, 8 concurrent conversations, batched (the engine's continuous batching, all
requests queued at once) vs one at a time (each queued after the previous finished), on the tiny model and on
SmolLM2-135M (short replies); plus swap (out + in) vs recompute (one prefill) wall time per preempted block
count on the tiny model. Prints JSON (`python3 -m bench` files it). Figures only, never asserts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from bench import emit
from bench.harness import install_bench, session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1, 2, 4 conversations (SmolLM2: 2, 16-token "
                                                             "prompts), one run each, fewer tokens and block counts")
    parser.add_argument("--skip-real", action="store_true", help="tiny model only")
    args = parser.parse_args(argv)
    levels = [1, 2, 4] if args.quick else [1, 2, 4, 8]
    real_levels = [2] if args.quick else levels
    tiny_new, real_new = (8, 4) if args.quick else (32, 16)
    real_prompt = 16 if args.quick else 32
    tiny_runs = 1 if args.quick else 3
    blocks = [1, 4] if args.quick else [1, 2, 4, 8, 16]
    report = {"quick": args.quick, "note": "SwiftShader (CPU) WebGPU on a 2-core machine shared with other jobs: "
                                           "noisy; compare columns of one run"}
    # The page's own model is the tiny one on the CPU backend, so it does not compete for the GPU budget.
    with session() as s:
        install_bench(s, "page/webgpu_engine.py", "page/concurrency.py")
        s.py("from bench.page.concurrency import *\nNone")
        report["adapter"] = s.page.evaluate("JSON.parse(document.documentElement.dataset.adapter)")["name"]
        report["tiny"] = s.py(f"import json\njson.dumps(await throughput('tiny-random', {levels}, 32, {tiny_new}, 64, "
                              f"runs={tiny_runs}))")
        print(json.dumps(report["tiny"]), file=sys.stderr, flush=True)
        if not args.skip_real:
            report["smollm2"] = s.py(f"import json\njson.dumps(await throughput('smollm2-135m-instruct', "
                                     f"{real_levels}, {real_prompt}, {real_new}, 512))")
            print(json.dumps(report["smollm2"]), file=sys.stderr, flush=True)
        report["swap_vs_recompute"] = s.py(f"import json\njson.dumps(await preemption_cost({blocks}))")
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    emit(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
