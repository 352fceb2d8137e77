"""CPU backend: the numpy reference forward plus its paged KV pools, behind the engine's Backend protocol.

It is the oracle the WebGPU backend is checked against and the fallback when a
browser has no WebGPU. See backends/__init__.py for what each call does.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..kernels.ref_attention import check_block_ids
from ..kernels.ref_ops import shift_keys
from ..kv.accounting import SharedKVBudget
from ..kv.block_pool import CopyOp
from ..kv.groups import KVGroups
from ..kv.spec import KVSpec
from ..kv.dtypes import pack_tokens, unpack_tokens
from ..kv.retention import ShiftOp, check_shift_groups
from ..model.weights import ModelWeights
from ..model_runner import ForwardBatch
from . import check_attention_mass
from .cpu_attention import WasmAttentionModel
from .cpu_linear import einsum_weights
from .cpu_wasm import wasm_weights
from .numpy_ref import NumpyModel, PagedKVCache


class CpuBackend:
    """Runs the model with numpy; K/V in per-layer pools (num_blocks, block_size, n_kv_heads, head_dim).

    kv_dtype: any name of pagedkv.kv.dtypes; the f32 pools hold the values that dtype's quantizer returns,
    so the CPU engine generates what a GPU engine with the same dtype generates.
    linear: "matmul" (numpy's @, BLAS where numpy has one) or "einsum" (projections and head through
    np.einsum, faster without BLAS: the tab's Pyodide; backends/cpu_linear.py), or "wasm": weights loaded
    with cpu_wasm.tensor_loader, their quantized projections through the wasm kernel, einsum for the rest.
    attention: the wasm attention kernels (backends/cpu_attention.py) for every one-token step, or None: the
    reference's attention throughout.
    pages: (num_pages, page_floats) f32 that several models' backends share (one budget, one pool: the
    engine's add_model); the pools are views of it (PagedKVCache.in_pages): a page holds one block of every
    pool. num_blocks is the pool's page count, which may pass the buffer's: those pages only hold weights
    (LLMEngine's backed_pages).
    kv_groups: True (default): a model with sliding-window layers keeps its KV in groups (kv/groups.py), one pool
    per slot of a group (a page holds one group's layers, in its own pool or in shared `pages` alike), and the
    engine gives each group its own block tables; False: every layer holds the whole context (one group of all
    layers, the layout of a model without windows).
    """

    name = "cpu"

    def __init__(self, weights: ModelWeights, num_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 kv_dtype: str = "f32", linear: str = "matmul", attention=None, pages: np.ndarray | None = None,
                 kv_groups: bool = True) -> None:
        if linear not in ("matmul", "einsum", "wasm"):
            raise ValueError(f"linear must be matmul, einsum or wasm, got {linear!r}")
        self.config = weights.config
        self.kv_groups = KVGroups.of(self.config)
        if not kv_groups:  # every layer holds the whole context, as before groups existed
            self.kv_groups = KVGroups.flat(self.config.n_layers)
        pools = self.kv_groups.group_size  # per-slot pools: every layer's with one group
        self.model = NumpyModel(weights) if attention is None else WasmAttentionModel(weights, attention)
        if linear != "matmul":
            head = "token_embd.weight" if self.config.tied_embeddings else "output.weight"
            wrap = einsum_weights if linear == "einsum" else wasm_weights
            self.model.w = wrap(self.model.w, self.config.n_layers, head)
        if pages is not None:  # the pool's pages past the buffer hold weights only (LLMEngine's backed_pages)
            if pages.shape[0] > num_blocks:
                raise ValueError(f"{pages.shape[0]} shared pages but the pool has {num_blocks} blocks")
            self.kv = PagedKVCache.in_pages(self.config, pages, block_size, kv_dtype, num_pools=pools)
        else:
            self.kv = PagedKVCache.allocate(self.config, num_blocks, block_size, kv_dtype, num_pools=pools)
        if isinstance(self.model, WasmAttentionModel):  # before anything is written: the mirror starts as zeros
            self.model.mirror_kv(self.kv)
        self.kv_dtype = kv_dtype
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_cpu_blocks = num_cpu_blocks
        shape = (max(num_cpu_blocks, 1), block_size, self.config.n_kv_heads, self.config.head_dim)
        # Swap space: (layer, or slot with KV groups) x (num_cpu_blocks, block_size, n_kv_heads, head_dim)
        self.cpu_k = [np.zeros(shape, np.float32) for _ in range(pools)]
        self.cpu_v = [np.zeros(shape, np.float32) for _ in range(pools)]

    @staticmethod
    def pool_bytes_per_token(config) -> int:
        """Bytes one token takes in the pools here: f32 K and V of every layer (what sizes them from a budget)."""
        return 2 * config.n_layers * config.n_kv_heads * config.head_dim * np.dtype(np.float32).itemsize

    @staticmethod
    def page_bytes_per_token(config) -> int:
        """Bytes one token takes in a page of the pools (kv_groups=True): f32 K and V of one KV group's layers,
        every layer's for a model without window layers (pool_bytes_per_token)."""
        return CpuBackend.pool_bytes_per_token(config) // config.n_layers * KVGroups.of(config).group_size

    @property
    def kernel_note(self) -> str | None:
        """Why a decode step's attention runs on one thread where the kernel threads run the products (the KV
        mirror they could not get: WasmAttentionModel.mirror_error), in the device panel's words; else None."""
        error = getattr(self.model, "mirror_error", None)
        return f"{error}, so decode attention runs on one thread" if error else None

    @property
    def kv_spec(self) -> KVSpec:
        """The KV cache's geometry and element type."""
        return KVSpec.of(self.config, block_size=self.block_size, dtype=self.kv_dtype, groups=self.kv_groups)

    @property
    def bytes_per_token(self) -> int:
        """What kv_dtype would take on a GPU (the pools here hold f32 arrays)."""
        return self.kv_spec.bytes_per_token

    async def forward(self, batch: ForwardBatch, *, greedy: bool = False,
                      attention_mass: np.ndarray | None = None) -> np.ndarray:
        if attention_mass is not None:
            check_attention_mass(attention_mass, batch)
            attention_mass[...] = 0.0  # NumpyModel adds into it
        logits = self.model.forward(batch, self.kv, attention_mass=attention_mass)  # (S, vocab)
        return np.argmax(logits, axis=1).astype(np.int32) if greedy else logits

    async def copy_blocks(self, ops: Iterable[CopyOp]) -> None:
        ops = list(ops)
        for src, dst in ops:
            for pool in (*self.kv.k, *self.kv.v):
                pool[dst] = pool[src]
        self.model.kv_blocks_written(self.kv, [dst for _, dst in ops])

    async def shift_keys(self, ops: Iterable[ShiftOp]) -> None:
        ops = list(ops)
        check_shift_groups(ops, self.kv_groups.num_groups)
        for g, group in enumerate(self.kv_groups.groups):  # a page of group g holds its layers, one per slot
            mine = [op for op in ops if op.group == g]
            if not mine:
                continue
            blocks = np.array([op.block for op in mine], dtype=np.int64)  # (n,)
            deltas = np.array([op.delta for op in mine], dtype=np.int64)  # (n,)
            for pool, layer in zip(self.kv.k, group.layers):
                inv = self.model.inv_freqs[layer]
                if inv is not None:  # a layer without rotary holds its keys unrotated
                    pool[blocks] = shift_keys(pool[blocks], deltas, inv)
        self.model.kv_blocks_written(self.kv, [op.block for op in ops])

    async def swap_out(self, ops: Iterable[CopyOp]) -> None:
        for gpu, cpu in ops:  # the whole page: every pool
            for pool in range(len(self.kv.k)):
                self.cpu_k[pool][cpu] = self.kv.k[pool][gpu]
                self.cpu_v[pool][cpu] = self.kv.v[pool][gpu]

    async def swap_in(self, ops: Iterable[CopyOp]) -> None:
        ops = list(ops)
        for cpu, gpu in ops:
            for pool in range(len(self.kv.k)):
                self.kv.k[pool][gpu] = self.cpu_k[pool][cpu]
                self.kv.v[pool][gpu] = self.cpu_v[pool][cpu]
        self.model.kv_blocks_written(self.kv, [gpu for _, gpu in ops])

    async def read_blocks(self, block_ids: list[int]) -> np.ndarray:
        ids = check_block_ids(block_ids, self.num_blocks)  # (n,) distinct, as on WebGPU
        cfg = self.config
        # (pools, 2, n, block_size, n_kv_heads, head_dim) -> (n, pools, 2, block_size, n_kv_heads, head_dim); a
        # pool is a layer's, or with KV groups a slot's (a page holds group_size layers)
        values = np.stack([np.stack([k[ids], v[ids]]) for k, v in zip(self.kv.k, self.kv.v)])
        values = values.transpose(2, 0, 1, 3, 4, 5)
        # The pools hold round_trip(x) values; packing them again gives the codes kv_write stored.
        words = pack_tokens(values.reshape(-1, cfg.n_kv_heads, cfg.head_dim), self.kv_dtype)
        return words.reshape(values.shape[:4] + (-1,))  # (n, pools, 2, block_size, token_u32s)

    async def write_blocks(self, block_ids: list[int], words: np.ndarray) -> None:
        cfg = self.config
        values = unpack_tokens(words, self.kv_dtype, cfg.n_kv_heads, cfg.head_dim)  # (n, pools, 2, bs, kv, hd)
        for pool in range(len(self.kv.k)):
            for i, block in enumerate(block_ids):
                self.kv.k[pool][block] = values[i, pool, 0]
                self.kv.v[pool][block] = values[i, pool, 1]
        self.model.kv_blocks_written(self.kv, block_ids)


def plan_pages(configs, block_size: int = 16) -> tuple[int, list[int]]:
    """Pages several models' f32 pools share (CpuBackend(pages=...), KV groups on): the page's bytes, sized so
    the widest page (most bytes a token: every layer's K/V, or one KV group's layers for a model with window
    layers) gets `block_size` tokens a block and a whole number of every model's per-layer blocks (the wasm
    attention steps through a page view by whole blocks), and each model's block size in it."""
    bpts = [CpuBackend.page_bytes_per_token(c) for c in configs]
    align = math.lcm(*(64 * c.n_kv_heads * c.head_dim * 4 for c in configs))  # any allowed block divides 64
    page = SharedKVBudget.page_bytes_for(bpts, block_size, align)
    return page, [SharedKVBudget.block_size_in(page, bpt, f"{c.n_layers}-layer") for bpt, c in zip(bpts, configs)]


def allocate_pages(num_pages: int, page_bytes: int) -> np.ndarray:
    """(num_pages, page_bytes / 4) f32 zeros: the shared pages of plan_pages."""
    return np.zeros((num_pages, page_bytes // 4), np.float32)


def block_size_in_page(page_bytes: int, config, name: str = "a model") -> int:
    """A model's block size in plan_pages' pages (loaded after they were planned): the largest allowed block
    whose f32 tokens fit a page and whose per-layer block a page holds a whole number of; ValueError naming
    the sizes when none does."""
    size = SharedKVBudget.block_size_in(page_bytes, CpuBackend.page_bytes_per_token(config), name)
    layer_block = size * config.n_kv_heads * config.head_dim * 4
    if page_bytes % layer_block:
        raise ValueError(f"{name}'s per-layer blocks ({layer_block:,} B) do not tile this engine's pages of "
                         f"{page_bytes:,} B (they were sized for the models it was created with)")
    return size
