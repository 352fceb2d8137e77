"""Roofline of a decode step, paged vs contiguous attention by context, and the block-size trade-off.

    python3 -m bench.roofline [--quick]

In headless Chromium (WebGPU; SwiftShader on this machine), one page:
- the adapter's streaming-read bandwidth (shaders/stream_read.wgsl over 64 MiB): the local memory limit;
- its f32 multiply-add rate with operands in registers (shaders/alu_peak.wgsl): the local compute limit;
- the real SmolLM2-135M decode step (WebGpuBackend.forward, one sequence, greedy) at 256/1k/4k/8k
  context, against the bytes the step must read (weights + the live KV of its context): roofline time =
  bytes / bandwidth, fraction = roofline time / measured step time; the same against the flops the step
  must do (2 per weight, 4 per head dimension per context token for attention) at the compute limit;
  with the replay vs Python split and the Python->JS crossings per step;
- the paged attention kernel with a scattered vs an identity block table at the same contexts (alternated
  rounds, bench/page/kv_kernels.py's bench_paged_vs_contiguous), and at block sizes 8/16/32/64 (4k context).
In CPython: the slot efficiency and failure rate of kv_sim's workload (1 GiB) at each block size.
Prints JSON (`python3 -m bench` files it). Figures only; this machine's other jobs make them noisy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from bench import kv_sim
from bench import emit
from bench.harness import install_bench, session

CONTEXTS = (256, 1024, 4096, 8192)
BLOCK_SIZES = (8, 16, 32, 64)

SETUP = """
import json
from bench.page.kv_kernels import bench_paged_vs_contiguous
from bench.page.roofline import alu_peak_gflops, decode_step, stream_read_gb_s
from bench.page.webgpu_engine import bench_backend
_ctx, _b, _m, _ledger = await bench_backend()
_out = {{"ledger": _ledger, "stream_read": await stream_read_gb_s(_ctx), "alu_peak": await alu_peak_gflops(_ctx)}}
_out["config"] = _m["config"]
_out["decode_steps"] = [await decode_step(_b, c, reps={reps}) for c in {contexts!r}]
_b.destroy()
json.dumps(_out)
"""

ATTENTION = """
import json
try:
    _r = await bench_paged_vs_contiguous("decode", {context}, block_size={block_size}, dtype="f16", rounds={rounds})
except ValueError as exc:  # a block size the kernels do not support
    _r = {{"context": {context}, "block_size": {block_size}, "unsupported": str(exc)}}
json.dumps(_r)
"""


def slot_efficiency_by_block_size(sessions: int) -> list[dict]:
    """kv_sim's paged allocator (1 GiB, SmolLM2 f16 KV, seed 0) at each block size."""
    cfg = kv_sim.WorkloadConfig(num_sessions=sessions)
    plans = kv_sim.make_workload(cfg, 0)
    bpt = kv_sim.SMOLLM2_135M.bytes_per_token
    rows = []
    for bs in BLOCK_SIZES:
        r = kv_sim.simulate("paged", plans, cfg, kv_sim.GIB, bpt, block_size=bs)
        rows.append({"block_size": bs, "slot_efficiency": r["slot_efficiency"], "oom_rate": r["oom_rate"],
                     "utilization_mean": r["utilization_mean"], "prefix_hit_rate": r["prefix_hit_rate"]})
    return rows


def step_flops(config: dict, context: int) -> int:
    """Flops of one decode step of one sequence: a multiply-add per weight of every projection and the LM
    head, and per layer, head and context token one for q.k and one for p.v per head dimension."""
    h, f, d = config["hidden"], config["ffn"], config["head_dim"]
    per_layer = h * config["n_heads"] * d * 2 + h * config["n_kv_heads"] * d * 2 + 3 * h * f
    macs = config["n_layers"] * (per_layer + 2 * config["n_heads"] * d * context) + config["vocab"] * h
    return 2 * macs


def derive(web: dict) -> list[dict]:
    """Per context: the bytes a decode step must read and the flops it must do, and the fraction of each
    roofline (memory: bytes / streaming bandwidth; compute: flops / multiply-add rate) the step reaches."""
    weights = web["ledger"]["by_kind"]["weights"]
    bpt = web["ledger"]["by_kind"]["kv"] // web["ledger"]["kv_tokens"]
    gb_s = web["stream_read"]["gb_s_best"]
    gflops = web["alu_peak"]["gflops_best"]
    rows = []
    for step in web["decode_steps"]:
        nbytes = weights + step["context"] * bpt
        roof_ms = nbytes / gb_s / 1e6
        flops = step_flops(web["config"], step["context"])
        alu_ms = flops / gflops / 1e6
        rows.append({"context": step["context"], "bytes_read": nbytes, "roofline_ms": round(roof_ms, 2),
                     "step_ms": round(step["step_ms"], 2), "fraction_of_roofline": round(roof_ms / step["step_ms"], 4),
                     "fraction_best_sample": round(roof_ms / step["step_ms_min"], 4),
                     "flops": flops, "compute_roofline_ms": round(alu_ms, 2),
                     "fraction_of_compute_roofline": round(alu_ms / step["step_ms"], 4),
                     "compute_fraction_best_sample": round(alu_ms / step["step_ms_min"], 4)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, 200-session block-size sweep")
    args = parser.parse_args(argv)
    reps, rounds, sessions = (3, 5, 200) if args.quick else (7, 9, 400)
    report = {"benchmark": "roofline", "contexts": CONTEXTS, "block_sizes": BLOCK_SIZES}
    report["slot_efficiency_by_block_size"] = slot_efficiency_by_block_size(sessions)
    print(json.dumps(report["slot_efficiency_by_block_size"]), file=sys.stderr)
    with session() as page:
        install_bench(page, "page/kv_kernels.py", "page/roofline.py", "page/webgpu_engine.py")
        page.install_test_modules("kernel_calls")  # bench/page/roofline.py times single kernel calls with it
        web = page.py(SETUP.format(reps=reps, contexts=CONTEXTS))
        print(json.dumps(web["decode_steps"]), file=sys.stderr)

        def attention(context: int, block_size: int) -> dict:
            r = page.py(ATTENTION.format(context=context, block_size=block_size, rounds=rounds))
            print(json.dumps(r), file=sys.stderr)
            return r

        web["attention_by_context"] = [attention(c, 16) for c in CONTEXTS]
        web["attention_by_block_size"] = [attention(4096, bs) for bs in BLOCK_SIZES]
        report["adapter"] = json.loads(page.dataset()["adapter"])["name"]
    report.update(web)
    report["roofline"] = derive(web)
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    emit(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
