"""Models on the tab's CPU path: their weights (the wasm SIMD kernel on the quantized blocks, or einsum on f32),
and several of them in one engine under one budget: one page buffer in wasm memory for the KV they share,
the weights' share of the budget numbered past it (LLMEngine's backed_pages), models loaded and unloaded at
run time (pagedkv.js `engine.load` / `engine.unload`). docs/api.md, "Several models, one budget, one pool".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagedkv.backends.cpu import CpuBackend, allocate_pages, block_size_in_page, plan_pages
from pagedkv.backends.cpu_wasm import tensor_loader
from pagedkv.browser import interop as webgpu
from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.model.weights import ModelWeights
from pagedkv.tokenizer import Tokenizer

from . import bridge
from .model_library import model_reader
from .model_loader import fetch_model

MIB = 1 << 20


async def cpu_weights(name: str, on_progress) -> tuple[dict, ModelWeights, str, object, str]:
    """A model's weights for the numpy fallback: projections on their quantized blocks through the wasm SIMD
    kernel (backends/cpu_wasm.py), or all weights dequantized to f32 and einsum where the kernel did not load.
    Returns the manifest, the weights, the linear mode, the attention kernels (or None) and why."""
    manifest, shards = await fetch_model(model_reader(name), on_progress)
    bridge.post("model-progress", model=name, loaded=1, total=1, detail="verifying and unpacking weights")
    try:
        convert, linear, why = tensor_loader(webgpu.linear_wasm_matmul()), "wasm", "wasm SIMD on quantized weights"
        attention = webgpu.wasm_attention()
    except webgpu.WasmUnavailable as exc:
        convert, linear, why = None, "einsum", f"einsum on f32 weights (no wasm kernel: {exc})"
        attention = None
    return manifest, ModelWeights.from_shards(manifest, shards, convert), linear, attention, why


def _progress(name: str):
    def on_progress(loaded_bytes: int, total: int) -> None:
        bridge.post("model-progress", model=name, loaded=loaded_bytes, total=total, detail="downloading weights")

    return on_progress


def _weights_pages(weights: ModelWeights, page: int) -> int:
    return math.ceil(sum(t.nbytes for t in weights.tensors.values()) / page)


@dataclass
class SharedPages:
    """The page buffer several models' backends view (CpuBackend(pages=...)), and its page size."""

    pages: np.ndarray
    page_bytes: int


async def shared_cpu_engine(names: list[str], block_size: int, config: EngineConfig,
                            budget_bytes: int) -> tuple[list[dict], LLMEngine, SharedPages, dict]:
    """Several models under one budget: their weights take their bytes in pages (backends/cpu.plan_pages: the
    widest model gets `block_size` tokens a page), the rest is the KV pool they share (one LLMEngine). Returns
    the manifests, the engine, its pages (for load_into) and the model-ready facts."""
    loaded = [(name, *await cpu_weights(name, _progress(name))) for name in names]
    page, sizes = plan_pages([w.config for _, _, w, *_ in loaded], block_size)
    num_pages = budget_bytes // page
    need = [_weights_pages(w, page) for _, _, w, *_ in loaded]
    if sum(need) + 2 > num_pages:
        held = ", ".join(f"{n} {k * page / MIB:.1f} MiB" for (n, *_), k in zip(loaded, need))
        raise ValueError(f"the models' weights take {held} and the KV pool at least two pages of "
                         f"{page / MIB:.2f} MiB; budget {budget_bytes / MIB:g} MiB: raise budget_mib")
    shared = SharedPages(allocate_pages(num_pages - sum(need), page), page)  # memory for the KV pages only
    engine = None
    for (name, manifest, weights, linear, attention, _), size, k in zip(loaded, sizes, need):
        backend = CpuBackend(weights, num_blocks=num_pages, block_size=size, linear=linear, attention=attention,
                             pages=shared.pages)
        if engine is None:
            engine = LLMEngine(backend, Tokenizer.from_manifest(manifest), config, model=name, pool=num_pages,
                               backed_pages=num_pages - sum(need))
            engine.reserve_for(name, k)
        else:
            engine.add_model(name, backend, Tokenizer.from_manifest(manifest), reserve_blocks=k)
    info = {"bytes_per_token": CpuBackend.pool_bytes_per_token(loaded[0][2].config), "kv_dtype": "f32",
            "cpu_linear": loaded[0][5], "page_bytes": page, "models": names}
    return [m for _, m, *_ in loaded], engine, shared, info


async def load_into(engine: LLMEngine, shared: SharedPages | None, name: str) -> ChatTemplate:
    """Load model `name` into a several-model engine at run time: its weights take pages of the budget (those
    past the buffer first); its KV blocks are the largest that fit a page. Returns its chat template. Raises
    LookupError (not a several-model engine, or loaded already), FileNotFoundError (no such model), ValueError
    (wider than the pages) or NeverFits (its weights' pages are not free now), each with the numbers."""
    if shared is None:
        raise LookupError("this engine holds one model in a pool of its own; create it with several models "
                          "(createEngine({models: [...]})) to load more at run time")
    if name in engine.models:
        raise LookupError(f"{name} is loaded already")
    try:
        manifest, weights, linear, attention, _ = await cpu_weights(name, _progress(name))
    except RuntimeError as exc:  # bridge.fetch_bytes: the site has no such model
        if "HTTP 404" in str(exc):
            raise FileNotFoundError(f"there is no model {name!r} here ({exc})") from None
        raise
    size = block_size_in_page(shared.page_bytes, weights.config, name)
    backend = CpuBackend(weights, num_blocks=engine.pool.num_blocks, block_size=size, linear=linear,
                         attention=attention, pages=shared.pages)
    tokenizer = Tokenizer.from_manifest(manifest)
    engine.add_model(name, backend, tokenizer, reserve_blocks=_weights_pages(weights, shared.page_bytes))
    return ChatTemplate.from_manifest(manifest, tokenizer)
