"""Benchmark of the whole-model WebGPU backend in headless Chromium (SwiftShader on this machine): one request,
or (--concurrency) several at once.

    python3 build.py && python3 -m bench.webgpu_engine [--runs 3] [--prompt 128] [--new 32] [--model M]
    python3 build.py && python3 -m bench.webgpu_engine --concurrency [--quick] [--skip-real]

One request (results/webgpu_engine.json): the ledger breakdown under a 1 GiB budget,
prefill and decode tok/s of SmolLM2-135M through LLMEngine + WebGpuBackend (one request, random prompt,
greedy), with the pipelined decode (decode_chain.py: step n + 1 submitted before step n's ids are read) and
without it by turns in one session (median_plain), a decode step's wall time split into the replay (encode +
GPU + read back of S ids) and the Python controller around it, its host time (wall less the wait for the
GPU: Python and the JS encode) and wait, Python->JS crossings per step, and the decode plan replayed with one workgroup
per dispatch (a floor on the per-dispatch cost), the dispatches per step of each recorded plan, and the decode
step's GPU time split by kind of dispatch (the plan replayed with only that kind left in).

--concurrency (results/concurrency.json): generated tok/s with 1, 2, 4, 8 concurrent conversations, batched (the
engine's continuous batching, all requests queued at once) vs one at a time (each queued after the previous
finished), on the tiny model and on SmolLM2-135M (short replies); plus swap (out + in) vs recompute (one
prefill) wall time per preempted block count on the tiny model.

Prints JSON (`python3 -m bench` files it). Figures only; never asserts on time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from bench import emit
from bench.harness import install_bench, session


def one_request(args) -> dict:
    """Prefill / decode of one request on SmolLM2-135M, and where a decode step's time goes."""
    if args.quick:
        args.runs, args.prompt, args.new = 2, 64, 8
    with session() as page:
        install_bench(page, "page/webgpu_engine.py")
        page.py("from bench.page.webgpu_engine import *\nNone")
        ledger = page.py(f"import json\n_ctx, _b, _m, _ledger = await bench_backend(model={args.model!r})\n"
                         "json.dumps(_ledger)")
        print(json.dumps(ledger), file=sys.stderr)
        runs, plain = [], []
        for _ in range(args.runs):  # pipelined and plain by turns, one run each, so the noise falls on both
            for pipeline, into in ((True, runs), (False, plain)):
                into += page.py(f"import json\njson.dumps(await bench_generate(_ctx, _b, _m, {args.prompt}, "
                                f"{args.new}, 1, pipeline={pipeline}))")
        floor = page.py("import json\njson.dumps(await bench_dispatch_floor(_ctx, _b))")
        dispatches = page.py("import json\njson.dumps(plan_dispatches(_b))")
        split = page.py("import json\njson.dumps(await bench_kernel_split(_ctx, _b))")
        page.py("_b.destroy()\nNone")
        adapter = json.loads(page.dataset()["adapter"])
    keys = ("prefill_tok_s", "decode_tok_s", "decode_step_ms", "decode_replay_ms", "decode_backend_python_ms",
            "decode_controller_ms", "decode_host_ms", "decode_wait_ms")
    med = {k: statistics.median(r[k] for r in runs[1:] or runs) for k in keys}  # run 0 records the plans
    med_plain = {k: statistics.median(r[k] for r in plain[1:] or plain) for k in keys}
    report = {"adapter": adapter["name"], "model": args.model, "prompt_tokens": args.prompt,
              "new_tokens": args.new, "runs": runs, "median": med, "ledger_1gib": ledger,
              "plain_runs": plain, "median_plain": med_plain,
              "pipelined_vs_plain_decode_tok_s": med["decode_tok_s"] / med_plain["decode_tok_s"],
              "same_ids": [r["output_ids"] for r in runs] == [r["output_ids"] for r in plain],
              "decode_plan_one_workgroup_per_dispatch": floor, "dispatches_per_step": dispatches,
              "decode_step_gpu_ms_by_kernel": split}
    return report


def concurrency(args) -> dict:
    """Batched vs one-at-a-time tok/s at several concurrencies, and swap vs recompute of preempted blocks."""
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
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model of dist/models/ (one request)")
    parser.add_argument("--concurrency", action="store_true", help="several conversations at once instead")
    parser.add_argument("--quick", action="store_true", help="--runs 2 --prompt 64 --new 8; with --concurrency: "
                                                             "1, 2, 4 conversations (SmolLM2: 2, 16-token "
                                                             "prompts), one run each, fewer tokens and block counts")
    parser.add_argument("--skip-real", action="store_true", help="with --concurrency: tiny model only")
    args = parser.parse_args(argv)
    emit(concurrency(args) if args.concurrency else one_request(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
