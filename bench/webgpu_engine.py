"""Benchmark of the whole-model WebGPU backend in headless Chromium (SwiftShader on this machine).

    python3 build.py && python3 -m bench.webgpu_engine [--runs 3] [--prompt 128] [--new 32]

Prints JSON (`python3 -m bench` files it): the ledger breakdown under a 1 GiB budget,
prefill and decode tok/s of SmolLM2-135M through LLMEngine + WebGpuBackend (one request, random prompt,
greedy), a decode step's wall time split into the replay (encode + GPU + read back of S ids) and the
Python controller around it, Python->JS crossings per step, and the decode plan replayed with one workgroup
per dispatch (a floor on the per-dispatch cost), the dispatches per step of each recorded plan, and the decode
step's GPU time split by kind of dispatch (the plan replayed with only that kind left in). Figures only; never
asserts on time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from bench import emit
from bench.harness import install_bench, session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="--runs 2 --prompt 64 --new 8")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.prompt, args.new = 2, 64, 8
    with session() as page:
        install_bench(page, "page/webgpu_engine.py")
        page.py("from bench.page.webgpu_engine import *\nNone")
        ledger = page.py("import json\n_ctx, _b, _m, _ledger = await bench_backend()\njson.dumps(_ledger)")
        print(json.dumps(ledger), file=sys.stderr)
        runs = page.py(f"import json\njson.dumps(await bench_generate(_ctx, _b, _m, {args.prompt}, {args.new}, "
                       f"{args.runs}))")
        floor = page.py("import json\njson.dumps(await bench_dispatch_floor(_ctx, _b))")
        dispatches = page.py("import json\njson.dumps(plan_dispatches(_b))")
        split = page.py("import json\njson.dumps(await bench_kernel_split(_ctx, _b))")
        page.py("_b.destroy()\nNone")
        adapter = json.loads(page.dataset()["adapter"])
    med = {k: statistics.median(r[k] for r in runs) for k in
           ("prefill_tok_s", "decode_tok_s", "decode_step_ms", "decode_replay_ms", "decode_backend_python_ms",
            "decode_controller_ms")}
    report = {"adapter": adapter["name"], "model": "smollm2-135m-instruct", "prompt_tokens": args.prompt,
              "new_tokens": args.new, "runs": runs, "median": med, "ledger_1gib": ledger,
              "decode_plan_one_workgroup_per_dispatch": floor, "dispatches_per_step": dispatches,
              "decode_step_gpu_ms_by_kernel": split}
    emit(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
