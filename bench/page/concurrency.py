# Runs inside the page's worker (Pyodide): generated tok/s with C concurrent conversations through LLMEngine
# + WebGpuBackend, batched (continuous batching) vs one at a time; and swap vs recompute cost per block count.
import json
import statistics
import time

import numpy as np

from pagedkv.model_runner import ForwardBatch
from pagedkv.browser.interop import GpuContext, fetch_bytes
from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

NEVER = (1_000_000,)  # a stop id no vocabulary has: every reply is exactly `new_tokens` long


async def load(model, budget_mib, **kw):
    ctx = await GpuContext.create()
    manifest = json.loads(await fetch_bytes(f"models/{model}/model.json"))

    async def source(name):
        return await fetch_bytes(f"models/{model}/{name}")

    b = await WebGpuBackend.create(ctx, manifest, source, budget_bytes=budget_mib << 20, **kw)
    return b, Tokenizer.from_manifest(manifest)


async def _run(engine, prompts, new_tokens, batched):
    """Seconds to generate `new_tokens` for every prompt: all queued at once, or each after the previous."""
    params = SamplingParams(max_tokens=new_tokens, stop_token_ids=NEVER)
    t0 = time.perf_counter()
    for group in ([prompts] if batched else [[p] for p in prompts]):
        for p in group:
            engine.add_request(p, params)
        while engine.has_unfinished:
            await engine.step()
    return time.perf_counter() - t0


async def throughput(model, levels, prompt_len, new_tokens, budget_mib, runs=1):
    b, tok = await load(model, budget_mib, max_num_batched_tokens=max(256, max(levels) * prompt_len),
                        max_num_seqs=max(levels))
    engine = LLMEngine(b, tok, EngineConfig(max_num_batched_tokens=max(256, max(levels) * prompt_len),
                                            max_num_seqs=max(levels), enable_prefix_caching=False))
    rng = np.random.default_rng(0)
    hi = min(tok.vocab_size, 40000)
    rows = []
    for c in levels:
        prompts = [[int(t) for t in rng.integers(3, hi, prompt_len)] for _ in range(c)]
        # Warm-up: each batch shape records its GPU plan once; that is not what is measured.
        await _run(engine, prompts, 2, True)
        await _run(engine, prompts[:1], 2, True)
        row = {"concurrency": c, "new_tokens_each": new_tokens}
        for name, batched in (("batched", True), ("one_at_a_time", False)):
            secs = [await _run(engine, prompts, new_tokens, batched) for _ in range(runs)]
            s = statistics.median(secs)
            row[f"{name}_s"] = round(s, 3)
            row[f"{name}_tok_s"] = round(c * new_tokens / s, 2)
        row["speedup"] = round(row["batched_tok_s"] / row["one_at_a_time_tok_s"], 2)
        rows.append(row)
    info = {"model": model, "prompt_tokens": prompt_len, "num_blocks": b.num_blocks, "kv_dtype": b.kv_dtype,
            "steps": engine.stats()["steps"], "preemptions": engine.stats()["preemptions"]}
    b.destroy()
    return {"info": info, "rows": rows}


async def preemption_cost(block_counts, reps=3):
    """Tiny model: wall ms to swap a sequence of N full blocks out and back in (GPU <-> wasm memory) vs to
    recompute it (one prefill of N x 16 tokens), per N. The engine's auto mode swaps below a block count."""
    top = max(block_counts)
    b, _ = await load("tiny-random", 64, block_size=16, max_num_batched_tokens=top * 16, max_num_seqs=1,
                      num_cpu_blocks=top)
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    rows = []
    for n in block_counts:
        t = n * 16
        table = i32([range(n)])  # (1, n)
        batch = ForwardBatch(i32(np.arange(t) % 400 + 3), i32(range(t)), i32(range(t)), i32([0, t]), table, i32([t]))
        await b.forward(batch, greedy=True)  # warm-up: records this shape's plan, fills the blocks
        out_ms, in_ms, rec_ms = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            await b.swap_out([(g, g) for g in range(n)])
            t1 = time.perf_counter()
            await b.swap_in([(g, g) for g in range(n)])
            t2 = time.perf_counter()
            await b.forward(batch, greedy=True)
            t3 = time.perf_counter()
            out_ms.append((t1 - t0) * 1e3)
            in_ms.append((t2 - t1) * 1e3)
            rec_ms.append((t3 - t2) * 1e3)
        swap = statistics.median(out_ms) + statistics.median(in_ms)
        rows.append({"blocks": n, "tokens": t, "swap_out_ms": round(statistics.median(out_ms), 2),
                     "swap_in_ms": round(statistics.median(in_ms), 2), "swap_round_trip_ms": round(swap, 2),
                     "recompute_ms": round(statistics.median(rec_ms), 2),
                     "cheaper": "swap" if swap < statistics.median(rec_ms) else "recompute"})
    b.destroy()
    return rows
