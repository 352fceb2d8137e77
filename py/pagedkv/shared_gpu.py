"""Several models on the WebGPU backend in one LLMEngine under one GPU budget: the tab's and the tests' one way
to build it (the CPU path's twin is shared_cpu.py).

One GpuLedger holds the budget: every model's weights, scratch and staging first, then the one buffer of equal
pages (backends/webgpu/shared_pages.py: the widest model gets `block_size` tokens a page, the others the largest
block that fits) that every model's KV views. The engine's pool numbers those pages; each model's WebGpuBackend
addresses all of them. A model loaded at run time (add_gpu_model) takes its buffers from what the ledger has
left (the bytes a model unloaded before gave back) and, where that is short, from pages: the page buffers are
allocated again with fewer pages (LLMEngine.unback_pages). docs/api.md, "Several models, one budget, one pool".
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .backends.webgpu.backend import WebGpuBackend
from .backends.webgpu.memory_plan import plan_kv_pool
from .backends.webgpu.shared_pages import SharedGpuPages, block_size_in, plan_gpu_pages
from .engine import EngineConfig, LLMEngine
from .gpu_budget import MIB, BudgetExceeded, GpuLedger
from .model.weights import check_manifest
from .tokenizer import Tokenizer

__all__ = ["GpuModel", "SharedGpu", "add_gpu_model", "shared_gpu_engine"]


@dataclass(frozen=True)
class GpuModel:
    """A model for the WebGPU backend: its name in the engine, manifest, shards (`await shard_source(file)`)
    and tokenizer."""

    name: str
    manifest: dict
    shard_source: Callable[[str], Awaitable[bytes]]
    tokenizer: Tokenizer


@dataclass(frozen=True)
class GpuOptions:
    """What every model's WebGpuBackend is created with (the engine config's limits size their scratch)."""

    kv_dtype: str = "f16"
    kernels: str = "cpu"
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 16
    cpu_budget_bytes: int | None = None
    kv_groups: bool = True  # a model with window layers keeps its KV groups in the pages (False: every layer full)

    @classmethod
    def of(cls, config: EngineConfig, **kw) -> "GpuOptions":
        return cls(max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs, **kw)


@dataclass(frozen=True)
class SharedGpu:
    """The pages every model's KV views, and the options each model's backend is created with."""

    pages: SharedGpuPages
    options: GpuOptions


async def _backend(ctx, model: GpuModel, block_size: int, pages: SharedGpuPages, opts: GpuOptions,
                   on_progress, num_blocks: int | None = None) -> WebGpuBackend:
    return await WebGpuBackend.create(
        ctx, model.manifest, model.shard_source, budget_bytes=pages.ledger.budget_bytes, block_size=block_size,
        kv_dtype=opts.kv_dtype, kernels=opts.kernels, max_num_batched_tokens=opts.max_num_batched_tokens,
        max_num_seqs=opts.max_num_seqs, cpu_budget_bytes=opts.cpu_budget_bytes, pages=pages, name=model.name,
        num_blocks=num_blocks, kv_groups=opts.kv_groups,
        on_progress=None if on_progress is None else lambda done, total: on_progress(model.name, done, total))


async def shared_gpu_engine(ctx, models: list[GpuModel], budget_bytes: int, *, block_size: int = 16,
                            kv_dtype: str = "f16", kernels: str = "cpu", cpu_budget_bytes: int | None = None,
                            config: EngineConfig = EngineConfig(),
                            on_progress: Callable[[str, int, int], None] | None = None, kv_groups: bool = True
                            ) -> tuple[LLMEngine, SharedGpu]:
    """One engine of `models` on `ctx` under `budget_bytes`; BudgetExceeded with each model's fixed bytes and
    the page size when less than two pages of KV are left (nothing stays allocated). kv_groups: a model with
    sliding-window layers keeps its KV groups in the pages (a page: one block of one group's layers; its window
    groups free their pages as the window slides), or with False every layer of a block in a page."""
    opts = GpuOptions.of(config, kv_dtype=kv_dtype, kernels=kernels, cpu_budget_bytes=cpu_budget_bytes,
                         kv_groups=kv_groups)
    page, sizes = plan_gpu_pages([check_manifest(m.manifest) for m in models], kv_dtype, block_size, kv_groups)
    limits = ctx.info.limits
    fixed = [_fixed_bytes(ctx, m, bs, opts, budget_bytes) for m, bs in zip(models, sizes)]
    num_pages = SharedGpuPages.pages_that_fit(budget_bytes - sum(fixed), page, limits)
    if num_pages < 2:  # a prompt's block and its first token's
        held = ", ".join(f"{m.name} {n / MIB:.1f} MiB" for m, n in zip(models, fixed))
        raise BudgetExceeded(f"the models' weights, scratch and staging take {held} and the KV pool at least two "
                             f"pages of {page / MIB:.2f} MiB; budget {budget_bytes / MIB:g} MiB")
    pages = SharedGpuPages(ctx, GpuLedger(budget_bytes), num_pages, page)
    backends: list[WebGpuBackend] = []
    try:
        for model, size in zip(models, sizes):
            backends.append(await _backend(ctx, model, size, pages, opts, on_progress))
    except BaseException:
        for backend in backends:
            backend.destroy()
        pages.destroy()
        raise
    engine = LLMEngine(backends[0], models[0].tokenizer, config, model=models[0].name, pool=num_pages)
    for model, backend in zip(models[1:], backends[1:]):
        engine.add_model(model.name, backend, model.tokenizer)
    return engine, SharedGpu(pages, opts)


def _fixed_bytes(ctx, model: GpuModel, block_size: int, opts: GpuOptions, budget_bytes: int) -> int:
    """Bytes of a model's weights, scratch and staging (memory_plan, no device)."""
    return plan_kv_pool(model.manifest, budget_bytes=budget_bytes, block_size=block_size, kv_dtype=opts.kv_dtype,
                        max_num_batched_tokens=opts.max_num_batched_tokens, max_num_seqs=opts.max_num_seqs,
                        max_binding=ctx.info.limits["maxStorageBufferBindingSize"],
                        kv_groups=opts.kv_groups)["fixed_bytes"]  # with its KV groups' tables in scratch


async def add_gpu_model(ctx, engine: LLMEngine, shared: SharedGpu, model: GpuModel, on_progress=None) -> None:
    """Load `model` into shared_gpu_engine's engine at run time. Its buffers take what the ledger has left
    (what models unloaded before gave back) and, where that is short, pages: the page buffers are allocated
    again smaller (a GPU buffer cannot shrink), which needs no request to hold a page now (their cached
    content is dropped), and the pages given up are the model's until it is unloaded (spare pages after).
    ValueError when its blocks do not fit a page; NeverFits / BudgetExceeded with the numbers when its bytes
    cannot be had."""
    pages, opts = shared.pages, shared.options
    try:
        size = block_size_in(pages.page_bytes, check_manifest(model.manifest), opts.kv_dtype, model.name,
                             opts.kv_groups)
    except ValueError as exc:
        raise ValueError(f"{model.name} does not fit this engine's pages ({exc}); name it when the engine is "
                         "created") from None
    ledger = pages.ledger
    short = _fixed_bytes(ctx, model, size, opts, ledger.budget_bytes) - ledger.free_bytes
    give = max(0, -(-short // pages.page_bytes))  # pages whose memory the model's buffers take
    if give:
        def reallocate(num_pages: int) -> None:
            pages.resize(num_pages)
            for lane in engine.lanes.values():
                lane.backend.rebind_pages()

        await engine.unback_pages(give, reallocate)
    backend = await _backend(ctx, model, size, pages, opts, on_progress, engine.pool.num_blocks)
    try:
        engine.add_model(model.name, backend, model.tokenizer, reserve_blocks=give)
    except BaseException:
        backend.destroy()
        raise
