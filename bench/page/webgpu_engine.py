# Runs inside the page's worker (Pyodide): the real model through LLMEngine + WebGpuBackend.
import json
import statistics
import time

import numpy as np

from pagedkv.browser.interop import GpuContext, fetch_bytes
from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

MODEL = "smollm2-135m-instruct"


async def bench_backend(budget_mib=1024, kv_dtype="f16", ctx=None, model=MODEL, block_size=16):
    """`model` (default SmolLM2-135M) on WebGpuBackend under a `budget_mib` ledger: (ctx, backend, manifest,
    ledger summary)."""
    ctx = ctx or await GpuContext.create()
    manifest = json.loads(await fetch_bytes(f"models/{model}/model.json"))
    t0 = time.perf_counter()

    async def source(name):
        return await fetch_bytes(f"models/{model}/{name}")

    b = await WebGpuBackend.create(ctx, manifest, source, budget_bytes=budget_mib << 20, kv_dtype=kv_dtype,
                                   block_size=block_size)
    load_s = time.perf_counter() - t0
    snap = b.ledger.snapshot()
    return ctx, b, manifest, {"budget_bytes": snap["budget_bytes"], "used_bytes": snap["used_bytes"],
                              "by_kind": snap["by_kind"], "num_blocks": b.num_blocks, "block_size": b.block_size,
                              "kv_dtype": b.kv_dtype, "kv_tokens": b.num_blocks * b.block_size,
                              "load_s": round(load_s, 2)}


async def bench_generate(ctx, b, manifest, prompt_len=128, new_tokens=32, runs=3, prompt=None, pipeline=True):
    """Greedy runs of one request each (a random prompt per run, or `prompt` every run). The prefill is every
    step up to the one that emits the first token (a prompt longer than max_num_batched_tokens takes several).
    pipeline: EngineConfig.pipeline_decode (step n + 1 submitted before step n's ids are read). A step's host
    time is its wall time less the time it waited for the GPU's result (Python and the JS encode)."""
    tok = Tokenizer.from_manifest(manifest)
    engine = LLMEngine(b, tok, EngineConfig(enable_prefix_caching=False, pipeline_decode=pipeline))
    rng = np.random.default_rng(0)
    results = []
    for run in range(runs):
        hi = min(40000, b.config.vocab)  # the tiny models' vocabulary is small
        ids = [int(t) for t in rng.integers(min(100, hi // 2), hi, prompt_len)] if prompt is None else list(prompt)
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
            "decode_host_ms": statistics.median(s["wall_ms"] - s["wait"] for s in decode),
            "decode_wait_ms": statistics.median(s["wait"] for s in decode),
            "pipeline": pipeline,
            "decode_crossings": sorted({s["crossings"] for s in decode}),
            "prefill_crossings": sum(s["crossings"] for s in prefill),
            "first_run_includes_plan_recording": run == 0,
        })
        del rid
    return results


async def bench_dispatch_floor(ctx, b, reps=5):
    """The decode plan (S=1) replayed with every grid cut to one workgroup: a floor on what the
    dispatches of a step cost on this adapter regardless of the kernels' work (the outputs are garbage)."""
    from pagedkv.backends.webgpu.plan import PlanKey

    key = PlanKey.of(1, 1, greedy=True)  # bench_generate's steps are greedy
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
            await ctx.replay(plan, g, copies, s["x"], s["last"], read=(s["ids"], s["readback"], 4))
            samples.append((time.perf_counter() - t0) * 1e3)
        out[name] = {"median_ms": statistics.median(samples), "samples_ms": samples}
    return out


def _decode_step(b):
    """The decode plan (one sequence) and the grids of the last decode step the backend ran."""
    from pagedkv.backends.webgpu.plan import PlanKey

    key = PlanKey.of(1, 1, greedy=True)  # bench_generate's steps are greedy
    shape = [sh for sh in b._slots_cache if sh.decode and sh.num_seqs == 1][-1]
    slot_grids, _ = b._slots_cache[shape]
    return b._plans[key], b._dispatch_slots[key], slot_grids


def plan_dispatches(b):
    """Dispatches per step of each recorded plan, and per layer in the decode plan."""
    from pagedkv.backends.webgpu.plan import SLOTS

    out = {str(key): int(slots.shape[0]) for key, slots in b._dispatch_slots.items()}
    _, slots, _ = _decode_step(b)
    out["decode_by_kind"] = {SLOTS[i]: int((slots == i).sum()) for i in np.unique(slots)}
    return out


async def bench_kernel_split(ctx, b, reps=3):
    """GPU time of each kind of dispatch in the last decode step: the plan replayed with only that kind's
    dispatches left in (the others skipped), minus the replay with nothing dispatched. Outputs are garbage."""
    from pagedkv.backends.webgpu.plan import SLOTS

    plan, slots, slot_grids = _decode_step(b)
    s = b.scratch
    copies = np.zeros((0, 3), np.int32)

    async def timed(grids):
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            await ctx.replay(plan, grids, copies, s["x"], s["last"], read=(s["ids"], s["readback"], 4))
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    full = slot_grids[slots]  # (dispatches, 3)
    empty = await timed(np.zeros_like(full))
    out = {"all_ms": round(await timed(full), 2), "none_ms": round(empty, 2), "by_kind_ms": {}}
    for i in np.unique(slots):
        only = np.where((slots == i)[:, None], full, 0)  # (dispatches, 3)
        out["by_kind_ms"][SLOTS[i]] = {"dispatches": int((slots == i).sum()), "ms": round(await timed(only) - empty, 2)}
    return out
