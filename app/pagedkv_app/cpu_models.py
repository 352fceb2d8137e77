"""Models on the tab's CPU path: their weights (the wasm SIMD kernel on the quantized blocks, or einsum on f32),
and several of them in one engine under one budget: one page buffer in wasm memory for the KV they share,
the weights' share of the budget numbered past it (LLMEngine's backed_pages), models loaded and unloaded at
run time (pagedkv.js `engine.load` / `engine.unload`). docs/api.md, "Several models, one budget, one pool".
"""
from __future__ import annotations

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.cpu_wasm import ACTIVATIONS, HeapStore, SharedStore, stack_projections, tensor_loader
from pagedkv.browser import interop as webgpu
from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.model.weights import ModelWeights
from pagedkv.shared_cpu import BudgetTooSmall, CpuModel, SharedPages, add_model, shared_engine
from pagedkv.tokenizer import Tokenizer

from . import bridge
from .model_library import model_reader
from .model_loader import fetch_model


async def cpu_weights(name: str, on_progress) -> tuple[dict, ModelWeights, str, object, str]:
    """A model's weights for the numpy fallback: projections on their quantized blocks through the wasm SIMD
    kernel (backends/cpu_wasm.py; q|k|v and gate|up stacked, one product each), or all weights dequantized to f32
    and einsum where the kernel did not load.
    Returns the manifest, the weights, the linear mode, the attention kernels (or None) and why."""
    manifest, shards = await fetch_model(model_reader(name), on_progress)
    bridge.post("model-progress", model=name, loaded=1, total=1, detail="verifying and unpacking weights")
    try:
        store, threads = await kernel_store()
        convert, linear, why = tensor_loader(store), "wasm", f"wasm SIMD on quantized weights, {threads}"
        attention = webgpu.wasm_attention()
    except webgpu.WasmUnavailable as exc:
        convert, linear, why = None, "einsum", f"einsum on f32 weights (no wasm kernel: {exc})"
        attention = None
    weights = ModelWeights.from_shards(manifest, shards, convert)
    if linear == "wasm":
        stack_projections(weights.tensors, weights.config.n_layers)
    return manifest, weights, linear, attention, why


def kernel_words(why: str, backends: dict[str, CpuBackend]) -> str:
    """cpu_weights' words for the device panel, with each backend's kernel_note (a KV mirror the kernel threads
    could not get), named by model where there are several."""
    notes = [(name, b.kernel_note) for name, b in backends.items()]
    return "; ".join([why, *(f"{name}: {note}" if len(backends) > 1 else note for name, note in notes if note)])


async def kernel_store() -> tuple[HeapStore | SharedStore, str]:
    """Where the wasm kernel's weights live and how many threads run it, with the words the device panel shows:
    every core (?threads=N sets the count, threads=1 keeps one) on a memory they share, or one thread on
    Pyodide's memory, saying why; the activations (?activations=int8|int16|f32): by default 8 bits a 32-value
    block into the 4-bit codes' relaxed-SIMD dot products and 16 bits into the rest (every token as if alone),
    16 bits everywhere where the browser has no relaxed SIMD (saying so). Raises WasmUnavailable when the kernel
    did not load."""
    kernel = webgpu.linear_wasm_matmul()
    relaxed = webgpu.wasm_relaxed_simd()
    asked = bridge.query_param("activations", "int8" if relaxed else "int16")
    activations = asked if asked in ACTIVATIONS else "int8" if relaxed else "int16"
    if activations == "int8" and not relaxed:
        activations, how = "int16", ", 16-bit activations (8-bit ones need relaxed SIMD, which this browser lacks)"
    else:
        how = {"int8": ", 8-bit activations (relaxed SIMD)", "int16": ", 16-bit activations",
               "f32": ", f32 activations"}[activations]
    if asked not in ACTIVATIONS:
        how += f" (activations={asked} is not one of {', '.join(ACTIVATIONS)})"
    wanted = bridge.query_param("threads", "auto")
    if wanted != "auto" and not wanted.isdigit():
        return HeapStore(kernel, activations), f"1 thread (threads={wanted} is not a count){how}"
    try:
        store = SharedStore(await webgpu.linear_threads(0 if wanted == "auto" else int(wanted)), activations)
        return store, f"{store.threads} threads{how}"
    except webgpu.WasmUnavailable as exc:
        return HeapStore(kernel, activations), f"1 thread ({exc}){how}"


async def shared_cpu_engine(names: list[str], block_size: int, config: EngineConfig,
                            budget_bytes: int) -> tuple[list[dict], LLMEngine, SharedPages, dict]:
    """Several models under one budget (pagedkv.shared_cpu.shared_engine). Returns the manifests, the engine,
    its pages (for load_into) and the model-ready facts."""
    loaded = [(name, *await cpu_weights(name, bridge.progress(name))) for name in names]
    models = [CpuModel(name, weights, Tokenizer.from_manifest(manifest), linear, attention)
              for name, manifest, weights, linear, attention, _ in loaded]
    try:
        engine, shared = shared_engine(models, budget_bytes, block_size, config)
    except BudgetTooSmall as exc:
        raise BudgetTooSmall(f"{exc}: raise budget_mib") from None
    info = {"bytes_per_token": CpuBackend.page_bytes_per_token(models[0].weights.config), "kv_dtype": "f32",
            "cpu_linear": kernel_words(loaded[0][5], {n: lane.backend for n, lane in engine.lanes.items()}),
            "page_bytes": shared.page_bytes, "models": names}
    return [manifest for _, manifest, *_ in loaded], engine, shared, info


async def load_into(engine: LLMEngine, shared: SharedPages | None, name: str) -> tuple[ChatTemplate, dict]:
    """Load model `name` into a several-model engine at run time (pagedkv.shared_cpu.add_model). Returns its chat
    template. Raises LookupError (not a several-model engine, or loaded already), FileNotFoundError (no such
    model), ValueError (it does not fit the pages) or NeverFits (its weights' pages are not free now), each
    with the numbers."""
    if shared is None:
        raise LookupError("this engine holds one model in a pool of its own; create it with several models "
                          "(createEngine({models: [...]})) to load more at run time")
    if name in engine.models:
        raise LookupError(f"{name} is loaded already")
    try:
        manifest, weights, linear, attention, _ = await cpu_weights(name, bridge.progress(name))
    except RuntimeError as exc:  # bridge.fetch_bytes: the site has no such model
        if "HTTP 404" in str(exc):
            raise FileNotFoundError(f"there is no model {name!r} here ({exc})") from None
        raise
    tokenizer = Tokenizer.from_manifest(manifest)
    add_model(engine, shared, CpuModel(name, weights, tokenizer, linear, attention))
    return ChatTemplate.from_manifest(manifest, tokenizer), manifest
