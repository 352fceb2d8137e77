"""Host side of the KV-cache kernels: the calls over one layer's paged K/V pool (kv_layout.py) that feed
shaders/kv_write, copy_blocks, paged_attention (+ _reduce; the kernel family's own, kv_attention_gpu.py)
and paged_prefill_attention.

Uses only GpuContext methods (no `js` here). Every call validates its inputs with the same checks as the
numpy references in pagedkv.kernels.ref_attention and raises ValueError before touching the GPU.
Each kernel has a `prepare_*` that uploads inputs and builds bind groups once (a `Prepared` whose
dispatches can be submitted again and again, as a benchmark or a replayed plan does) and a one-shot
async call that prepares, submits, reads the result back and frees its temporaries.

Element type of the cache: GpuKVLayout.dtype (its KVSpec's), any name of pagedkv.kv.dtypes (f32, f16, int8,
fp8-e4m3, int4, int4-asym); it becomes the kernels' pipeline constants KV_FORMAT / KV_GROUP. f16 is packed two
per u32 (no shader-f16 feature needed); quantized dtypes keep their per-row scales inside each token's words
(kv/dtypes.py), so copy_blocks and the swaps move them with the data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...kernels import ref_attention as ref
from .kv_attention_gpu import check_partition, decode_kernels, prefill_kernel
from .kv_layout import WORD_BYTES, GpuKVLayout, KVCacheBuffers
from .model_kernels import uniform_words

PARTITION_TOKENS = 128  # flash-decoding partition of a long context (KVKernels, scratch sizes)


@dataclass
class Prepared:
    """Uploaded inputs + bind groups of one kernel call; `dispatches` can be submitted any number of times."""

    dispatches: list
    out: object  # result buffer (None for in-place kernels)
    out_shape: tuple
    temporaries: list = field(default_factory=list)
    out_dtype: np.dtype = np.dtype(np.float32)

    def destroy(self) -> None:
        for buf in self.temporaries:
            buf.destroy()
        self.temporaries = []


class Temporaries(list):
    """The GPU buffers one call creates; all destroyed again if preparing the call fails half-way."""

    def __init__(self, ctx) -> None:
        super().__init__()
        self.ctx = ctx

    def __enter__(self) -> "Temporaries":
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is not None:
            for buf in self:
                buf.destroy()
            self.clear()

    def u32(self, array: np.ndarray, label: str):
        """A new storage buffer holding `array` as u32."""
        buf = self.ctx.upload(np.ascontiguousarray(array, dtype=np.uint32), label)
        self.append(buf)
        return buf

    def f32(self, array: np.ndarray, label: str):
        """A new storage buffer holding `array` as f32."""
        buf = self.ctx.upload(np.ascontiguousarray(array, dtype=np.float32), label)
        self.append(buf)
        return buf

    def scratch(self, nbytes: int, label: str, uniform: bool = False):
        """A new uninitialised storage (or uniform) buffer of nbytes."""
        buf = self.ctx.buffer(nbytes, label, uniform=uniform)
        self.append(buf)
        return buf


class KVKernels:
    """The compiled KV-cache kernels for one layout and query-head count, and their host calls."""

    def __init__(self, ctx, layout: GpuKVLayout, n_heads: int, *, partition_tokens: int = PARTITION_TOKENS,
                 workgroup_size: int = 16, head_tile: int | None = None, query_tile: int = 4,
                 family: str = "cpu", subgroups: bool = False) -> None:
        # partition_tokens: flash-decoding split. Small partitions give a single sequence's decode enough
        # invocations to use every core (SwiftShader runs one workgroup per thread); measured at 512 tokens,
        # 128 beat 512 by ~25% and matched it at 4,096.
        ref.check_heads(n_heads, layout.n_kv_heads)
        if partition_tokens < layout.block_size:
            raise ValueError(f"partition_tokens ({partition_tokens}) must be >= block_size ({layout.block_size})")
        self.ctx = ctx
        self.layout = layout
        self.n_heads = n_heads
        self.partition_blocks = partition_tokens // layout.block_size
        self.workgroup_size = workgroup_size
        # family: whose attention kernels run (kv_attention_gpu.py); kv_write, copy_blocks and the swaps are shared
        self.decode = decode_kernels(family, subgroups, workgroup_size, layout.head_dim)
        check_partition(family, self.partition_blocks, layout.block_size)
        group = n_heads // layout.n_kv_heads
        # Query heads per invocation: by default the largest tile (<= 4, the kernels' vec4 of states) that
        # splits a GQA group evenly, so each K/V load serves that many heads.
        if head_tile is None:
            head_tile = max(t for t in (1, 2, 3, 4) if group % t == 0)
        if head_tile not in (1, 2, 3, 4) or group % head_tile:
            raise ValueError(f"head_tile must be 1..4 and divide the {group} query heads per kv head, got {head_tile}")
        self.head_tile = head_tile
        if query_tile not in (1, 2, 3, 4):
            raise ValueError(f"query_tile must be 1..4 (new tokens per prefill invocation), got {query_tile}")
        # the gpu family's prefill sets its own new tokens per tile (query_tile is the cpu family's)
        self.prefill = prefill_kernel(self.decode.family, head_tile, layout.head_dim, query_tile, workgroup_size,
                                      layout.block_size)
        self.query_tile = self.prefill.query_tile
        self.pipelines: dict[str, object] = {}

    async def compile(self) -> "KVKernels":
        """Compile the seven pipelines once (GpuContext caches them per constant set)."""
        wg = {"WORKGROUP_SIZE": self.workgroup_size}
        consts = dict(self.layout.constants, **wg)
        for entry in ("gather_blocks", "scatter_blocks"):
            self.pipelines[entry] = await self.ctx.kernel("copy_blocks", wg, entry_point=entry)
        lay = self.layout
        write = dict(consts, WORKGROUP_SIZE=lay.kv_write_workgroup or self.workgroup_size,
                     **({"HEADS": lay.kv_write_heads} if lay.kind.quantized else {}), BLOCK_TOKENS=lay.block_size)
        self.pipelines["kv_write"] = await self.ctx.kernel(self.layout.kv_write_shader, write)
        for name, constants in (("copy_blocks", wg),
                                (self.prefill.name, dict(consts, **dict(self.prefill.constants),
                                                         WORKGROUP_SIZE=self.prefill.workgroup))):
            self.pipelines[name] = await self.ctx.kernel(name, constants)
        # the passes after a long walk's first (paged_prefill_attention_main.wgsl, paged_prefill_attention_gpu.wgsl)
        self.pipelines[self.prefill_resume] = await self.ctx.kernel(
            self.prefill.name, dict(consts, **dict(self.prefill.constants), WORKGROUP_SIZE=self.prefill.workgroup,
                                    RESUME=True))
        (attn, shader, entry, size), (reduce, reduce_shader, reduce_entry, reduce_size) = self.decode.specs
        self.pipelines[attn] = await self.ctx.kernel(
            shader, dict(consts, SLOTS=self.head_tile, WORKGROUP_SIZE=size), entry_point=entry)
        self.pipelines[reduce] = await self.ctx.kernel(
            reduce_shader, {"HEAD_DIM": self.layout.head_dim, "WORKGROUP_SIZE": reduce_size}, entry_point=reduce_entry)
        return self

    def workgroups(self, invocations: int, workgroup_size: int | None = None) -> tuple[int, int, int]:
        """A 1-D grid of workgroups (of workgroup_size, else the kernels' size) covering `invocations`,
        refused over the device's per-dimension limit."""
        size = workgroup_size or self.workgroup_size
        groups = -(-invocations // size)
        limit = self.ctx.info.limits.get("maxComputeWorkgroupsPerDimension", 65535)
        if groups > limit:
            raise ValueError(f"{invocations} invocations need {groups} workgroups of {size}, "
                             f"over the device limit {limit}; split the batch")
        return (max(groups, 1), 1, 1)

    def kv_write_grid(self, num_tokens: int) -> tuple[int, int, int]:
        """Workgroup grid of kv_write / kv_write_quant over num_tokens new rows."""
        lay = self.layout
        return self.workgroups(lay.kv_write_invocations(num_tokens), lay.kv_write_workgroup)

    def decode_grids(self, num_seqs: int, max_parts: int) -> tuple[tuple, tuple]:
        """Workgroup grids of decode attention's pass 1 and merge pass (the family's kernels)."""
        d = self.decode
        work, merge = d.invocations(num_seqs, max_parts, self.n_heads, self.head_tile, self.layout.head_dim)
        return self.workgroups(work, d.attention_workgroup), self.workgroups(merge, d.reduce_workgroup)

    @property
    def prefill_resume(self) -> str:
        """The pipelines key of the prefill passes after the first."""
        return self.prefill.name + "_resume"

    def prefill_passes(self, context_lens: np.ndarray) -> int:
        """Dispatches of prefill attention for contexts of context_lens tokens: 1 unless a walk is longer than a
        pass (PrefillKernel.pass_keys)."""
        return self.prefill.passes(int(np.max(context_lens)))

    def prefill_grid(self, num_tiles: int) -> tuple[int, int, int]:
        """Workgroup grid of prefill attention over num_tiles query tiles (the family's kernel)."""
        p = self.prefill
        return self.workgroups(p.invocations(num_tiles, self.n_heads, self.head_tile), p.workgroup)

    # ------------------------------------------------------------------ kv_write / copy_blocks

    def prepare_kv_write(self, cache: KVCacheBuffers, k_new: np.ndarray, v_new: np.ndarray,
                         slot_mapping: np.ndarray) -> Prepared:
        """Rows k_new/v_new (num_tokens, n_kv_heads, head_dim) into their slots of `cache`."""
        lay = self.layout
        slots = ref.check_kv_rows(k_new, v_new, slot_mapping, lay.shape)  # (num_tokens,)
        groups = self.kv_write_grid(slots.size)
        with Temporaries(self.ctx) as tmp:
            params = tmp.scratch(16, "params", uniform=True)
            self.ctx.write(params, uniform_words(slots.size, lay.n_kv_heads))
            buffers = [tmp.f32(k_new, "k_new"), tmp.f32(v_new, "v_new"),
                       tmp.u32(slots, "slots"), cache.k, cache.v, params]
            pipeline = self.pipelines["kv_write"]
            return Prepared([(pipeline, self.ctx.bind(pipeline, buffers), groups)], None, (), tmp)

    def prepare_copy_blocks(self, cache: KVCacheBuffers, pairs: np.ndarray) -> Prepared:
        """Copy block src -> dst for each (src, dst) row of `pairs` (n, 2), in K and V."""
        pairs = ref.check_block_pairs(pairs, self.layout.num_blocks)  # (n, 2)
        groups = self.workgroups(pairs.shape[0] * self.layout.block_words)
        with Temporaries(self.ctx) as tmp:
            params = tmp.scratch(16, "params", uniform=True)
            self.ctx.write(params, uniform_words(pairs.shape[0], self.layout.block_words, self.layout.stride_words))
            buffers = [tmp.u32(pairs, "block_pairs"), cache.k, cache.v, params]
            pipeline = self.pipelines["copy_blocks"]
            return Prepared([(pipeline, self.ctx.bind(pipeline, buffers), groups)], None, (), tmp)

    def prepare_gather_blocks(self, cache: KVCacheBuffers, block_ids: np.ndarray) -> Prepared:
        """Swap-out staging: the listed blocks of K and V, copied into one buffer read back as
        (2, n) + storage_shape[1:] in the cache dtype, each block in the kernels' order (swap_out gives the
        host's)."""
        lay = self.layout
        ids = ref.check_block_ids(block_ids, lay.num_blocks)  # (n,)
        groups = self.workgroups(ids.size * lay.block_words)
        with Temporaries(self.ctx) as tmp:
            params = tmp.scratch(16, "params", uniform=True)
            self.ctx.write(params, uniform_words(ids.size, lay.block_words, lay.stride_words))
            staging = tmp.scratch(2 * ids.size * lay.block_words * WORD_BYTES, "staging")
            pipeline = self.pipelines["gather_blocks"]
            group = self.ctx.bind(pipeline, {1: cache.k, 2: cache.v, 3: params,
                                             4: tmp.u32(ids, "block_ids"), 5: staging})
            return Prepared([(pipeline, group, groups)], staging, (2, ids.size) + lay.storage_shape[1:], tmp,
                            lay.storage_dtype)

    def prepare_scatter_blocks(self, cache: KVCacheBuffers, block_ids: np.ndarray, k_blocks: np.ndarray,
                               v_blocks: np.ndarray) -> Prepared:
        """Swap-in: block block_ids[i] of K and V becomes k_blocks[i] / v_blocks[i]
        ((n, block_size, n_kv_heads, head_dim) each, in the cache dtype)."""
        lay = self.layout
        ids = ref.check_block_ids(block_ids, lay.num_blocks)  # (n,)
        want = (ids.size,) + lay.storage_shape[1:]
        for name, blocks in (("k_blocks", k_blocks), ("v_blocks", v_blocks)):
            if blocks.shape != want or blocks.dtype != lay.storage_dtype:
                raise ValueError(f"{name} must be {want} {lay.storage_dtype}, got {blocks.shape} {blocks.dtype}")
        groups = self.workgroups(ids.size * lay.block_words)
        with Temporaries(self.ctx) as tmp:
            params = tmp.scratch(16, "params", uniform=True)
            self.ctx.write(params, uniform_words(ids.size, lay.block_words, lay.stride_words))
            staging = self.ctx.upload(np.stack([lay.device_order(k_blocks), lay.device_order(v_blocks)]), "staging")
            tmp.append(staging)
            pipeline = self.pipelines["scatter_blocks"]
            group = self.ctx.bind(pipeline, {1: cache.k, 2: cache.v, 3: params,
                                             4: tmp.u32(ids, "block_ids"), 5: staging})
            return Prepared([(pipeline, group, groups)], None, (), tmp)

    # ------------------------------------------------------------------ attention

    def _check_attention(self, query, block_tables, context_lens, query_start_loc=None):
        lay = self.layout
        if query.ndim != 3 or query.shape[1:] != (self.n_heads, lay.head_dim):
            raise ValueError(f"query must be (tokens, n_heads={self.n_heads}, head_dim={lay.head_dim}), "
                             f"got {query.shape}")
        tables, lens = ref.check_block_tables(block_tables, context_lens, lay.num_blocks, lay.block_size)
        starts = None if query_start_loc is None else ref.check_query_start_loc(query_start_loc, lens, query.shape[0])
        if query_start_loc is None and query.shape[0] != lens.size:
            raise ValueError(f"decode takes one query token per sequence: {query.shape[0]} queries for "
                             f"{lens.size} sequences")
        max_parts = int(-(-(-(-lens.max() // lay.block_size)) // self.partition_blocks))
        return tables, lens, starts, max_parts

    def _attention_inputs(self, cache, query, tables, lens, max_parts, scale, tmp, window: int = 0) -> list:
        """Bindings 0-5 shared by the attention kernels (paged_kv_read.wgsl); window: a window layer's (0: none)."""
        lay = self.layout
        scale = 1.0 / math.sqrt(lay.head_dim) if scale is None else float(scale)
        params = uniform_words(lens.size, self.n_heads, lay.n_kv_heads, lay.block_size, tables.shape[1],
                               self.partition_blocks, max_parts, scale, int(window))
        buffers = [tmp.f32(query, "query"), cache.k, cache.v, tmp.u32(tables, "block_tables"),
                   tmp.u32(lens, "context_lens"), tmp.scratch(params.nbytes, "params", uniform=True)]
        self.ctx.write(buffers[-1], params)
        return buffers

    def prepare_paged_attention(self, cache: KVCacheBuffers, query: np.ndarray, block_tables: np.ndarray,
                                context_lens: np.ndarray, scale: float | None = None, window: int = 0) -> Prepared:
        """Decode attention of query (num_seqs, n_heads, head_dim) -> out (num_seqs, n_heads, head_dim) f32;
        window > 0: a window layer's (the query sees its last `window` keys).

        Contexts longer than one partition are split across invocations and merged by a second dispatch.
        """
        tables, lens, _, max_parts = self._check_attention(query, block_tables, context_lens)
        num_seqs, d = lens.size, self.layout.head_dim
        groups, reduce_groups = self.decode_grids(num_seqs, max_parts)
        with Temporaries(self.ctx) as tmp:
            buffers = self._attention_inputs(cache, query, tables, lens, max_parts, scale, tmp, window)
            out = tmp.scratch(num_seqs * self.n_heads * d * 4, "out")  # (num_seqs, n_heads, head_dim)
            part_acc = tmp.scratch(num_seqs * max_parts * self.n_heads * d * 4, "part_acc")
            part_stats = tmp.scratch(num_seqs * max_parts * self.n_heads * 8, "part_stats")
            attn = self.pipelines[self.decode.attention]
            dispatches = [(attn, self.ctx.bind(attn, buffers + [out, part_acc, part_stats]), groups)]
            if max_parts > 1:
                reduce = self.pipelines[self.decode.reduce]
                params = tmp.scratch(32, "reduce_params", uniform=True)
                self.ctx.write(params, uniform_words(num_seqs, self.n_heads, self.layout.block_size,
                                                     self.partition_blocks, max_parts))
                group = self.ctx.bind(reduce, [buffers[4], part_acc, part_stats, out, params])
                dispatches.append((reduce, group, reduce_groups))
            return Prepared(dispatches, out, (num_seqs, self.n_heads, d), tmp)

    def prepare_prefill_attention(self, cache: KVCacheBuffers, query: np.ndarray, query_start_loc: np.ndarray,
                                  block_tables: np.ndarray, context_lens: np.ndarray,
                                  scale: float | None = None, window: int = 0) -> Prepared:
        """Causal chunked prefill of query (num_tokens, n_heads, head_dim) -> out of the same shape, f32;
        window > 0: a window layer's (a query at cache index i sees keys j with i - j < window).

        Run kv_write for the chunk's new tokens first: the kernel reads all keys through the block table.
        """
        tables, lens, starts, max_parts = self._check_attention(query, block_tables, context_lens, query_start_loc)
        tiles = -(-np.diff(starts) // self.query_tile)  # (num_seqs,) invocations per head of each sequence
        tile_starts = np.concatenate([[0], np.cumsum(tiles)])  # (num_seqs + 1,)
        groups = self.prefill_grid(int(tile_starts[-1]))
        with Temporaries(self.ctx) as tmp:
            buffers = self._attention_inputs(cache, query, tables, lens, max_parts, scale, tmp, window)
            out = tmp.scratch(query.shape[0] * self.n_heads * self.layout.head_dim * 4, "out")
            starts = tmp.u32(np.stack([starts, tile_starts]), "starts")  # (2, num_seqs + 1)
            buffers += [starts, out]
            buffers.append(tmp.scratch(query.shape[0] * self.n_heads * 16, "prefill_state"))  # (T, n_heads) vec4
            names = [self.prefill.name] + [self.prefill_resume] * (self.prefill_passes(lens) - 1)
            dispatches = [(self.pipelines[n], self.ctx.bind(self.pipelines[n], buffers), groups) for n in names]
            return Prepared(dispatches, out, query.shape, tmp)

    # ------------------------------------------------------------------ one-shot calls

    async def run(self, prepared: Prepared, what: str) -> np.ndarray | None:
        """Submit once, read the result (if any) back, free the temporaries."""
        try:
            self.ctx.push_errors()
            self.ctx.submit(prepared.dispatches)
            await self.ctx.pop_errors(what)
            if prepared.out is None:
                await self.ctx.done()
                return None
            return await self.ctx.read_array(prepared.out, prepared.out_dtype, prepared.out_shape)
        finally:
            prepared.destroy()

    async def kv_write(self, cache, k_new, v_new, slot_mapping) -> None:
        """Reshape-and-cache on the GPU (see prepare_kv_write)."""
        await self.run(self.prepare_kv_write(cache, k_new, v_new, slot_mapping), "kv_write")

    async def copy_blocks(self, cache, pairs) -> None:
        """Block copies on the GPU (see prepare_copy_blocks)."""
        await self.run(self.prepare_copy_blocks(cache, pairs), "copy_blocks")

    async def swap_out(self, cache, block_ids) -> tuple[np.ndarray, np.ndarray]:
        """The listed blocks of K and V on the host, (n, block_size, n_kv_heads, head_dim) each."""
        staged = await self.run(self.prepare_gather_blocks(cache, block_ids), "gather_blocks")
        return self.layout.host_order(staged[0]), self.layout.host_order(staged[1])

    async def swap_in(self, cache, block_ids, k_blocks, v_blocks) -> None:
        """Host blocks back into the listed physical blocks (see prepare_scatter_blocks)."""
        await self.run(self.prepare_scatter_blocks(cache, block_ids, k_blocks, v_blocks), "scatter_blocks")

    async def paged_attention(self, cache, query, block_tables, context_lens, scale=None, window=0) -> np.ndarray:
        """Decode attention on the GPU (see prepare_paged_attention)."""
        return await self.run(self.prepare_paged_attention(cache, query, block_tables, context_lens, scale, window),
                              self.decode.attention)

    async def prefill_attention(self, cache, query, query_start_loc, block_tables, context_lens,
                                scale=None, window=0) -> np.ndarray:
        """Prefill attention on the GPU (see prepare_prefill_attention)."""
        prepared = self.prepare_prefill_attention(cache, query, query_start_loc, block_tables, context_lens, scale,
                                                  window)
        return await self.run(prepared, self.prefill.name)
