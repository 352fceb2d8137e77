"""Boot sequence of the in-tab app after the worker has loaded Pyodide, numpy and the wheels."""
from __future__ import annotations

import asyncio
import traceback

import numpy as np

import pagedkv
from pagedkv.backends.choice import choose_backend
from pagedkv.backends.cpu import CpuBackend
from pagedkv.browser import interop as webgpu
from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.backends.webgpu.device import WebGPUUnavailable
from pagedkv.backends.webgpu.model_kernels import choose_family
from pagedkv.backends.webgpu.self_test import self_test
from pagedkv.backends.webgpu.tuning import JsonInStore, tune_device
from pagedkv.browser.opfs import OpfsStore, open_or_memory
from pagedkv.chat import ChatTemplate
from pagedkv.engine import EngineConfig, LLMEngine, TierBudgets
from pagedkv.kv.dtypes import kv_dtype as kv_dtype_named
from pagedkv.model.family import UnsupportedModel
from pagedkv.shared_gpu import SharedGpu
from pagedkv.tokenizer import Tokenizer

from . import bridge, model_library
from .chat_service import ChatService
from .cpu_models import cpu_weights, kernel_words, load_into, shared_cpu_engine
from .gpu_models import load_gpu_model, shard_reader, shared_gpu_models
from .user_models import model_id

DEFAULT_MODEL = "smollm2-135m-instruct"
MIB = 1 << 20

state: dict = {}  # what the worker holds alive: GPU context, engine, chat service


def progress(stage: str, detail: str) -> None:
    """Report boot stage `stage` (one of build.py's BOOT_STAGES, in whose order the page shows them)."""
    bridge.post("progress", stage=stage, detail=detail)


async def boot() -> None:
    """Request the WebGPU device from Python, run the self-test kernel, report `ready`, then load the model."""
    bridge.set_router(route)
    await model_library.reported(model_library.post_list(), "list-models")
    try:
        progress("engine", f"pagedkv {pagedkv.__version__} with numpy {np.__version__}")
        progress("gpu", "requesting a WebGPU adapter")
        ctx = await webgpu.GpuContext.create(on_lost=on_device_lost)
        state["gpu"] = ctx
        kernels, why = state["kernels"] = kernel_family(ctx)
        backend, backend_why = state["backend"] = choose_backend(
            bridge.query_param("backend", "auto"), ctx.info.name, is_fallback(ctx))
        progress("gpu", f"adapter {ctx.info.name}: running the self-test kernel")
        check = await self_test(ctx)
        bridge.post(
            "ready",
            engine=pagedkv.__version__,
            numpy=np.__version__,
            adapter={
                "name": ctx.info.name,
                "vendor": ctx.info.vendor,
                "architecture": ctx.info.architecture,
                "description": ctx.info.description,
                "limits": ctx.info.limits,
                "features": list(ctx.info.features),
                "kernels": kernels,
                "kernels_reason": why,
                "backend": backend,
                "backend_reason": backend_why,
            },
            selftest=check,
        )
    except WebGPUUnavailable as exc:
        # Say so plainly, then chat anyway on the numpy reference backend inside the tab (slow).
        bridge.post("no-webgpu", message=str(exc))
        state["backend"] = ("cpu", "no WebGPU in this browser, so the CPU fallback: slow")
        await load_requested(force_cpu=True)
        return
    except Exception as exc:  # reported to the page, never swallowed
        bridge.post("error", kind="internal", message=f"{type(exc).__name__}: {exc}",
                    detail=traceback.format_exc())
        return
    await load_requested()


FILE_SLOT = "file:"  # ?models= names the i-th GGUF File createEngine posts file:<i>


async def requested_models() -> list[str]:
    """?model= then the others of ?models=, in order. `file:<i>` stands for the i-th GGUF File or Blob that
    pagedkv.js's createEngine posts (open-gguf with slot i) once Python is up: it is converted and stored in
    OPFS as the page's "Open GGUF" does, then named by its user model id."""
    first = bridge.query_param("model", DEFAULT_MODEL)
    names = list(dict.fromkeys([first] + [m for m in bridge.query_param("models", "").split(",") if m]))  # once each
    slots = {n: int(n[len(FILE_SLOT):]) for n in names if n.startswith(FILE_SLOT)}
    loop = asyncio.get_running_loop()
    waiting = state.setdefault("gguf_slots", {})
    for i in slots.values():
        waiting.setdefault(i, loop.create_future())
    stored = {n: await waiting[i] for n, i in slots.items()}
    return [stored.get(n, n) for n in names]



async def load_requested(force_cpu: bool = False) -> None:
    """Load the models the page asked for (requested_models); a GGUF that could not be stored is a model-error."""
    try:
        names = await requested_models()
    except Exception as exc:
        bridge.post("model-error", model=bridge.query_param("model", DEFAULT_MODEL),
                    message=f"{type(exc).__name__}: {exc}", detail=traceback.format_exc())
        return
    await load_model(*names, force_cpu=force_cpu)


async def _open_slot(msg) -> None:
    """A GGUF createEngine was given (slot i of requested_models): stored, its id goes to the load waiting."""
    future = state.setdefault("gguf_slots", {}).setdefault(int(msg.slot), asyncio.get_running_loop().create_future())
    try:
        await model_library.open_gguf(msg.file, open_settings())
        future.set_result(model_id(str(msg.file.name)))
    except Exception as exc:  # the load waiting on it reports it as model-error
        bridge.post("gguf-error", action="open-gguf", message=str(exc) or type(exc).__name__,
                    error=type(exc).__name__, detail=traceback.format_exc())
        future.set_exception(exc)


def route(msg) -> None:
    """The worker's one router of page messages, all but tools' `exec` (docs/architecture.md, "The page <->
    worker protocol"): the model list's go to model_library as they are (a File stays a File), every other
    to the chat service as a dict once a model is loaded."""
    kind = str(getattr(msg, "type", None))
    if kind == "open-gguf" and getattr(msg, "slot", None) is not None:
        task = asyncio.ensure_future(_open_slot(msg))
        state.setdefault("tasks", set()).add(task)
        task.add_done_callback(state["tasks"].discard)
    elif kind in model_library.ACTIONS:
        model_library.handle(msg, open_settings)
    elif "service" in state:
        state["service"].handle(bridge.plain(msg))
    else:
        bridge.post("chat-error", chat=getattr(msg, "chat", None), message="the model is still loading")


def kernel_family(ctx) -> tuple[str, str]:
    """The kernel family for ?kernels=auto|cpu|gpu on this adapter, and why (model_kernels.choose_family)."""
    return choose_family(bridge.query_param("kernels", "auto"), ctx.info.name, is_fallback(ctx))


def is_fallback(ctx) -> bool:
    """The adapter's isFallbackAdapter (on GPUAdapterInfo in newer browsers, on GPUAdapter in older ones)."""
    info = getattr(ctx.adapter, "info", None)
    return bool(getattr(info, "isFallbackAdapter", False) or getattr(ctx.adapter, "isFallbackAdapter", False))


def open_settings() -> dict:
    """What the ledger checks a GGUF the user opens against: this page's budget and pool settings."""
    ctx = state.get("gpu")
    budget = tier_budgets().gpu_bytes
    return {"budget_bytes": budget, "block_size": int(bridge.query_param("block_size", "16")),
            "kv_dtype": bridge.query_param("kv_dtype", "f16"),
            "max_binding": ctx.info.limits["maxStorageBufferBindingSize"] if ctx is not None else budget}


def tier_budgets() -> TierBudgets:
    """The KV tiers' byte budgets from the memory settings: ?budget_mib= (the GPU: weights, scratch and the KV
    pool), ?cpu_mib= (swapped chats' KV in wasm memory), ?disk_mib= (OPFS)."""
    def mib(key: str, default: str) -> int:
        return int(float(bridge.query_param(key, default)) * MIB)

    return TierBudgets(gpu_bytes=mib("budget_mib", "1024"), cpu_bytes=mib("cpu_mib", "64"),
                       disk_bytes=mib("disk_mib", "512"))


async def load_model(name: str, *also: str, force_cpu: bool = False) -> None:
    """Fetch the model (and `also`: several models share one engine, budget and pool) with progress, build the
    engine and start answering chat messages."""
    try:
        t0 = bridge.now_ms()
        bridge.post("model-progress", model=name, loaded=0, total=1, detail="reading the model manifest")
        on_progress = bridge.progress(name)
        block_size = int(bridge.query_param("block_size", "16"))
        max_context = int(bridge.query_param("max_context", "0")) or None
        config = EngineConfig(namespace=name, max_context=max_context)
        manifests, shared = [], None
        if also and (force_cpu or state["backend"][0] == "cpu"):  # several models: one budget, one pool
            manifests, engine, shared, info = await shared_cpu_engine([name, *also], block_size, config,
                                                                      tier_budgets().gpu_bytes)
        elif also:
            budgets = tier_budgets()
            manifests, engine, shared, info = await shared_gpu_models(
                state["gpu"], [name, *also], block_size=block_size, config=config, budget_bytes=budgets.gpu_bytes,
                cpu_budget_bytes=budgets.cpu_bytes, kv_dtype=kv_dtype_param(), kernels=state["kernels"][0])
        if also:
            manifest, backend = manifests[0], engine.backend
        else:
            if force_cpu or state["backend"][0] == "cpu":
                manifest, backend, info = await _cpu_backend(name, block_size, on_progress)
            else:
                try:
                    manifest, backend, info = await _webgpu_backend(name, block_size, on_progress)
                except UnsupportedModel as exc:  # refused before anything was uploaded
                    if bridge.query_param("backend", "auto") != "auto":
                        raise
                    # ?backend=auto: the tab's CPU path runs every family the reference interprets
                    state["backend"] = ("cpu", f"{exc}: the tab's CPU path runs it")
                    manifest, backend, info = await _cpu_backend(name, block_size, on_progress)
            engine = LLMEngine(backend, Tokenizer.from_manifest(manifest), config, model=name)
        cfg = backend.config
        tokenizer = engine.tokenizer
        names = [name, *also]
        info["kv_disk"] = await _attach_disk(engine, dict(zip(names, manifests)) if also else {name: manifest})
        ledger = shared.pages.ledger if isinstance(shared, SharedGpu) else getattr(backend, "ledger", None)
        service = ChatService(engine, ChatTemplate.from_manifest(manifest, tokenizer), bridge.post, model_name=name,
                              ledger_snapshot=ledger.snapshot if ledger is not None else None,
                              open_stream=bridge.open_stream, webgpu=not force_cpu,
                              loader=load_shared)
        for other, other_manifest in zip(also, manifests[1:]):
            service.api.add_model(other, ChatTemplate.from_manifest(other_manifest, engine.lane(other).tokenizer))
        state.update(engine=engine, service=service, model_name=name, block_size=block_size, shared_pages=shared)
        info.setdefault("models", [name])
        template_note = manifest.get("source", {}).get("chat_template")  # a file without one: its family's turns
        if template_note:
            info["chat_template"] = template_note
        bridge.post("model-ready", model=name, default_model=DEFAULT_MODEL, backend=backend.name,
                    backend_reason=state["backend"][1], load_ms=round(bridge.now_ms() - t0),
                    num_blocks=backend.num_blocks, block_size=block_size, context_length=engine.context_length,
                    layers=cfg.n_layers, **info)
        service.post_stats(force=True)
    except Exception as exc:
        bridge.post("model-error", model=name, message=f"{type(exc).__name__}: {exc}",
                    detail=traceback.format_exc())


async def load_shared(engine: LLMEngine, model: str) -> ChatTemplate:
    """pagedkv.js `engine.load(model)`: into the several-model engine's pages, on its path, with its share of
    the disk tier."""
    shared = state.get("shared_pages")
    if isinstance(shared, SharedGpu):
        template, manifest = await load_gpu_model(state["gpu"], engine, shared, model)
    else:
        template, manifest = await load_into(engine, shared, model)
    await _attach_disk(engine, {model: manifest})
    return template


async def _attach_disk(engine: LLMEngine, manifests: dict[str, dict]) -> str:
    """The disk tier of each model's KV cache (OPFS `kv/`, one ?disk_mib= budget for all) unless ?kv_disk=0;
    what the panel says."""
    if bridge.query_param("kv_disk", "1") == "0":
        return "off (?kv_disk=0)"
    budget = tier_budgets().disk_bytes
    try:
        store = await OpfsStore.open("kv")
    except OSError as exc:  # no OPFS in this browser: chats re-prefill after a reload, as without the tier
        return f"off: {exc}"
    try:
        for model, manifest in manifests.items():
            await engine.open_disk_tier(store, manifest, budget, model=model, background=True)
    except ValueError as exc:  # the tier refused this model's KV (lanes.attach_disk): chat on without it, say why
        return f"off: {exc}"
    except Exception as exc:  # the browser could not list OPFS `kv/`: chat on without the tier, never fail the load
        return f"off: the disk tier's directory could not be listed ({type(exc).__name__}: {exc})"
    return f"on, {budget / MIB:g} MiB budget"


async def _cpu_backend(name: str, block_size: int, on_progress) -> tuple[dict, CpuBackend, dict]:
    """The numpy fallback (?backend=cpu) for one model: a KV pool of ?kv_mib= (default 128 MiB) within what
    ?budget_mib= leaves after the weights; ?kv_dtype= (default f32 here) any name of pagedkv.kv.dtypes."""
    kv_dtype = bridge.query_param("kv_dtype", "f32")
    kv_dtype_named(kv_dtype)  # an unknown name is refused before the weights are fetched
    manifest, weights, linear, attention, why = await cpu_weights(name, on_progress)
    cfg = weights.config
    kv_budget = int(float(bridge.query_param("kv_mib", "128")) * MIB)  # fractions make tiny pools for tests
    budget = tier_budgets().gpu_bytes
    weight_bytes = sum(shard["nbytes"] for shard in manifest["shards"])
    # A block is a page of one KV group's layers (kv/groups.py): every layer for a model without window layers,
    # a group's (Gemma 3 270M: 3 of its 18) where window groups hold only their window.
    bytes_per_token = CpuBackend.page_bytes_per_token(cfg)
    block_bytes = bytes_per_token * block_size
    if budget - weight_bytes < block_bytes:
        raise ValueError(f"a budget of {budget / MIB:g} MiB does not hold {name}: its weights take "
                         f"{weight_bytes / MIB:.2f} MiB and a KV block of {block_size} tokens {block_bytes:,} B "
                         f"more; raise budget_mib")
    num_blocks = min(kv_budget, budget - weight_bytes) // block_bytes
    if num_blocks < 1:
        raise ValueError(f"a {kv_budget / MIB:g} MiB KV budget holds no block of {block_size} tokens "
                         f"({bytes_per_token:,} B/token); raise kv_mib")
    num_cpu_blocks = tier_budgets().cpu_bytes // block_bytes
    # Pyodide's numpy has no BLAS: backends/cpu_linear.py
    backend = CpuBackend(weights, num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                         kv_dtype=kv_dtype, linear=linear, attention=attention)
    return manifest, backend, {"bytes_per_token": bytes_per_token, "kv_dtype": backend.kv_dtype,
                               "cpu_linear": kernel_words(why, {name: backend})}


async def _webgpu_backend(name: str, block_size: int, on_progress) -> tuple[dict, WebGpuBackend, dict]:
    """Weights streamed shard by shard into GPU buffers inside the ?budget_mib= GPU budget (default 1 GiB)."""
    ctx = state["gpu"]
    manifest, shard_source = await shard_reader(name, on_progress)
    total = sum(s["nbytes"] for s in manifest["shards"])
    budgets = tier_budgets()
    kv_dtype = kv_dtype_param()
    tuned = None  # the gpu family's shapes, tuned before the GPU budget is spent (the tuning's buffers come and go)
    if state["kernels"][0] == "gpu":
        bridge.post("model-progress", model=name, loaded=0, total=total, detail="tuning the gpu kernels")
        tuned = await tune_device(ctx, manifest, await _tuning_store(), bridge.user_agent())

    uploaded = bridge.progress(name, "weights uploaded to the GPU")
    backend = await WebGpuBackend.create(
        ctx, manifest, shard_source, budget_bytes=budgets.gpu_bytes, cpu_budget_bytes=budgets.cpu_bytes,
        block_size=block_size, kv_dtype=kv_dtype, kernels=state["kernels"][0], on_progress=uploaded)
    # A block is a page of one KV group's layers, as on the CPU path (every layer's for a model without windows)
    info = {"bytes_per_token": backend.page_bytes_per_token, "kv_dtype": kv_dtype,
            "ledger": backend.ledger.snapshot()}
    if tuned is not None:
        backend.gpu_shapes, info["kernels_tuning"] = tuned
    return manifest, backend, info


async def _tuning_store():
    """Where the gpu family's tuned shapes are kept: OPFS `tuning/` (a later boot reuses them), or for this
    page only where the browser has no origin private file system."""
    return JsonInStore(await open_or_memory("tuning"))


def on_device_lost(reason: str) -> None:
    """device.lost fired: tell the page, park the chats, and rebuild the engine on a new device."""
    bridge.post("device-lost", reason=reason, recovering="service" in state)
    service = state.get("service")
    if service is None or not isinstance(service.engine.backend, WebGpuBackend):
        return  # lost before the model was on the GPU: the page says so; a reload starts over
    if len(service.engine.models) > 1:  # several models' buffers and pages: not rebuilt, say so
        service.device_lost(reason)
        bridge.post("model-error", model=state["model_name"], message="the GPU device was lost; an engine of "
                    "several models is not rebuilt on a new one: reload the page", detail=reason)
        return
    service.device_lost(reason)
    state["recovery"] = asyncio.ensure_future(recover_device())


async def recover_device(attempts: int = 3) -> None:
    """New adapter + device, the weights uploaded again inside the same budget, and every chat goes on
    from its token history (replies in progress re-prefill and keep streaming)."""
    service, name = state["service"], state["model_name"]
    error = None
    for attempt in range(1, attempts + 1):
        try:
            t0 = bridge.now_ms()
            state["gpu"] = await webgpu.GpuContext.create(on_lost=on_device_lost)
            state["kernels"] = kernel_family(state["gpu"])

            on_progress = bridge.progress(name, "the GPU device was lost: uploading the weights to a new one")
            _, backend, _ = await _webgpu_backend(name, state["block_size"], on_progress)
            resumed = service.resume_on(backend, backend.ledger.snapshot)
            state["engine"] = service.engine
            bridge.post("device-restored", model=name, attempt=attempt, resumed=len(resumed),
                        num_blocks=backend.num_blocks, rebuild_ms=round(bridge.now_ms() - t0))
            return
        except Exception as exc:  # try again: a device can be lost again while it is being set up
            error = exc
            await asyncio.sleep(0.5 * attempt)
    bridge.post("model-error", model=name, message=f"the GPU device was lost and could not be rebuilt "
                f"after {attempts} attempts ({type(error).__name__}: {error}); reload the page",
                detail="".join(traceback.format_exception(error)))


def kv_dtype_param() -> str:
    """?kv_dtype= of the WebGPU path: f32, f16 (default), int8, fp8-e4m3, int4, int4-asym."""
    return bridge.query_param("kv_dtype", "f16")
