"""Several models on the CPU backend in one LLMEngine under one byte budget: pagedkv.api.Engine's and the tab's
(app/pagedkv_app/cpu_models.py) one way to build it.

The budget is cut into pages (backends/cpu.plan_pages: the widest model gets `block_size` tokens a page, the
others the largest block that fits). Each model's weights take their bytes' worth of pages; those pages are
numbered past the page buffer, which has memory for the KV pages only (LLMEngine's backed_pages). Every
model's CpuBackend views the one buffer (CpuBackend(pages=...)). docs/api.md, "Several models, one budget,
one pool".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .backends.cpu import CpuBackend, allocate_pages, block_size_in_page, plan_pages
from .engine import EngineConfig, LLMEngine
from .model.weights import ModelWeights
from .tokenizer import Tokenizer

__all__ = ["BudgetTooSmall", "CpuModel", "SharedPages", "add_model", "shared_engine"]

MIB = 1 << 20


class BudgetTooSmall(ValueError):
    """The models' weights leave less than two pages of KV in the budget."""


@dataclass(frozen=True)
class CpuModel:
    """A model for the CPU backend: its name in the engine, weights, tokenizer and CpuBackend's linear /
    attention choices."""

    name: str
    weights: ModelWeights
    tokenizer: Tokenizer
    linear: str = "matmul"
    attention: object = None


@dataclass(frozen=True)
class SharedPages:
    """The page buffer every model's backend views, and its page size."""

    pages: np.ndarray
    page_bytes: int


def weights_pages(weights: ModelWeights, page_bytes: int) -> int:
    """Pages of the budget a model's weights take."""
    return math.ceil(sum(t.nbytes for t in weights.tensors.values()) / page_bytes)


def _backend(model: CpuModel, num_pages: int, block_size: int, shared: SharedPages) -> CpuBackend:
    return CpuBackend(model.weights, num_pages, block_size, linear=model.linear, attention=model.attention,
                      pages=shared.pages)


def shared_engine(models: list[CpuModel], budget_bytes: int, block_size: int = 16,
                  config: EngineConfig = EngineConfig()) -> tuple[LLMEngine, SharedPages]:
    """One engine of `models` under `budget_bytes`; BudgetTooSmall with each model's weights and the page size
    when less than two pages of KV are left."""
    page, sizes = plan_pages([m.weights.config for m in models], block_size)
    num_pages = budget_bytes // page
    need = [weights_pages(m.weights, page) for m in models]
    if sum(need) + 2 > num_pages:  # at least two pages of KV (a prompt and its first token's block)
        held = ", ".join(f"{m.name} {n * page / MIB:.1f} MiB" for m, n in zip(models, need))
        raise BudgetTooSmall(f"the models' weights take {held} and the KV pool at least two pages of "
                             f"{page / MIB:.2f} MiB; budget {budget_bytes / MIB:g} MiB")
    backed = num_pages - sum(need)
    shared = SharedPages(allocate_pages(backed, page), page)  # memory for the KV pages only
    first = models[0]
    engine = LLMEngine(_backend(first, num_pages, sizes[0], shared), first.tokenizer, config, model=first.name,
                       pool=num_pages, backed_pages=backed)
    engine.reserve_for(first.name, need[0])
    for model, size, n in zip(models[1:], sizes[1:], need[1:]):
        engine.add_model(model.name, _backend(model, num_pages, size, shared), model.tokenizer, reserve_blocks=n)
    return engine, shared


def add_model(engine: LLMEngine, shared: SharedPages, model: CpuModel) -> None:
    """Load `model` into shared_engine's engine at run time: its weights take pages of the budget (those past
    the buffer first), its blocks are the largest that fit a page. ValueError when it does not fit the pages,
    NeverFits when its weights' pages are not free now, each with the numbers."""
    try:
        size = block_size_in_page(shared.page_bytes, model.weights.config, model.name)
    except ValueError as exc:
        raise ValueError(f"{model.name} does not fit this engine's pages ({exc}); name it when the engine is "
                         "created") from None
    engine.add_model(model.name, _backend(model, engine.pool.num_blocks, size, shared), model.tokenizer,
                     reserve_blocks=weights_pages(model.weights, shared.page_bytes))
