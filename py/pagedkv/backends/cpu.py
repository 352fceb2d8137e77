"""CPU backend: the numpy reference forward plus its paged KV pools, behind the engine's backend API.

It is the oracle the WebGPU backend is checked against and the fallback when a
browser has no WebGPU. The backend API (shared with backends/webgpu_engine.py):

    num_blocks, block_size, num_cpu_blocks      pool geometry
    await forward(batch, greedy=False)          (S, vocab) f32 logits of each sequence's last new token,
                                                or with greedy=True (S,) int32 argmax ids (lowest id on
                                                ties), so a GPU backend reads back S ints, not S x vocab
    await copy_blocks(ops)                      copy-on-write, GPU block -> GPU block
    await shift_keys(ops)                       re-rotate cached keys of blocks by -delta (kv_retention.py)
    track_attention_mass / last_attention_mass  when set before forward: (S, max_blocks) f32 attention
                                                mass per block-table entry of the last forward
    await swap_out(ops) / await swap_in(ops)    GPU block <-> CPU block
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..kv_cache_manager import CopyOp
from ..model.weights import ModelWeights
from ..kv_retention import ShiftOp
from .numpy_ref import ForwardBatch, NumpyModel, PagedKVCache, shift_keys


class CpuBackend:
    """Runs the model with numpy; K/V in per-layer pools (num_blocks, block_size, n_kv_heads, head_dim).

    kv_dtype: any name of pagedkv.kv_dtype; the f32 pools hold the values that dtype's quantizer returns,
    so the CPU engine generates what a GPU engine with the same dtype generates.
    """

    name = "cpu"

    def __init__(self, weights: ModelWeights, num_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 kv_dtype: str = "f32") -> None:
        self.config = weights.config
        self.model = NumpyModel(weights)
        self.kv = PagedKVCache.allocate(self.config, num_blocks, block_size, kv_dtype)
        self.kv_dtype = kv_dtype
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_cpu_blocks = num_cpu_blocks
        shape = (max(num_cpu_blocks, 1), block_size, self.config.n_kv_heads, self.config.head_dim)
        # Swap space: (layer) x (num_cpu_blocks, block_size, n_kv_heads, head_dim)
        self.cpu_k = [np.zeros(shape, np.float32) for _ in range(self.config.n_layers)]
        self.cpu_v = [np.zeros(shape, np.float32) for _ in range(self.config.n_layers)]
        self.track_attention_mass = False
        self.last_attention_mass: np.ndarray | None = None  # (S, max_blocks) f32

    async def forward(self, batch: ForwardBatch, greedy: bool = False) -> np.ndarray:
        mass = np.zeros(batch.block_tables.shape, np.float32) if self.track_attention_mass else None
        logits = self.model.forward(batch, self.kv, attention_mass=mass)  # (S, vocab)
        self.last_attention_mass = mass
        return np.argmax(logits, axis=1).astype(np.int32) if greedy else logits

    async def copy_blocks(self, ops: Iterable[CopyOp]) -> None:
        for src, dst in ops:
            for pool in (*self.kv.k, *self.kv.v):
                pool[dst] = pool[src]

    async def shift_keys(self, ops: Iterable[ShiftOp]) -> None:
        ops = list(ops)
        if not ops:
            return
        blocks = np.array([op.block for op in ops], dtype=np.int64)  # (n,)
        deltas = np.array([op.delta for op in ops], dtype=np.int64)  # (n,)
        for pool in self.kv.k:
            pool[blocks] = shift_keys(pool[blocks], deltas, self.model.inv_freq)

    async def swap_out(self, ops: Iterable[CopyOp]) -> None:
        for gpu, cpu in ops:
            for layer in range(self.config.n_layers):
                self.cpu_k[layer][cpu] = self.kv.k[layer][gpu]
                self.cpu_v[layer][cpu] = self.kv.v[layer][gpu]

    async def swap_in(self, ops: Iterable[CopyOp]) -> None:
        for cpu, gpu in ops:
            for layer in range(self.config.n_layers):
                self.kv.k[layer][gpu] = self.cpu_k[layer][cpu]
                self.kv.v[layer][gpu] = self.cpu_v[layer][cpu]
