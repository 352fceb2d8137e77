# Runs inside the page's worker (Pyodide): the real model through LLMEngine + WebGpuBackend.
import json
import statistics
import time

import numpy as np

from pagedkv.backends.webgpu import GpuContext, fetch_bytes
from pagedkv.backends.webgpu_engine import WebGpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

MODEL = "smollm2-135m-instruct"


async def bench_backend(budget_mib=1024, kv_dtype="f16", ctx=None):
    """SmolLM2-135M on WebGpuBackend under a `budget_mib` ledger: (ctx, backend, manifest, ledger summary)."""
    ctx = ctx or await GpuContext.create()
    manifest = json.loads(await fetch_bytes(f"models/{MODEL}/model.json"))
    t0 = time.perf_counter()

    async def source(name):
        return await fetch_bytes(f"models/{MODEL}/{name}")

    b = await WebGpuBackend.create(ctx, manifest, source, budget_bytes=budget_mib << 20, kv_dtype=kv_dtype)
    load_s = time.perf_counter() - t0
    snap = b.ledger.snapshot()
    return ctx, b, manifest, {"budget_bytes": snap["budget_bytes"], "used_bytes": snap["used_bytes"],
                              "by_kind": snap["by_kind"], "num_blocks": b.num_blocks, "block_size": b.block_size,
                              "kv_dtype": b.kv_dtype, "kv_tokens": b.num_blocks * b.block_size,
                              "load_s": round(load_s, 2)}


async def bench_generate(ctx, b, manifest, prompt_len=128, new_tokens=32, runs=3, prompt=None):
    """Greedy runs of one request each (a random prompt per run, or `prompt` every run). The prefill is every
    step up to the one that emits the first token (a prompt longer than max_num_batched_tokens takes several)."""
    tok = Tokenizer.from_manifest(manifest)
    engine = LLMEngine(b, tok, EngineConfig(enable_prefix_caching=False))
    rng = np.random.default_rng(0)
    results = []
    for run in range(runs):
        ids = [int(t) for t in rng.integers(100, 40000, prompt_len)] if prompt is None else list(prompt)
        rid = engine.add_request(ids, SamplingParams(max_tokens=new_tokens, stop_token_ids=(1_000_000,)))
        steps, output = [], []
        while engine.has_unfinished:
            c0 = ctx.js_crossings
            t0 = time.perf_counter()
            outs = await engine.step()
            wall = (time.perf_counter() - t0) * 1e3
            steps.append({"wall_ms": wall, "crossings": ctx.js_crossings - c0, **b.last_step_ms})
            output += [t for o in outs if o.request_id == rid for t in o.token_ids]
        n_prefill = len(steps) - len(output) + 1  # one token per step from the last prefill step on
        prefill, decode = steps[:n_prefill], steps[n_prefill:]
        results.append({
            "output_ids": output,
            "prefill_steps": n_prefill,
            "prefill_tok_s": len(ids) / (sum(s["wall_ms"] for s in prefill) / 1e3),
            "decode_tok_s": len(decode) / (sum(s["wall_ms"] for s in decode) / 1e3),
            "decode_step_ms": statistics.median(s["wall_ms"] for s in decode),
            "decode_replay_ms": statistics.median(s["replay"] for s in decode),
            "decode_backend_python_ms": statistics.median(s["python"] for s in decode),
            "decode_controller_ms": statistics.median(s["wall_ms"] - s["replay"] for s in decode),
            "decode_crossings": sorted({s["crossings"] for s in decode}),
            "prefill_crossings": sum(s["crossings"] for s in prefill),
            "first_run_includes_plan_recording": run == 0,
        })
        del rid
    return results


async def bench_dispatch_floor(ctx, b, reps=5):
    """The decode plan (S=1) replayed with every grid cut to one workgroup: a floor on what the ~480
    dispatches of a step cost on this adapter regardless of the kernels' work (the outputs are garbage)."""
    from pagedkv.backends.webgpu_plan import PlanKey

    key = PlanKey.of(1, 1)
    plan = b._plans[key]
    n = b._dispatch_slots[key].shape[0]
    grids = np.ones((n, 3), np.int32)
    s = b.scratch
    copies = np.zeros((0, 3), np.int32)
    skipped = np.zeros_like(grids)  # (n, 3): nothing dispatched, only the submit + 4-byte read back
    out = {"dispatches": int(n)}
    for name, g in (("one_workgroup_each", grids), ("none_dispatched", skipped)):
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            await ctx.replay(plan, g, copies, s["x"], s["last"], s["ids"], s["readback"], 4)
            samples.append((time.perf_counter() - t0) * 1e3)
        out[name] = {"median_ms": statistics.median(samples), "samples_ms": samples}
    return out
