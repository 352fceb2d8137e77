"""Models on the tab's WebGPU path: their shards streamed from the site (or OPFS) into GPU buffers with progress,
and several of them in one engine under one GPU budget (pagedkv.shared_gpu: one ledger, one buffer of pages
every model's KV views), loaded and unloaded at run time (pagedkv.js `engine.load` / `engine.unload`).
docs/api.md, "Several models, one budget, one pool".
"""
from __future__ import annotations

import json

from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.gpu_budget import BudgetExceeded
from pagedkv.shared_gpu import GpuModel, SharedGpu, add_gpu_model, shared_gpu_engine
from pagedkv.tokenizer import Tokenizer

from . import bridge
from .model_library import model_reader

MIB = 1 << 20


async def shard_reader(name: str, on_progress) -> tuple[dict, object]:
    """A model's manifest and `await shard_source(file) -> bytes`, reporting on_progress(loaded, total) bytes
    of all its shards as they arrive."""
    read = model_reader(name)
    try:
        manifest = json.loads(await read("model.json"))
    except RuntimeError as exc:  # bridge.fetch_bytes: the site has no such model
        if "HTTP 404" in str(exc):
            raise FileNotFoundError(f"there is no model {name!r} here ({exc})") from None
        raise
    total = sum(s["nbytes"] for s in manifest["shards"])
    done = 0

    async def shard_source(file: str) -> bytes:
        nonlocal done
        seen = 0

        def step(n: int) -> None:  # fetch_bytes reports increments
            nonlocal seen
            seen += n
            on_progress(done + seen, total)

        data = await read(file, step)
        done += len(data)
        return data

    return manifest, shard_source


async def _gpu_model(name: str) -> GpuModel:
    manifest, source = await shard_reader(name, bridge.progress(name))
    return GpuModel(name, manifest, source, Tokenizer.from_manifest(manifest))


async def shared_gpu_models(ctx, names: list[str], *, block_size: int, config: EngineConfig, budget_bytes: int,
                            cpu_budget_bytes: int, kv_dtype: str, kernels: str
                            ) -> tuple[list[dict], LLMEngine, SharedGpu, dict]:
    """Several models under one GPU budget (pagedkv.shared_gpu.shared_gpu_engine). Returns the manifests, the
    engine, its pages (for load_gpu_model) and the model-ready facts."""
    models = [await _gpu_model(name) for name in names]
    try:
        engine, shared = await shared_gpu_engine(ctx, models, budget_bytes, block_size=block_size, kv_dtype=kv_dtype,
                                                 kernels=kernels, cpu_budget_bytes=cpu_budget_bytes, config=config)
    except BudgetExceeded as exc:
        raise BudgetExceeded(f"{exc}: raise budget_mib") from None
    pages = shared.pages
    info = {"bytes_per_token": engine.backend.bytes_per_token, "kv_dtype": kv_dtype, "page_bytes": pages.page_bytes,
            "ledger": pages.ledger.snapshot(), "models": names}
    return [m.manifest for m in models], engine, shared, info


async def load_gpu_model(ctx, engine: LLMEngine, shared: SharedGpu, name: str) -> tuple[ChatTemplate, dict]:
    """Load model `name` into a several-model GPU engine at run time (pagedkv.shared_gpu.add_gpu_model). Returns
    its chat template and manifest. Raises LookupError (loaded already), FileNotFoundError (no such model), ValueError (its
    blocks do not fit the pages, or its buffers do not fit what the ledger has left: the ledger's numbers)."""
    if name in engine.models:
        raise LookupError(f"{name} is loaded already")
    model = await _gpu_model(name)
    try:
        await add_gpu_model(ctx, engine, shared, model)
    except BudgetExceeded as exc:  # the pages stay: what the ledger has left is what unloaded models gave back
        raise ValueError(f"{name}'s GPU buffers do not fit what the budget has left ({exc}); the KV pages "
                         "cannot shrink: unload a model first") from None
    return ChatTemplate.from_manifest(model.manifest, model.tokenizer), model.manifest
