"""Cases for test_webgpu_engine.py, run inside the page's worker (Pyodide): the WebGPU backend through
LLMEngine vs the numpy reference (CpuBackend / NumpyModel) on the same weights in the same worker.
Each case returns plain data (JSON-able) that the test asserts on."""
from __future__ import annotations

import json

import numpy as np

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.numpy_ref import ForwardBatch, NumpyModel, PagedKVCache
from pagedkv.backends.webgpu import GpuContext, fetch_bytes
from pagedkv.backends.webgpu_engine import WebGpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv_cache_manager import NeverFits
from pagedkv.model.weights import ModelWeights
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

MIB = 1 << 20
_cache: dict = {}


async def context() -> GpuContext:
    if "ctx" not in _cache:
        _cache["ctx"] = await GpuContext.create()
    return _cache["ctx"]


async def model_files(model: str) -> tuple[dict, dict]:
    """(manifest, {shard: bytes}) of dist/models/<model>, fetched once per worker."""
    if model not in _cache:
        manifest = json.loads(await fetch_bytes(f"models/{model}/model.json"))
        shards = {s["file"]: await fetch_bytes(f"models/{model}/{s['file']}") for s in manifest["shards"]}
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


def solo_greedy(model: NumpyModel, prompt: list[int], n: int) -> list[int]:
    """One sequence alone through the numpy reference (identity block table), prefill then decode."""
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    blocks = -(-(len(prompt) + n) // 16)
    kv = PagedKVCache.allocate(model.config, blocks, 16)
    table = i32([np.arange(blocks)])
    ids = list(prompt)
    batch = ForwardBatch(i32(ids), i32(range(len(ids))), i32(range(len(ids))), i32([0, len(ids)]), table,
                         i32([len(ids)]))
    out = []
    for _ in range(n):
        tok = int(np.argmax(model.forward(batch, kv)[0]))
        out.append(tok)
        ids.append(tok)
        p = len(ids) - 1
        batch = ForwardBatch(i32([tok]), i32([p]), i32([p]), i32([0, 1]), table, i32([p + 1]))
    return out


TINY_PROMPTS = [list(range(3 + 60 * i, 3 + 60 * i + n)) for i, n in enumerate((5, 23, 40, 17))]


async def tiny_greedy(block_size: int, kv_dtype: str, max_tokens: int = 10) -> dict:
    """Four concurrent requests, chunked prefill (24-token steps), vs solo numpy runs."""
    w = await weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    b = await backend("tiny-random", budget_bytes=8 * MIB, block_size=block_size, kv_dtype=kv_dtype,
                      max_num_batched_tokens=24, max_num_seqs=4)
    gpu, stats = await run_engine(b, tok, TINY_PROMPTS, max_tokens, max_num_batched_tokens=24, max_num_seqs=4)
    model = _cache.setdefault(("model", "tiny-random"), NumpyModel(w))
    ref = [solo_greedy(model, p, max_tokens) for p in TINY_PROMPTS]
    b.destroy()
    return {"gpu": gpu, "ref": ref, "steps": stats["steps"], "progress": b.progress}


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
