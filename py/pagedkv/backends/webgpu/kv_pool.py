"""The GPU KV pool: K and V buffers of paged blocks, the CPU swap pool beside them, and the block moves over them:
copy-on-write copies, swaps to and from the CPU pool, key re-rotation, and whole blocks out and in for the disk
tier.

A block id is a page of one KV group's layers (kv/groups.py): the pool keeps one K and one V buffer per slot of a
group, and layer l reads and writes the buffers of its slot j (`cache_of`), through its group's block table. A
model without window layers is one group: a buffer pair per layer, as before groups existed. Every move works
on whole pages (every slot's buffers), so it serves every group alike.

WebGpuBackend (backend.py) holds one and hands it the engine's block operations (Backend.copy_blocks, swap_out,
...); its forward's plan (plan.py) binds each layer's slot's buffers, where kv_write and attention read and
write the blocks. Every move goes through the swap / copy kernels of KVKernels (kv_kernels.py),
SWAP_CHUNK_BLOCKS blocks per slot at a time.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ...gpu_budget import GpuLedger
from ...kernels.ref_ops import layer_inv_freq, shift_keys
from ...kv.block_pool import CopyOp
from ...kv.dtypes import pack_tokens, unpack_tokens
from ...kv.groups import KVGroups
from ...kv.retention import ShiftOp, check_shift_groups
from ...model.config import ModelConfig
from .kv_kernels import KVKernels
from .kv_layout import KVCacheBuffers

SWAP_CHUNK_BLOCKS = 32  # blocks per layer per gather/scatter call; bounds the swap staging buffers


class GpuKVPool:
    """The KV blocks of one model on one device: K and V of every slot of a KV group in kernels.layout
    (num_blocks pages), num_cpu_blocks pages of the same words in host memory, and the moves between them."""

    def __init__(self, ctx, kernels: KVKernels, config: ModelConfig, ledger: GpuLedger, pages=None,
                 groups: KVGroups | None = None) -> None:
        """pages: the SharedGpuPages (shared_pages.py) several models' pools view (a page holds one block of one
        group's layers, a slot each); None: buffers of its own. groups: the KV groups its pages hold (default: one
        group of every layer)."""
        self.ctx = ctx
        self.pages = pages
        self.kernels = kernels  # compiled for this pool's layout: the moves run its gather / scatter / copy kernels
        self.layout = kernels.layout
        self.config = config
        self.ledger = ledger
        self.groups = groups or KVGroups.flat(config.n_layers)
        self.caches: list[KVCacheBuffers] = []  # one per slot (every layer's with one group), once allocate() ran
        self.cpu_k: list[np.ndarray] = []  # one per slot, once allocate_cpu() ran
        self.cpu_v: list[np.ndarray] = []
        self.num_cpu_blocks = 0

    @property
    def num_slots(self) -> int:
        """K / V buffer pairs: the layers one page holds (a group's)."""
        return self.groups.group_size

    def cache_of(self, layer: int) -> KVCacheBuffers:
        """Decoder layer `layer`'s K and V buffers: its slot's in its group."""
        return self.caches[self.groups.where(layer)[1]]

    @property
    def num_blocks(self) -> int:
        """GPU blocks (pages) in each slot's K (and V) buffer."""
        return self.layout.num_blocks

    def allocate(self) -> None:
        """Every slot's K and V buffers, each reserved in the ledger first (raises BudgetExceeded); with shared
        pages, every slot's views into them (reserved once, by their owner)."""
        if self.pages is not None:
            self.caches = [KVCacheBuffers(self.ctx, self.layout, kv)
                           for kv in self.pages.views(self.layout, self.num_slots)]
            return
        for slot in range(self.num_slots):
            self.ledger.reserve(f"kv.{slot}.k", self.layout.nbytes, "kv")
            self.ledger.reserve(f"kv.{slot}.v", self.layout.nbytes, "kv")
            self.caches.append(KVCacheBuffers(self.ctx, self.layout))

    def allocate_cpu(self, num_cpu_blocks: int) -> None:
        """The CPU swap pool (wasm memory) of num_cpu_blocks blocks."""
        self.num_cpu_blocks = num_cpu_blocks
        shape = (max(num_cpu_blocks, 1),) + self.layout.storage_shape[1:]
        # (slot) x (num_cpu_blocks, block_size, n_kv_heads, head_dim) in the cache dtype for f32 / f16,
        # (slot) x (num_cpu_blocks, block_size, token_u32s) u32 words for quantized dtypes
        self.cpu_k = [np.zeros(shape, self.layout.storage_dtype) for _ in range(self.num_slots)]
        self.cpu_v = [np.zeros(shape, self.layout.storage_dtype) for _ in range(self.num_slots)]

    def destroy(self) -> None:
        """Free every slot's buffers and their ledger reservations."""
        for slot, cache in enumerate(self.caches):
            cache.destroy()
            if cache.owned:
                self.ledger.release(f"kv.{slot}.k")
                self.ledger.release(f"kv.{slot}.v")
        self.caches = []

    # ------------------------------------------------------------------ block moves

    @staticmethod
    def _chunks(ops_list: list[CopyOp]) -> Iterable[np.ndarray]:
        pairs = np.asarray(ops_list, dtype=np.int32).reshape(-1, 2)  # (n, 2)
        for i in range(0, pairs.shape[0], SWAP_CHUNK_BLOCKS):
            yield pairs[i : i + SWAP_CHUNK_BLOCKS]

    async def copy_blocks(self, ops_list: Iterable[CopyOp]) -> None:
        """Copy-on-write: GPU page src -> dst in every slot's K and V."""
        for pairs in self._chunks(list(ops_list)):
            for cache in self.caches:
                await self.kernels.copy_blocks(cache, pairs)

    async def swap_out(self, ops_list: Iterable[CopyOp]) -> None:
        """GPU page -> CPU page for each (gpu, cpu) pair, every slot."""
        self._check_cpu(ops_list := list(ops_list), column=1)
        for pairs in self._chunks(ops_list):
            # Two sequences swapped out together may share a prefix block: it is read once, copied to both.
            gpu, where = np.unique(pairs[:, 0], return_inverse=True)  # (m,), (n,)
            for slot, cache in enumerate(self.caches):
                k, v = await self.kernels.swap_out(cache, gpu)
                self.cpu_k[slot][pairs[:, 1]] = k[where]
                self.cpu_v[slot][pairs[:, 1]] = v[where]

    async def swap_in(self, ops_list: Iterable[CopyOp]) -> None:
        """CPU page -> GPU page for each (cpu, gpu) pair, every slot."""
        self._check_cpu(ops_list := list(ops_list), column=0)
        for pairs in self._chunks(ops_list):
            for slot, cache in enumerate(self.caches):
                await self.kernels.swap_in(cache, pairs[:, 1], self.cpu_k[slot][pairs[:, 0]],
                                           self.cpu_v[slot][pairs[:, 0]])

    async def shift_keys(self, ops_list: Iterable[ShiftOp]) -> None:
        """Re-rotate the cached keys of each block by -delta positions, every layer of its KV group (op.group) with
        its own rotary frequencies, none in a layer without rotary (sliding window, shifted positions): the
        blocks' K go through the swap kernels to numpy and back, V is untouched."""
        ops_list = list(ops_list)
        check_shift_groups(ops_list, self.groups.num_groups)
        for g, group in enumerate(self.groups.groups):  # slot j of a group-g page holds layer group.layers[j]
            mine = [op for op in ops_list if op.group == g]
            for i in range(0, len(mine), SWAP_CHUNK_BLOCKS):
                chunk = mine[i : i + SWAP_CHUNK_BLOCKS]
                ids = np.array([op.block for op in chunk], dtype=np.int32)  # (n,)
                deltas = np.array([op.delta for op in chunk], dtype=np.int64)  # (n,)
                for cache, layer in zip(self.caches, group.layers):
                    inv_freq = layer_inv_freq(self.config, self.config.layers[layer])
                    if inv_freq is None:
                        continue
                    k, v = await self.kernels.swap_out(cache, ids)  # (n, block_size, n_kv_heads, head_dim) each
                    await self.kernels.swap_in(cache, ids, shift_keys(k, deltas, inv_freq), v)

    async def read_blocks(self, block_ids: list[int]) -> np.ndarray:
        """Whole pages as (n, slots, 2, block_size, token_u32s) u32 words (the disk tier's payload; slots: every
        layer with one KV group, as the CPU backend's pools)."""
        lay = self.layout
        words = lambda host: host if host.dtype == np.uint32 else pack_tokens(  # noqa: E731  f32 / f16 values
            host.reshape(-1, lay.n_kv_heads, lay.head_dim), lay.dtype).reshape(host.shape[0], lay.block_size, -1)
        parts = []  # (n, slots, 2, block_size, token_u32s) per chunk
        for i in range(0, len(block_ids), SWAP_CHUNK_BLOCKS):
            ids = np.asarray(block_ids[i : i + SWAP_CHUNK_BLOCKS], dtype=np.int32)  # (n,)
            layers = [[words(h) for h in await self.kernels.swap_out(cache, ids)] for cache in self.caches]
            parts.append(np.stack([np.stack(kv, axis=1) for kv in layers], axis=1))
        return np.concatenate(parts)

    async def write_blocks(self, block_ids: list[int], words: np.ndarray) -> None:
        """The inverse of read_blocks."""
        lay = self.layout
        host = words if lay.storage_dtype == np.uint32 else unpack_tokens(
            words, lay.dtype, lay.n_kv_heads, lay.head_dim).astype(lay.storage_dtype)  # (n, slots, 2, ...)
        for i in range(0, len(block_ids), SWAP_CHUNK_BLOCKS):
            ids = np.asarray(block_ids[i : i + SWAP_CHUNK_BLOCKS], dtype=np.int32)  # (n,)
            for slot, cache in enumerate(self.caches):
                chunk = host[i : i + len(ids), slot]  # (n, 2, block_size, ...)
                await self.kernels.swap_in(cache, ids, np.ascontiguousarray(chunk[:, 0]),
                                           np.ascontiguousarray(chunk[:, 1]))

    def _check_cpu(self, ops_list: list[CopyOp], column: int) -> None:
        for op in ops_list:
            if not 0 <= op[column] < self.num_cpu_blocks:
                raise ValueError(f"CPU block {op[column]} outside the swap pool of {self.num_cpu_blocks} blocks")
