"""WebGPU backend: the whole model forward over the paged KV cache, replayed in one submit per step.

Implements the engine's Backend protocol (backends/__init__.py), as backends/cpu.py does; its KV blocks and
their moves are a GpuKVPool it holds (kv_pool.py). Every GPU buffer is reserved in a GpuLedger first; the KV
pool gets what the budget leaves after weights, scratch (activations sized for max_num_batched_tokens) and
staging, as memory_plan.py computes them without a device. A step costs a constant number of Python->JS
crossings: one writeBuffer per int32 input, one for the uniforms, one replay (web/replayer.js encodes all
dispatches in one command encoder) and one read back.
Uses GpuContext methods only (no `js` here).
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

import numpy as np

from ...device_draws import LP_STRIDE, DrawnTokens, Shaping
from ...gpu_budget import BudgetExceeded, GpuLedger, MIB
from ...kernels.ref_ops import rope_cos_sin
from ...kv.block_pool import CopyOp
from ...kv.groups import KVGroups
from ...kv.retention import ShiftOp
from ...kv.spec import KVSpec
from ...model.config import ModelConfig
from ...model.family import require
from ...model.weights import check_manifest
from ...model_runner import ForwardBatch
from ...sampling import MAX_LOGIT_BIAS
from .. import check_attention_mass
from . import model_kernels as ops
from .attention_mass import AttentionMassKernel
from .kv_attention_gpu import decode_partition_blocks
from .kv_kernels import KVKernels
from .kv_layout import GpuKVLayout
from .kv_pool import GpuKVPool
from .memory_plan import partition_blocks as scratch_partition_blocks
from .memory_plan import group_strides, kv_groups_of, plan_kv_pool, scratch_buffers, staging_buffers
from .plan import (PARAM_SLOT_BYTES, SLOT_INDEX, PlanKey, StepShape, layer_program, rope_table_label, rope_tables,
                   step_slots)
from .shader_variants import CPU_ATTENTION, CPU_ATTENTION_HEADS
from .weight_upload import upload_weights

CPU_POOL_CAP_BYTES = 64 * MIB  # default CPU swap pool (wasm memory)
# The ops of model/family.py the plan compiles (plan.layer_program reads each layer's family.Layer).
OPS = frozenset({"attention_bias", "q_width", "qk_norm", "post_attention_norm", "post_ffn_norm", "silu", "gelu_tanh",
                 "embedding_scale", "no_rope", "rope_per_layer", "sliding_window"})


def refuse_unsupported(config: ModelConfig) -> None:
    """UnsupportedModel naming the ops of the model's family the plan lacks (model/family.py), at load."""
    require(config, OPS, "the WebGPU backend", "the tab's CPU path (?backend=cpu) and the numpy reference run it")


UNIFORM_AT_5 = ("kv_write", "paged_attention_gpu", "paged_attention_gpu_sg", "paged_prefill_attention_gpu",
                *(kernel + suffix for kernel in CPU_ATTENTION for _, suffix, _ in CPU_ATTENTION_HEADS))


class WebGpuBackend:
    """Model weights, scratch, KV pool (a GpuKVPool) and recorded plans on one GpuContext."""

    name = "webgpu"

    def __init__(self, ctx, config: ModelConfig, ledger: GpuLedger, *, block_size: int, kv_dtype: str,
                 max_num_batched_tokens: int, max_num_seqs: int, kernels: str = "cpu",
                 kv_groups: KVGroups | None = None) -> None:
        if kernels not in ops.FAMILIES:
            raise ValueError(f"kernels must be one of {ops.FAMILIES}, got {kernels!r}")
        refuse_unsupported(config)
        self.ctx = ctx
        self.kernels = kernels  # kernel family of the plan's linears, argmax and attention (model_kernels.choose_family)
        self.gpu_shapes = ops.GpuShapes()  # the gpu family's workgroup shapes
        self.config = config
        self.ledger = ledger
        self.block_size = block_size
        self.kv_dtype = kv_dtype
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_blocks_per_seq = -(-config.context_length // block_size)
        # The KV groups the pool's pages hold (kv/groups.py; the engine reads this to keep a block table per group):
        # each layer binds its group's block tables and slot mapping, ranges of one buffer each (group_binding)
        self.kv_groups = kv_groups or KVGroups.flat(config.n_layers)
        self._group_strides = group_strides(config, block_size=block_size, max_num_seqs=max_num_seqs,
                                            max_num_batched_tokens=max_num_batched_tokens,
                                            num_groups=self.kv_groups.num_groups)
        self.weights: dict[str, tuple[str, tuple]] = {}  # name -> (dtype, part buffers in binding order)
        # name -> [(first row, rows, (dtype, part buffers))]: a matrix too large for one binding, by rows
        self.weight_rows: dict[str, list[tuple[int, int, tuple[str, tuple]]]] = {}
        self.scratch: dict[str, object] = {}
        self.kv_kernels: KVKernels | None = None  # compiled by create() for the pool's layout
        self.kv_pool: GpuKVPool | None = None  # the KV blocks, made by create()
        self._buffers: dict[str, object] = {}
        self.ledger_prefix = ""  # before this backend's labels in a ledger several models share
        self._plans: dict[PlanKey, object] = {}
        self._validated: set[PlanKey] = set()
        self._dispatch_slots: dict[PlanKey, np.ndarray] = {}  # uniform slot of each recorded dispatch
        self._slots_cache: dict[StepShape, tuple] = {}
        self.last_step_ms: dict[str, float] = {}
        self._id_landing = "readback_ids"  # the MAP_READ buffer the last ids-only step read into
        # The engine hands forward() its draws (Sampler.device_draw) and gets token ids back, not logits rows
        # (sample.wgsl); False: the host samples from the logits. The gpu family's: one workgroup bisecting
        # the row costs a real GPU microseconds where Pyodide's sampler takes ~7 ms a token, but SwiftShader
        # (the cpu family's adapters) 26 ms (docs/performance.md).
        self.samples_on_device = kernels == "gpu"
        # The engine may submit decode step n + 1 (its token ids fed on the GPU) before it reads step n's ids
        # (submit(feed=True), decode_chain.py; EngineConfig.pipeline_decode turns that off).
        self.pipelines = True
        self._fold_qkv = True  # fold_qkv
        self._mass_kernel: AttentionMassKernel | None = None  # compiled on first use

    # ------------------------------------------------------------------ construction

    @classmethod
    async def create(cls, ctx, manifest: dict, shard_source: Callable[[str], Awaitable[bytes]], *,
                     budget_bytes: int, block_size: int = 16, kv_dtype: str = "f16",
                     max_num_batched_tokens: int = 256, max_num_seqs: int = 16, num_cpu_blocks: int | None = None,
                     cpu_budget_bytes: int | None = None, on_progress: Callable[[int, int], None] | None = None,
                     kernels: str = "cpu", ledger: GpuLedger | None = None, pages=None,
                     num_blocks: int | None = None, name: str = "", kv_groups: bool = True) -> "WebGpuBackend":
        """Upload the weights shard by shard (`await shard_source(file)` -> bytes), size scratch and the KV pool
        inside `budget_bytes`. Raises BudgetExceeded (nothing allocated) when even one KV block does not fit.
        The CPU swap pool holds num_cpu_blocks blocks, else as many as cpu_budget_bytes holds, else as many as
        CPU_POOL_CAP_BYTES holds up to the GPU pool's size.
        With `pages` (a SharedGpuPages, shared_pages.py) the KV blocks are views of pages several models share:
        weights, scratch and staging go into `ledger` (the pages' own, budget_bytes is not used) and the pool
        addresses num_blocks page ids (default every page); `name` prefixes its ledger labels ("<name>/w:...").
        kv_groups: True (default): a model with sliding-window layers keeps its KV in groups (kv/groups.py), a
        block being a page of one group's layers, and the engine gives each group its own block tables, so a
        window group holds only its window (in shared `pages` too: a page then holds one group's layers); False:
        every layer holds the whole context (one group of all layers), the layout of a model without windows."""
        config = check_manifest(manifest)
        refuse_unsupported(config)  # before anything is sized for it
        groups = kv_groups_of(config, kv_groups)
        if pages is not None:
            ledger = ledger or pages.ledger
            num_blocks = num_blocks or pages.num_pages
            block_bytes = 2 * groups.group_size * GpuKVLayout(  # a page's layers: the CPU swap pool's block
                KVSpec.of(config, block_size=block_size, dtype=kv_dtype), 1).nbytes
        else:
            max_binding = ctx.info.limits["maxStorageBufferBindingSize"]
            plan = plan_kv_pool(manifest, budget_bytes=budget_bytes, block_size=block_size, kv_dtype=kv_dtype,
                                max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                max_binding=max_binding, kv_groups=groups.is_hybrid)
            num_blocks, block_bytes = plan["num_blocks"], plan["block_bytes"]
            if num_blocks < 1:
                raise BudgetExceeded(
                    f"a GPU budget of {budget_bytes / MIB:.1f} MiB leaves no room for the KV cache: weights, "
                    f"scratch and staging need {plan['fixed_bytes'] / MIB:.1f} MiB and one KV block "
                    f"{block_bytes:,} bytes; raise the budget or lower max_num_batched_tokens")
        b = cls(ctx, config, ledger or GpuLedger(budget_bytes), block_size=block_size, kv_dtype=kv_dtype,
                max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, kernels=kernels,
                kv_groups=groups)
        b.ledger_prefix = f"{name}/" if name else ""
        layout = pages.layout(b.kv_spec, num_blocks) if pages is not None else GpuKVLayout(b.kv_spec, num_blocks)
        b.kv_kernels = await KVKernels(ctx, layout, config.n_heads, family=kernels, subgroups=b.subgroups).compile()
        b.kv_pool = GpuKVPool(ctx, b.kv_kernels, config, b.ledger, pages=pages, groups=groups)
        try:
            ctx.push_oom()
            try:
                await b._allocate(manifest, shard_source, on_progress)
            finally:
                await ctx.pop_oom("the model's GPU buffers")
        except BaseException:
            b.destroy()  # a failed load leaves no GPU buffer behind
            raise
        if num_cpu_blocks is None:
            num_cpu_blocks = (cpu_budget_bytes // block_bytes if cpu_budget_bytes is not None
                              else min(num_blocks, CPU_POOL_CAP_BYTES // block_bytes))
        b.kv_pool.allocate_cpu(num_cpu_blocks)
        return b

    async def _allocate(self, manifest: dict, shard_source, on_progress) -> None:
        """Weights, then scratch and staging, then the KV pool: every buffer reserved in the ledger first."""
        cfg = self.config
        await upload_weights(self, manifest, shard_source, on_progress)
        scratch = scratch_buffers(cfg, block_size=self.block_size, max_num_batched_tokens=self.max_num_batched_tokens,
                                  max_num_seqs=self.max_num_seqs, num_groups=self.kv_groups.num_groups)
        staging = staging_buffers(cfg, self.kv_spec, max_num_seqs=self.max_num_seqs)
        for label, nbytes, kind in (*scratch, *staging):
            self.scratch[label] = self._buffer(label, nbytes, kind, map_read=label.startswith("readback"),
                                               uniform=label == "params")
        for i, inv_freq in enumerate(rope_tables(cfg)[0]):  # a table per distinct rotary of the layers
            self.ctx.write(self.scratch[rope_table_label(i)],
                           rope_cos_sin(cfg.head_dim, cfg.rope_base, cfg.context_length, inv_freq))
        self.kv_pool.allocate()

    def _buffer(self, label: str, nbytes: int, kind: str, **kw):
        self.ledger.reserve(self.ledger_prefix + label, nbytes, kind)
        buf = self.ctx.buffer(nbytes, label, **kw)
        self._buffers[label] = buf
        return buf

    @property
    def max_binding(self) -> int:
        """The adapter's maxStorageBufferBindingSize: a weight part larger than this is split by rows."""
        return int(self.ctx.info.limits["maxStorageBufferBindingSize"])

    @property
    def fold_qkv(self) -> bool:
        """Whether a decode layer's q | k | v runs inside its attention (plan.layer_program's folded: one dispatch
        a layer fewer, paged_attention_gpu_fold.wgsl) where it can. Setting it drops the recorded plans: the next
        step records its plan the new way (bench.kernels times a step both ways)."""
        return self._fold_qkv

    @fold_qkv.setter
    def fold_qkv(self, on: bool) -> None:
        if on != self._fold_qkv:
            self._fold_qkv = on
            self._plans.clear()
            self._validated.clear()
            self._dispatch_slots.clear()

    @property
    def workgroup_storage(self) -> int:
        """The adapter's maxComputeWorkgroupStorageSize (bytes of workgroup memory a kernel may declare)."""
        return int(self.ctx.info.limits.get("maxComputeWorkgroupStorageSize", 16384))

    @property
    def subgroups(self) -> bool:
        """Whether the gpu family's matvecs reduce with subgroups (the device requests them where it can)."""
        return "subgroups" in self.ctx.info.features

    @property
    def gpu_matmul(self) -> bool:
        """Whether prefill runs the gpu family's tiled matmuls: every matrix has one (GPU_MATMUL_TYPES; a step's
        grid per slot serves every layer, so one other type, float ones included, sends the model to the cpu
        family's). The norm weights and biases are f32 vectors, no matrices."""
        dtypes = [d for name, (d, _) in self.weights.items() if not name.endswith(("norm.weight", ".bias"))]
        dtypes += [weight[0] for chunks in self.weight_rows.values() for _, _, weight in chunks]
        return self.kernels == "gpu" and all(d in ops.GPU_MATMUL_TYPES for d in dtypes)

    @property
    def shader_f16(self) -> bool:
        """Whether the gpu family's matvecs run their dot products in f16 (the device requests `shader-f16`
        where the adapter has it). Post-norm models too (Gemma 3, whose residual stream outgrows f16): a NORM
        matvec scales the residual by 1 / rms, in f32, before the f16 cast (matvec_gpu_main.wgsl)."""
        return "shader-f16" in self.ctx.info.features

    @property
    def kv_spec(self) -> KVSpec:
        """The KV cache's geometry and element type; a block is a page of one KV group's layers."""
        return KVSpec.of(self.config, block_size=self.block_size, dtype=self.kv_dtype, groups=self.kv_groups)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token on the GPU in kv_dtype: K and V of every layer, scales and padding (the spec's)."""
        return self.kv_spec.bytes_per_token

    @property
    def page_bytes_per_token(self) -> int:
        """Bytes one token takes in a page of the pool: K and V of one KV group's layers in kv_dtype (every
        layer's for a model without window layers: bytes_per_token), as CpuBackend.page_bytes_per_token."""
        return self.kv_spec.bytes_per_block // self.block_size

    def group_binding(self, name: str, layer: int):
        """The block tables (name "block_tables") or slot mapping ("slot_mapping") layer `layer` binds: the whole
        scratch buffer with one KV group, else its group's range of it ((buffer, offset, size), group_strides)."""
        buf = self.scratch[name]
        if not self.kv_groups.is_hybrid:
            return buf
        stride = self._group_strides[name]
        return buf, self.kv_groups.where(layer)[0] * stride, stride

    @property
    def num_blocks(self) -> int:
        """KV blocks of the GPU pool."""
        return self.kv_pool.num_blocks

    @property
    def num_cpu_blocks(self) -> int:
        """Blocks of the CPU swap pool."""
        return self.kv_pool.num_cpu_blocks

    def stats(self) -> dict:
        """KV dtype and sizes for the dashboard: bytes per token (K and V, every layer) and pool capacity."""
        return {"kv_dtype": self.kv_dtype, "bytes_per_token": self.bytes_per_token,
                "num_blocks": self.num_blocks, "kv_tokens": self.num_blocks * self.block_size}

    # ------------------------------------------------------------------ block moves: the pool's (kv_pool.py)

    async def copy_blocks(self, ops: Iterable[CopyOp]) -> None:
        """Copy-on-write: GPU page src -> dst for each (src, dst), K and V of every slot."""
        await self.kv_pool.copy_blocks(ops)

    async def swap_out(self, ops: Iterable[CopyOp]) -> None:
        """GPU block -> CPU block for each (gpu, cpu) pair."""
        await self.kv_pool.swap_out(ops)

    async def swap_in(self, ops: Iterable[CopyOp]) -> None:
        """CPU block -> GPU block for each (cpu, gpu) pair."""
        await self.kv_pool.swap_in(ops)

    async def shift_keys(self, ops: Iterable[ShiftOp]) -> None:
        """Re-rotate the cached keys of each op's block by -delta positions."""
        await self.kv_pool.shift_keys(ops)

    async def read_blocks(self, block_ids: list[int]) -> np.ndarray:
        """Whole GPU pages as (n, slots, 2, block_size, token_u32s) u32 words (the disk tier's payload)."""
        return await self.kv_pool.read_blocks(block_ids)

    async def write_blocks(self, block_ids: list[int], words: np.ndarray) -> None:
        """The inverse of read_blocks."""
        await self.kv_pool.write_blocks(block_ids, words)

    # ------------------------------------------------------------------ forward

    def _check(self, batch: ForwardBatch) -> None:
        t, s = batch.token_ids.shape[0], batch.num_seqs
        if t > self.max_num_batched_tokens or s > self.max_num_seqs:
            raise ValueError(f"batch of {t} tokens / {s} sequences exceeds this backend's scratch "
                             f"({self.max_num_batched_tokens} tokens / {self.max_num_seqs} sequences); "
                             "create it with the engine's max_num_batched_tokens and max_num_seqs")
        batch.check_fits(vocab=self.config.vocab, context_length=self.config.context_length,
                         num_blocks=self.num_blocks, block_size=self.block_size)
        if int(batch.positions.max()) >= self.config.context_length:
            raise ValueError(f"rotary position {int(batch.positions.max())} is past the RoPE table of the model "
                             f"context ({self.config.context_length}); run long chats with "
                             "KVRetention(positions='shifted')")
        if batch.num_groups != self.kv_groups.num_groups:
            raise ValueError(f"this backend's pool holds {self.kv_groups.num_groups} KV group(s), the batch has "
                             f"{batch.num_groups}: an engine builds them from backend.kv_groups; a batch by hand "
                             "for a model with window layers needs WebGpuBackend.create(kv_groups=False)")
        if batch.block_tables.shape[1] > self.max_blocks_per_seq:
            raise ValueError(f"block_tables may have at most {self.max_blocks_per_seq} columns (the model "
                             f"context), got {batch.block_tables.shape[1]}")

    async def _plan(self, key: PlanKey):
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        params = self.scratch["params"]
        passes = []
        self.ctx.push_errors()
        for dispatches in layer_program(self, key):
            recorded = []
            for d in dispatches:
                if d.constants is None:
                    pipeline = self.kv_kernels.pipelines[d.shader]
                else:
                    pipeline = await self.ctx.kernel(d.shader, dict(d.constants), d.entry)
                bindings = dict(d.bindings) if isinstance(d.bindings, dict) else dict(enumerate(d.bindings))
                # The attention kernels keep their uniform at binding 5 (paged_kv_read.wgsl).
                # So do their prefill passes after the first (KVKernels.prefill_resume: the same shader).
                uniform_at = d.uniform_at or (5 if d.shader.removesuffix("_resume") in UNIFORM_AT_5 else len(bindings))
                bindings[uniform_at] = (params, SLOT_INDEX[d.slot] * PARAM_SLOT_BYTES, PARAM_SLOT_BYTES)
                bindings.update(d.extra)
                recorded.append((pipeline, self.ctx.bind(pipeline, bindings)))
            passes.append(recorded)
        await self.ctx.pop_errors(f"recording the {key} step plan")
        plan = self.ctx.record_plan(passes)
        self._plans[key] = plan
        self._dispatch_slots[key] = np.array(
            [SLOT_INDEX[d.slot] for p in layer_program(self, key) for d in p], np.int32)  # (dispatches,)
        return plan

    def _slots(self, shape: StepShape) -> tuple[np.ndarray, np.ndarray]:
        hit = self._slots_cache.get(shape)
        if hit is None:
            if len(self._slots_cache) > 256:
                self._slots_cache.clear()
            hit = self._slots_cache[shape] = step_slots(self, shape)
        return hit

    async def forward(self, batch: ForwardBatch, *, greedy: bool = False, draws: np.ndarray | None = None,
                      shaping: Shaping | None = None, attention_mass: np.ndarray | None = None) -> np.ndarray:
        """(S, vocab) f32 logits of each sequence's last new token, or (S,) int32 argmax ids when greedy, or
        with draws ((S, 4) f32: temperature, top_p, u, 0; Sampler.device_draw) the (S,) int32 ids drawn on the
        GPU (sample.wgsl: temperature 0 is argmax), with shaping (device_draws.Shaping: sample_shape.wgsl
        first) a DrawnTokens; attention_mass as in backends.Backend.forward."""
        if attention_mass is not None:
            check_attention_mass(attention_mass, batch)
        out = await (await self.submit(batch, greedy=greedy, draws=draws, shaping=shaping,
                                       mass=attention_mass is not None))
        if attention_mass is not None:
            attention_mass[...] = await self._attention_mass(batch)
        return out

    async def submit(self, batch: ForwardBatch, *, greedy: bool = False, draws: np.ndarray | None = None,
                     shaping: Shaping | None = None, feed: bool = False, mass: bool = False) -> Awaitable[np.ndarray]:
        """Submit the step now and return an awaitable of forward()'s result: the engine may submit the next
        decode step before it awaits this one's ids (decode_chain.py). feed: this step's token ids are the
        ids the previous step drew, row for row (its rows were the same sequences in the same order): copied
        on the GPU before the step runs, whatever batch.token_ids holds. mass: the last layer's queries are
        scored after the step (forward's attention_mass), so they must reach scratch q (PlanKey.mass)."""
        t0 = time.perf_counter()
        self._check(batch)
        cfg, s = self.config, self.scratch
        t, n = batch.token_ids.shape[0], batch.num_seqs
        if draws is not None and draws.shape != (n, 4):
            raise ValueError(f"draws must be ({n}, 4) f32 (temperature, top_p, u, 0), got {draws.shape}")
        if feed and t != n:
            raise ValueError(f"a fed step is a decode step (one token per sequence), got {t} tokens for {n}")
        if shaping is not None and (draws is None or shaping.rows.shape != (n, 8)
                                    or len(shaping.bias) > self.max_num_seqs * MAX_LOGIT_BIAS):
            raise ValueError(f"shaping needs draws and ({n}, 8) rows with at most {MAX_LOGIT_BIAS} bias pairs a "
                             f"row, got rows {shaping.rows.shape}, {len(shaping.bias)} pairs")
        key = PlanKey.of(t, n, sampled=draws is not None, greedy=greedy, shaped=shaping is not None,
                         prefill_passes=self.kv_kernels.prefill_passes(batch.context_lens), mass=mass)
        greedy = greedy or draws is not None  # ids come back either way
        plan = await self._plan(key)
        qsl = batch.query_start_loc  # (S + 1,)
        blocks = -(-int(batch.context_lens.max()) // self.block_size)
        q_tiles = -(-np.diff(qsl) // self.kv_kernels.query_tile)  # (S,)
        part_blocks = self._partition_blocks(n, blocks) if key.decode else self.kv_kernels.partition_blocks
        shape = StepShape(t, n, batch.block_tables.shape[1], -(-blocks // part_blocks), int(q_tiles.sum()),
                          key.decode, part_blocks)
        slot_grids, params = self._slots(shape)
        grids = slot_grids[self._dispatch_slots[key]]  # (dispatches, 3)
        write = self.ctx.write  # queue writes: they land after every step submitted before, before this one
        write(s["token_ids"], batch.token_ids)
        write(s["positions"], batch.positions)
        if self.kv_groups.is_hybrid:  # each group's at its range (group_binding): one write each, only what is used
            strides = self._group_strides
            for g in range(self.kv_groups.num_groups):
                tables, slots = batch.tables_of(g)
                write(s["slot_mapping"], slots, g * strides["slot_mapping"])
                write(s["block_tables"], tables, g * strides["block_tables"])
        else:
            write(s["slot_mapping"], batch.slot_mapping)
            write(s["block_tables"], batch.block_tables)
        # a decode step's rotary positions follow the context lengths (paged_attention_gpu_fold.wgsl reads them there)
        write(s["context_lens"], np.concatenate([batch.context_lens, batch.positions]).astype(batch.context_lens.dtype)
              if key.decode else batch.context_lens)
        if not key.decode:
            write(s["starts"], np.concatenate([qsl, [0], np.cumsum(q_tiles)]).astype(np.uint32))
        write(s["params"], params)
        if draws is not None:
            write(s["sampling"], draws.astype(np.float32))
        if shaping is not None:
            write(s["sample_rows"], shaping.rows)
            write(s["sample_bias"], shaping.bias)
            for slot, counts in shaping.counts:  # a request's first shaped draw: its counts so far
                write(s["token_counts"], counts, slot * cfg.vocab * 4)
        logprobs = shaping is not None and shaping.logprobs
        row = cfg.hidden * 4
        copies = np.stack([(qsl[1:] - 1) * row, np.arange(n) * row, np.full(n, row)], axis=1)  # (S, 3)
        if greedy:  # ids land in the two id landings by turns (one may still be mapped for the step before)
            self._id_landing = "readback_ids" if self._id_landing == "readback" else "readback"
            # a shaped step's log-prob rows follow the ids of max_num_seqs rows (sample_shape.wgsl)
            read = (s["ids"], s[self._id_landing], (self.max_num_seqs + n * LP_STRIDE) * 4 if logprobs else n * 4)
        else:
            read = (s["logits"], s["readback"], n * cfg.vocab * 4)
        first = key not in self._validated
        if first:
            self.ctx.push_errors()
        t1 = time.perf_counter()
        landing = self.ctx.replay(plan, grids, copies, s["x"], s["last"], read=read,
                                  feed=(s["ids"], s["token_ids"], n * 4) if feed else None)
        if first:
            await self.ctx.pop_errors(f"the first {key} step")
            self._validated.add(key)
        return self._landed(landing, greedy, n, prepare_s=t1 - t0, encode_s=time.perf_counter() - t1,
                            shaped=shaping is not None, logprobs=logprobs)

    async def _landed(self, landing, greedy: bool, n: int, prepare_s: float, encode_s: float, shaped: bool = False,
                      logprobs: bool = False) -> np.ndarray | DrawnTokens:
        t0 = time.perf_counter()  # a coroutine starts when awaited: this is when the engine waits for the ids
        data = await landing
        t1 = time.perf_counter()
        if shaped:
            words = np.frombuffer(data, np.uint32)
            lp = words[self.max_num_seqs:].reshape(n, LP_STRIDE).copy() if logprobs else None  # (S, LP_STRIDE)
            out = DrawnTokens(words[:n].astype(np.int32), lp)
        elif greedy:
            out = np.frombuffer(data, np.uint32).astype(np.int32)  # (S,)
        else:
            out = np.frombuffer(data, np.float32).reshape(n, self.config.vocab).copy()  # (S, vocab)
        # Milliseconds: the Python around the step, the replay's encode and submit (one crossing into JS), and
        # the wait for its result; benchmarks read this. A pipelined step is waited for while the GPU already
        # has the next one, so its wait is the GPU time the host did not cover.
        wait = (t1 - t0) * 1e3
        self.last_step_ms = {"python": (prepare_s + time.perf_counter() - t1) * 1e3, "encode": encode_s * 1e3,
                             "wait": wait, "replay": encode_s * 1e3 + wait}
        return out

    def _partition_blocks(self, num_seqs: int, max_blocks: int) -> int:
        """Blocks per flash-decoding partition of a decode step: the cpu family's fixed split, the gpu family's
        sized to its workgroup aim (gpu_shapes.split) within the scratch's partitions."""
        kv = self.kv_kernels
        if self.kernels != "gpu":
            return kv.partition_blocks
        room = -(-self.max_blocks_per_seq // scratch_partition_blocks(self.block_size))  # scratch partitions a seq
        return decode_partition_blocks(self.gpu_shapes.split, num_seqs, self.config.n_heads // kv.head_tile,
                                       max_blocks, self.block_size, room)

    async def _attention_mass(self, batch: ForwardBatch) -> np.ndarray:
        """After a replay, scratch q still holds the last layer's rotated queries: score the blocks with them;
        (S, max_blocks) f32, heads summed."""
        if self._mass_kernel is None:
            self._mass_kernel = await AttentionMassKernel(self.kv_kernels).compile()
        last = self.config.n_layers - 1
        att = self.config.layers[last].attention  # the last layer's scale and window
        tables = batch.tables_of(self.kv_groups.where(last)[0])[0]  # its group's (S, max_blocks)
        mass = await self._mass_kernel.run(self.kv_pool.cache_of(last).k, self.scratch["q"], batch.query_start_loc,
                                           tables, batch.context_lens, att.scale,
                                           att.window or 0)  # (S, n_heads, max_blocks)
        return mass.sum(axis=1)

    def rebind_pages(self) -> None:
        """The shared pages were reallocated (SharedGpuPages.resize): take the new views, record plans again."""
        self.kv_pool.caches = []
        self.kv_pool.allocate()
        self._plans, self._validated, self._dispatch_slots = {}, set(), {}

    def destroy(self) -> None:
        """Free every GPU buffer and its ledger reservation."""
        for label, buf in self._buffers.items():
            buf.destroy()
            self.ledger.release(self.ledger_prefix + label)
        if self.kv_pool is not None:
            self.kv_pool.destroy()
        self._buffers, self._plans = {}, {}
