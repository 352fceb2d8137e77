"""Host side of shaders/attention_mass.wgsl: attention mass per block-table entry, for importance eviction.

Uses GpuContext methods only (no `js` here). The reference is kernels/ref_attention_mass.py.
"""
from __future__ import annotations

import math

import numpy as np

from ...kernels import ref_attention as ref
from .kv_kernels import KVKernels, Prepared, Temporaries
from .model_kernels import uniform_words

WORKGROUP_SIZE = 64


class AttentionMassKernel:
    """The compiled attention_mass pipeline for one KV layout (f32 or f16 cache), run through KVKernels."""

    def __init__(self, kernels: KVKernels) -> None:
        if kernels.layout.dtype not in ("f32", "f16"):
            raise ValueError(f"attention mass reads f32 or f16 KV caches, not {kernels.layout.dtype!r}; "
                             "importance eviction is not available with this KV dtype")
        self.kernels = kernels
        self.pipeline = None

    async def compile(self) -> "AttentionMassKernel":
        lay = self.kernels.layout
        self.pipeline = await self.kernels.ctx.kernel("attention_mass", {
            "HEAD_DIM": lay.head_dim, "KV_F16": int(lay.dtype == "f16"), "WORKGROUP_SIZE": WORKGROUP_SIZE,
            "HEAD_MAJOR": int(lay.head_major),
            **({"BLOCK_U32": lay.stride_words * 4} if lay.page_words else {})})
        return self

    def prepare(self, k_cache, query, query_start_loc: np.ndarray, block_tables: np.ndarray,
                context_lens: np.ndarray, scale: float | None = None, window: int = 0) -> Prepared:
        """Mass (num_seqs, n_heads, max_blocks) f32 of query over the K cache buffer `k_cache` (window > 0: a
        window layer's, whose queries see their last `window` keys).

        query: (num_tokens, n_heads, head_dim) f32, as an array or as a GPU buffer already holding it.
        """
        kk, lay = self.kernels, self.kernels.layout
        tables, lens = ref.check_block_tables(block_tables, context_lens, lay.num_blocks, lay.block_size)
        num_tokens = int(np.asarray(query_start_loc)[-1])
        starts = ref.check_query_start_loc(query_start_loc, lens, num_tokens)
        if isinstance(query, np.ndarray) and query.shape != (num_tokens, kk.n_heads, lay.head_dim):
            raise ValueError(f"query must be ({num_tokens}, {kk.n_heads}, {lay.head_dim}), got {query.shape}")
        scale = 1.0 / math.sqrt(lay.head_dim) if scale is None else float(scale)
        num_seqs, width = lens.size, tables.shape[1]
        with Temporaries(kk.ctx) as tmp:
            q = tmp.f32(query, "query") if isinstance(query, np.ndarray) else query
            params = tmp.scratch(32, "mass_params", uniform=True)
            kk.ctx.write(params, uniform_words(num_seqs, kk.n_heads, lay.n_kv_heads, lay.block_size, width, scale,
                                                       int(window)))
            out = tmp.scratch(num_seqs * kk.n_heads * width * 4, "mass")  # (S, n_heads, max_blocks)
            kk.ctx.write(out, np.zeros(num_seqs * kk.n_heads * width, np.float32))
            group = kk.ctx.bind(self.pipeline, [q, k_cache, tmp.u32(tables, "block_tables"),
                                                tmp.u32(lens, "context_lens"),
                                                tmp.u32(starts, "query_start_loc"), out, params])
            return Prepared([(self.pipeline, group, (-(-num_seqs * kk.n_heads // WORKGROUP_SIZE), 1, 1))], out,
                            (num_seqs, kk.n_heads, width), tmp)

    async def run(self, k_cache, query, query_start_loc, block_tables, context_lens, scale=None,
                  window: int = 0) -> np.ndarray:
        """Submit once and read the mass back, (num_seqs, n_heads, max_blocks) f32."""
        prepared = self.prepare(k_cache, query, query_start_loc, block_tables, context_lens, scale, window)
        return await self.kernels.run(prepared, "attention_mass")
