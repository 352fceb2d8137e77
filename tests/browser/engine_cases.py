"""Cases for test_webgpu_engine.py, run inside the page's worker (Pyodide; under CPython on wgpu-py for
tests/native): the WebGPU backend through
LLMEngine vs the numpy reference (CpuBackend / NumpyModel) on the same weights in the same worker.
Each case returns plain data (JSON-able) that the test asserts on."""
from __future__ import annotations

import json
import sys

import numpy as np

from pagedkv.backends.cpu import CpuBackend
from pagedkv.model_runner import ForwardBatch
from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
from pagedkv.backends.webgpu.device import GpuDevice
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.backends.webgpu.plan import PlanKey, layer_program
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.manager import NeverFits
from pagedkv.model.weights import ModelWeights
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

MIB = 1 << 20
_cache: dict = {}


async def context() -> GpuDevice:
    if "ctx" not in _cache:
        _cache["ctx"] = await open_device()
    return _cache["ctx"]


async def site_file(path: str) -> bytes:
    """A file of the built site: fetched from dist/ by the page, read from dist/ under CPython (tests/native)."""
    if sys.platform == "emscripten":
        from pagedkv.browser.interop import fetch_bytes

        return await fetch_bytes(path)
    import build

    return (build.DIST / path).read_bytes()


async def model_files(model: str) -> tuple[dict, dict]:
    """(manifest, {shard: bytes}) of dist/models/<model>, fetched once per worker."""
    if model not in _cache:
        manifest = json.loads(await site_file(f"models/{model}/model.json"))
        shards = {s["file"]: await site_file(f"models/{model}/{s['file']}") for s in manifest["shards"]}
        _cache[model] = (manifest, shards)
    return _cache[model]


async def weights(model: str) -> ModelWeights:
    key = ("weights", model)
    if key not in _cache:
        manifest, shards = await model_files(model)
        _cache[key] = ModelWeights.from_shards(manifest, shards)
    return _cache[key]


async def backend(model: str, **kw) -> WebGpuBackend:
    manifest, shards = await model_files(model)
    progress = []

    async def source(name: str) -> bytes:
        return shards[name]

    b = await WebGpuBackend.create(await context(), manifest, source, on_progress=lambda *a: progress.append(a), **kw)
    b.progress = progress
    return b


def ledger_view(b) -> dict:
    snap = b.ledger.snapshot()
    return {"budget": snap["budget_bytes"], "used": snap["used_bytes"], "peak": snap["peak_bytes"],
            "by_kind": snap["by_kind"], "num_blocks": b.num_blocks}


async def run_engine(b, tokenizer, prompts, max_tokens, **config) -> tuple[list[list[int]], dict]:
    engine = LLMEngine(b, tokenizer, EngineConfig(**config))
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=(1_000_000,))
    reqs = [engine.request(engine.add_request(p, params)) for p in prompts]
    steps = 0
    while engine.has_unfinished:
        await engine.step()
        steps += 1
    return [r.output_ids for r in reqs], {"steps": steps, **engine.stats()}


async def tiny_sizes(**kw) -> tuple[int, int]:
    """(bytes of everything but the KV pool, bytes of one KV block) of the tiny model at block 16, f16
    (backend options in kw override those: scratch grows with max_num_batched_tokens)."""
    probe = await backend("tiny-random", **{"budget_bytes": 8 * MIB, "block_size": 16, "max_num_batched_tokens": 24,
                                            "max_num_seqs": 4, **kw})
    fixed = probe.ledger.used_bytes - probe.ledger.by_kind()["kv"]
    block_bytes = probe.ledger.by_kind()["kv"] // probe.num_blocks
    probe.destroy()
    return fixed, block_bytes


TINY_PROMPTS = [list(range(3 + 60 * i, 3 + 60 * i + n)) for i, n in enumerate((5, 23, 40, 17))]


async def tiny_greedy(block_size: int, kv_dtype: str, max_tokens: int = 10, kernels: str = "cpu",
                      model_name: str = "tiny-random", prompts: list[list[int]] | None = None) -> dict:
    """Four concurrent requests (or `prompts`), chunked prefill (24-token steps), vs solo numpy runs, with the
    `kernels` family."""
    prompts = TINY_PROMPTS if prompts is None else prompts
    w = await weights(model_name)
    tok = Tokenizer.from_manifest(w.manifest)
    b = await backend(model_name, budget_bytes=8 * MIB, block_size=block_size, kv_dtype=kv_dtype,
                      max_num_batched_tokens=24, max_num_seqs=4, kernels=kernels)
    gpu, stats = await run_engine(b, tok, prompts, max_tokens, max_num_batched_tokens=24, max_num_seqs=4)
    model = _cache.setdefault(("model", model_name), NumpyModel(w))
    ref = [greedy_reference(model, p, max_tokens) for p in prompts]
    head = [d.shader for d in layer_program(b, PlanKey.of(1, 1, greedy=True))[1]]  # a greedy decode step's LM head
    b.destroy()
    return {"gpu": gpu, "ref": ref, "steps": stats["steps"], "progress": b.progress, "head": head,
            "shader_f16": b.shader_f16, "runtime": sys.platform}


async def logits_vs_numpy(model_name: str, prompts: list[list[int]], kv_dtype: str, budget_mib: int) -> dict:
    """Greedy=False logits of a mixed batch: prefill of every prompt, then one decode step for all."""
    w = await weights(model_name)
    b = await backend(model_name, budget_bytes=budget_mib * MIB, block_size=16, kv_dtype=kv_dtype,
                      max_num_batched_tokens=max(64, sum(map(len, prompts))), max_num_seqs=len(prompts))
    cpu = CpuBackend(w, num_blocks=min(b.num_blocks, 64), block_size=16)
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    width = 8
    tables = i32([[(7 * s + 3 * j) % 64 for j in range(width)] for s in range(len(prompts))])  # scattered
    lens = [len(p) for p in prompts]
    slots = np.concatenate([tables[s, np.arange(n) // 16] * 16 + np.arange(n) % 16 for s, n in enumerate(lens)])
    qsl = i32(np.concatenate([[0], np.cumsum(lens)]))
    pos = np.concatenate([np.arange(n) for n in lens])
    prefill = ForwardBatch(i32(np.concatenate(prompts)), i32(pos), i32(slots), qsl, tables, i32(lens))
    out = {"prefill": [], "decode": []}
    g, c = await b.forward(prefill), await cpu.forward(prefill)
    ids = np.argmax(c, axis=1).astype(np.int32)  # (S,)
    decode = ForwardBatch(ids, i32(lens), i32([tables[s, n // 16] * 16 + n % 16 for s, n in enumerate(lens)]),
                          i32(range(len(prompts) + 1)), tables, i32([n + 1 for n in lens]))
    g2, c2 = await b.forward(decode), await cpu.forward(decode)
    b.destroy()
    for key, (gg, cc) in (("prefill", (g, c)), ("decode", (g2, c2))):
        err = np.abs(gg - cc)
        out[key] = {"max_abs": float(err.max()), "scale": float(np.abs(cc).max()),
                    "argmax_equal": bool(np.array_equal(gg.argmax(1), cc.argmax(1)))}
    return out


async def preemption_round_trip(preemption: str) -> dict:
    """A budget of 7 KV blocks (16 tokens) for four requests forces preemption; outputs must not change."""
    w = await weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    fixed, block_bytes = await tiny_sizes()
    b = await backend("tiny-random", budget_bytes=fixed + 7 * block_bytes + 100, block_size=16,
                      max_num_batched_tokens=24, max_num_seqs=4, num_cpu_blocks=16)
    gpu, stats = await run_engine(b, tok, TINY_PROMPTS, 12, max_num_batched_tokens=24, max_num_seqs=4,
                                  preemption=preemption)
    model = _cache.setdefault(("model", "tiny-random"), NumpyModel(w))
    ref = [greedy_reference(model, p, 12) for p in TINY_PROMPTS]
    view = ledger_view(b)
    b.destroy()
    return {"gpu": gpu, "ref": ref, "preemptions": stats["preemptions"], "swap_out_blocks": stats["swap_out_blocks"],
            "swap_in_blocks": stats["swap_in_blocks"], "ledger": view, "fixed": fixed, "block_bytes": block_bytes}


async def copy_and_swap_blocks(kv_dtype: str) -> dict:
    """After a prefill: copy_blocks, then swap a block out and into another slot; cache contents compared. The
    swap-out lists GPU block 7 twice, as when two swapped sequences share a prefix block."""
    b = await backend("tiny-random", budget_bytes=8 * MIB, block_size=8, kv_dtype=kv_dtype,
                      max_num_batched_tokens=24, max_num_seqs=4, num_cpu_blocks=4)
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    ids = i32(range(5, 25))  # 20 tokens in blocks 9, 4, 7
    table = i32([[9, 4, 7]])
    slots = i32(table[0, np.arange(20) // 8] * 8 + np.arange(20) % 8)
    await b.forward(ForwardBatch(ids, i32(range(20)), slots, i32([0, 20]), table, i32([20])))
    await b.copy_blocks([(9, 1), (4, 2)])
    await b.swap_out([(7, 3), (9, 0), (7, 1)])
    await b.swap_in([(3, 5), (0, 6)])
    out = {}
    for layer, cache in enumerate(b.kv_pool.caches):
        k, v = await cache.read()
        out[layer] = {"copy": bool(np.array_equal(k[[1, 2]], k[[9, 4]]) and np.array_equal(v[[1, 2]], v[[9, 4]])),
                      "swap": bool(np.array_equal(k[[5, 6]], k[[7, 9]]) and np.array_equal(v[[5, 6]], v[[7, 9]])),
                      "cpu": bool(np.array_equal(b.kv_pool.cpu_k[layer][[3, 1]], k[[7, 7]])),
                      "nonzero": bool(np.abs(k[9].astype(np.float32)).sum() > 0)}
    b.destroy()
    return out


async def budget_refusal() -> dict:
    """A budget holding 3 blocks of 16 tokens: a 60-token request can never fit (NeverFits) and the engine
    keeps serving a short one afterwards."""
    w = await weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    fixed, block_bytes = await tiny_sizes()
    budget = fixed + 3 * block_bytes + 1000
    b = await backend("tiny-random", budget_bytes=budget, block_size=16, max_num_batched_tokens=24, max_num_seqs=4)
    engine = LLMEngine(b, tok, EngineConfig(max_num_batched_tokens=24, max_num_seqs=4))
    try:
        engine.add_request(list(range(3, 63)), SamplingParams(max_tokens=4))
        refused = None
    except NeverFits as exc:
        refused = str(exc)
    gpu, _ = await run_engine(b, tok, [TINY_PROMPTS[0]], 6, max_num_batched_tokens=24, max_num_seqs=4)
    model = _cache.setdefault(("model", "tiny-random"), NumpyModel(w))
    too_small = None
    try:
        await backend("tiny-random", budget_bytes=fixed + block_bytes // 2, block_size=16,
                      max_num_batched_tokens=24, max_num_seqs=4)
    except MemoryError as exc:
        too_small = f"{type(exc).__name__}: {exc}"
    view = ledger_view(b)
    b.destroy()
    return {"refused": refused, "gpu": gpu, "ref": [greedy_reference(model, TINY_PROMPTS[0], 6)], "ledger": view,
            "fixed": fixed, "block_bytes": block_bytes, "too_small": too_small}


async def real_model(prompts: list[list[int]], n: int, budget_mib: int = 256, kernels: str = "cpu") -> dict:
    """SmolLM2 with the `kernels` family: greedy ids of the prompts as concurrent requests, and the
    first-position logits (prefill, greedy=False) as base64 f32 for the CPython side to compare with numpy."""
    import base64

    manifest, _ = await model_files("smollm2-135m-instruct")
    tok = Tokenizer.from_manifest(manifest)
    total = sum(map(len, prompts))
    b = await backend("smollm2-135m-instruct", budget_bytes=budget_mib * MIB, block_size=16,
                      max_num_batched_tokens=total, max_num_seqs=len(prompts), kernels=kernels)
    gpu, stats = await run_engine(b, tok, prompts, n, max_num_batched_tokens=total, max_num_seqs=len(prompts))
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    p = prompts[0]
    blocks = -(-len(p) // 16)
    table = i32([list(range(blocks))[::-1]])
    slots = i32(table[0, np.arange(len(p)) // 16] * 16 + np.arange(len(p)) % 16)
    logits = await b.forward(ForwardBatch(i32(p), i32(range(len(p))), slots, i32([0, len(p)]), table, i32([len(p)])))
    view = ledger_view(b)
    b.destroy()
    return {"gpu": gpu, "logits": base64.b64encode(logits.astype("<f4").tobytes()).decode(), "ledger": view,
            "steps": stats["steps"]}


async def bad_weights() -> dict:
    """A tampered shard and a Q8_0 code of -128 (with a matching hash) are refused at load, with messages."""
    import copy
    import hashlib

    manifest, shards = await model_files("tiny-random")
    ctx = await context()
    data = bytearray(shards["shard-000.bin"])
    data[0] = 0x80  # token_embd.weight (Q8_0) qs starts the shard: code -128
    out = {}
    for name, fix_hash in (("tampered", False), ("code_minus_128", True)):
        m = copy.deepcopy(manifest)
        if fix_hash:
            m["shards"][0]["sha256"] = hashlib.sha256(data).hexdigest()

        async def source(_file: str) -> bytes:
            return bytes(data)

        try:
            await WebGpuBackend.create(ctx, m, source, budget_bytes=8 * MIB)
            out[name] = None
        except ValueError as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


async def gpu_model(name: str):
    """A GpuModel of dist/models/<name> (pagedkv.shared_gpu)."""
    from pagedkv.shared_gpu import GpuModel

    manifest, shards = await model_files(name)

    async def source(file: str) -> bytes:
        return shards[file]

    return GpuModel(name, manifest, source, Tokenizer.from_manifest(manifest))


async def two_models_shared(kv_dtype: str = "f16", kernels: str = "cpu", budget_mib: float = 12,
                            max_tokens: int = 10) -> dict:
    """tiny-random (16-dim heads) and tiny-random-wide (64-dim) in one shared page buffer: four requests each,
    batched into the same steps, vs each model's numpy greedy run alone."""
    from pagedkv.shared_gpu import shared_gpu_engine

    names = ["tiny-random-wide", "tiny-random"]
    models = [await gpu_model(n) for n in names]
    engine, shared = await shared_gpu_engine(
        await context(), models, int(budget_mib * MIB), kv_dtype=kv_dtype, kernels=kernels,
        config=EngineConfig(max_num_batched_tokens=24, max_num_seqs=4))
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=(1_000_000,))
    reqs = {n: [engine.request(engine.add_request(p, params, model=n)) for p in TINY_PROMPTS] for n in names}
    peak = 0
    while engine.has_unfinished:
        await engine.step()
        peak = max(peak, engine.pool.num_used)
    out = {n: [r.output_ids for r in rs] for n, rs in reqs.items()}
    ref = {}
    for n in names:
        model = _cache.setdefault(("model", n), NumpyModel(await weights(n)))
        ref[n] = [greedy_reference(model, p, max_tokens) for p in TINY_PROMPTS]
    pool, ledger = engine.pool_stats(), shared.pages.ledger.snapshot()
    stats = {n: engine.lane(n).stats() for n in names}
    engine.remove_model("tiny-random")
    after = shared.pages.ledger.snapshot()
    for lane in engine.lanes.values():
        lane.backend.destroy()
    shared.pages.destroy()
    return {"gpu": out, "ref": ref, "pool": pool, "peak_pages": peak, "pages": shared.pages.num_pages,
            "page_bytes": shared.pages.page_bytes, "ledger": ledger, "after_unload": after,
            "end_ledger": shared.pages.ledger.snapshot(),
            "preemptions": {n: s["preemptions"] for n, s in stats.items()}}


async def load_at_run_time(budget_mib: float = 12, max_tokens: int = 8) -> dict:
    """An engine of tiny-random-wide whose pages took all the budget left; tiny-random loaded at run time:
    refused while a request holds a page (the numbers), then its buffers take pages (the page buffers are
    allocated again smaller) and both models answer as numpy does alone; unloading it makes those pages spare."""
    from pagedkv.kv.manager import NeverFits
    from pagedkv.shared_gpu import add_gpu_model, shared_gpu_engine

    ctx = await context()
    engine, shared = await shared_gpu_engine(ctx, [await gpu_model("tiny-random-wide")], int(budget_mib * MIB),
                                             config=EngineConfig(max_num_batched_tokens=24, max_num_seqs=4))
    pages_before = shared.pages.num_pages
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=(1_000_000,))
    busy = engine.request(engine.add_request(TINY_PROMPTS[0], params, model="tiny-random-wide"))
    await engine.step()
    refused = None
    try:
        await add_gpu_model(ctx, engine, shared, await gpu_model("tiny-random"))
    except NeverFits as exc:
        refused = str(exc)
    while engine.has_unfinished:
        await engine.step()
    await add_gpu_model(ctx, engine, shared, await gpu_model("tiny-random"))
    pool = engine.pool_stats()
    reqs = {n: [engine.request(engine.add_request(p, params, model=n)) for p in TINY_PROMPTS]
            for n in ("tiny-random-wide", "tiny-random")}
    while engine.has_unfinished:
        await engine.step()
    ref = {}
    for n in reqs:
        model = _cache.setdefault(("model", n), NumpyModel(await weights(n)))
        ref[n] = [greedy_reference(model, p, max_tokens) for p in TINY_PROMPTS]
    ledger = shared.pages.ledger.snapshot()
    engine.remove_model("tiny-random")
    after = engine.pool_stats()
    for lane in engine.lanes.values():
        lane.backend.destroy()
    shared.pages.destroy()
    return {"refused": refused, "first": busy.output_ids, "pages_before": pages_before,
            "pages_after": shared.pages.num_pages, "pool": pool, "after": after, "ledger": ledger,
            "gpu": {n: [r.output_ids for r in rs] for n, rs in reqs.items()}, "ref": ref}
