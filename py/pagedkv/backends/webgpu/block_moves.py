"""The KV cache's block moves on the WebGPU backend: copy-on-write copies, swaps to and from the CPU pool, key
re-rotation, and whole blocks out and in for the disk tier. A mixin of WebGpuBackend (backend.py), which owns
the buffers these read: kv_caches, kv_kernels, cpu_k / cpu_v, config, block_size, kv_dtype, kv_layout."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ...kernels.ref_ops import model_inv_freq, shift_keys
from ...kv.manager import CopyOp
from ...kv.dtypes import pack_tokens, unpack_tokens
from ...kv.retention import ShiftOp

SWAP_CHUNK_BLOCKS = 32  # blocks per layer per gather/scatter call; bounds the swap staging buffers


class KVBlockMoves:
    """Block copies, swaps, shifts and disk reads/writes over every layer's K and V."""

    @staticmethod
    def _chunks(ops_list: list[CopyOp]) -> Iterable[np.ndarray]:
        pairs = np.asarray(ops_list, dtype=np.int32).reshape(-1, 2)  # (n, 2)
        for i in range(0, pairs.shape[0], SWAP_CHUNK_BLOCKS):
            yield pairs[i : i + SWAP_CHUNK_BLOCKS]

    async def copy_blocks(self, ops_list: Iterable[CopyOp]) -> None:
        """Copy-on-write: GPU block src -> dst in every layer's K and V."""
        for pairs in self._chunks(list(ops_list)):
            for cache in self.kv_caches:
                await self.kv_kernels.copy_blocks(cache, pairs)

    async def swap_out(self, ops_list: Iterable[CopyOp]) -> None:
        """GPU block -> CPU block for each (gpu, cpu) pair, all layers."""
        self._check_cpu(ops_list := list(ops_list), column=1)
        for pairs in self._chunks(ops_list):
            # Two sequences swapped out together may share a prefix block: it is read once, copied to both.
            gpu, where = np.unique(pairs[:, 0], return_inverse=True)  # (m,), (n,)
            for layer, cache in enumerate(self.kv_caches):
                k, v = await self.kv_kernels.swap_out(cache, gpu)
                self.cpu_k[layer][pairs[:, 1]] = k[where]
                self.cpu_v[layer][pairs[:, 1]] = v[where]

    async def swap_in(self, ops_list: Iterable[CopyOp]) -> None:
        """CPU block -> GPU block for each (cpu, gpu) pair, all layers."""
        self._check_cpu(ops_list := list(ops_list), column=0)
        for pairs in self._chunks(ops_list):
            for layer, cache in enumerate(self.kv_caches):
                await self.kv_kernels.swap_in(cache, pairs[:, 1], self.cpu_k[layer][pairs[:, 0]],
                                              self.cpu_v[layer][pairs[:, 0]])

    async def shift_keys(self, ops_list: Iterable[ShiftOp]) -> None:
        """Re-rotate the cached keys of each block by -delta positions, all layers (sliding window, shifted
        positions): the blocks' K go through the swap kernels to numpy and back, V is untouched."""
        ops_list = list(ops_list)
        inv_freq = model_inv_freq(self.config)  # (head_dim / 2,)
        for i in range(0, len(ops_list), SWAP_CHUNK_BLOCKS):
            chunk = ops_list[i : i + SWAP_CHUNK_BLOCKS]
            ids = np.array([op.block for op in chunk], dtype=np.int32)  # (n,)
            deltas = np.array([op.delta for op in chunk], dtype=np.int64)  # (n,)
            for cache in self.kv_caches:
                k, v = await self.kv_kernels.swap_out(cache, ids)  # (n, block_size, n_kv_heads, head_dim) each
                await self.kv_kernels.swap_in(cache, ids, shift_keys(k, deltas, inv_freq), v)

    async def read_blocks(self, block_ids: list[int]) -> np.ndarray:
        """Whole blocks as (n, layers, 2, block_size, token_u32s) u32 words (the disk tier's payload)."""
        cfg, bs = self.config, self.block_size
        words = lambda host: host if host.dtype == np.uint32 else pack_tokens(  # noqa: E731  f32 / f16 values
            host.reshape(-1, cfg.n_kv_heads, cfg.head_dim), self.kv_dtype).reshape(host.shape[0], bs, -1)
        parts = []  # (n, layers, 2, block_size, token_u32s) per chunk
        for i in range(0, len(block_ids), SWAP_CHUNK_BLOCKS):
            ids = np.asarray(block_ids[i : i + SWAP_CHUNK_BLOCKS], dtype=np.int32)  # (n,)
            layers = [[words(h) for h in await self.kv_kernels.swap_out(cache, ids)] for cache in self.kv_caches]
            parts.append(np.stack([np.stack(kv, axis=1) for kv in layers], axis=1))
        return np.concatenate(parts)

    async def write_blocks(self, block_ids: list[int], words: np.ndarray) -> None:
        """The inverse of read_blocks."""
        cfg, lay = self.config, self.kv_layout
        host = words if lay.storage_dtype == np.uint32 else unpack_tokens(
            words, self.kv_dtype, cfg.n_kv_heads, cfg.head_dim).astype(lay.storage_dtype)  # (n, layers, 2, ...)
        for i in range(0, len(block_ids), SWAP_CHUNK_BLOCKS):
            ids = np.asarray(block_ids[i : i + SWAP_CHUNK_BLOCKS], dtype=np.int32)  # (n,)
            for layer, cache in enumerate(self.kv_caches):
                chunk = host[i : i + len(ids), layer]  # (n, 2, block_size, ...)
                await self.kv_kernels.swap_in(cache, ids, np.ascontiguousarray(chunk[:, 0]),
                                              np.ascontiguousarray(chunk[:, 1]))

    def _check_cpu(self, ops_list: list[CopyOp], column: int) -> None:
        for op in ops_list:
            if not 0 <= op[column] < self.num_cpu_blocks:
                raise ValueError(f"CPU block {op[column]} outside the swap pool of {self.num_cpu_blocks} blocks")
