"""WebGPU backend: the whole model forward over the paged KV cache, replayed in one submit per step.

Implements the engine's Backend protocol (backends/__init__.py), as backends/cpu.py does. Every GPU
buffer is reserved in a GpuLedger first; the KV pool gets what the budget leaves after weights, scratch
(activations sized for max_num_batched_tokens) and staging. A step costs a constant number of Python->JS
crossings: one writeBuffer per int32 input, one for the uniforms, one replay (web/replayer.js encodes all
dispatches in one command encoder) and one read back.
Uses GpuContext methods only (no `js` here).
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import numpy as np

from ...gpu_budget import BudgetExceeded, GpuLedger, MIB, kv_blocks_that_fit, rounded
from ...kernels.ref_ops import model_inv_freq, rope_cos_sin
from ...kv.dtypes import kv_dtype as lookup_kv_dtype
from ...model.config import ModelConfig
from ...model.layout import DTYPE_PARTS
from ...model.weights import check_manifest, tensor_parts, verify_shard
from ...model_runner import ForwardBatch
from .. import check_attention_mass
from . import model_kernels as ops
from .attention_mass import AttentionMassKernel
from .block_moves import SWAP_CHUNK_BLOCKS, KVBlockMoves
from .fused import BIAS_MEMBERS, bias_member, fused_member, member_names, stack_rows, stacked_nbytes, stacks
from .kv_kernels import KVCacheBuffers, KVKernels, KVLayout
from .plan import PARAM_SLOT_BYTES, SLOT_INDEX, SLOTS, PlanKey, StepShape, layer_program, step_slots

CPU_POOL_CAP_BYTES = 64 * MIB  # default CPU swap pool (wasm memory)
TEMP_SLACK_BYTES = 4096  # ids / params uniforms of one swap or copy call
UNIFORM_AT_5 = ("kv_write", "paged_attention", "paged_attention_gpu", "paged_attention_gpu_sg",
                "paged_prefill_attention", "paged_prefill_attention_gpu")


class WebGpuBackend(KVBlockMoves):
    """Model weights, scratch, KV pool and recorded plans on one GpuContext."""

    name = "webgpu"

    def __init__(self, ctx, config: ModelConfig, ledger: GpuLedger, *, block_size: int, kv_dtype: str,
                 max_num_batched_tokens: int, max_num_seqs: int, kernels: str = "cpu") -> None:
        if kernels not in ops.FAMILIES:
            raise ValueError(f"kernels must be one of {ops.FAMILIES}, got {kernels!r}")
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
        self.weights: dict[str, tuple[str, tuple]] = {}  # name -> (dtype, part buffers in binding order)
        self.scratch: dict[str, object] = {}
        self.kv_caches: list[KVCacheBuffers] = []
        self._buffers: dict[str, object] = {}
        self._plans: dict[PlanKey, object] = {}
        self._validated: set[PlanKey] = set()
        self._dispatch_slots: dict[PlanKey, np.ndarray] = {}  # uniform slot of each recorded dispatch
        self._slots_cache: dict[StepShape, tuple] = {}
        self.num_blocks = 0
        self.num_cpu_blocks = 0
        self.last_step_ms: dict[str, float] = {}
        self._mass_kernel: AttentionMassKernel | None = None  # compiled on first use

    # ------------------------------------------------------------------ construction

    @classmethod
    async def create(cls, ctx, manifest: dict, shard_source: Callable[[str], Awaitable[bytes]], *,
                     budget_bytes: int, block_size: int = 16, kv_dtype: str = "f16",
                     max_num_batched_tokens: int = 256, max_num_seqs: int = 16, num_cpu_blocks: int | None = None,
                     cpu_budget_bytes: int | None = None, on_progress: Callable[[int, int], None] | None = None,
                     kernels: str = "cpu") -> "WebGpuBackend":
        """Upload the weights shard by shard (`await shard_source(file)` -> bytes), size scratch and the KV pool
        inside `budget_bytes`. Raises BudgetExceeded (nothing allocated) when even one KV block does not fit.
        The CPU swap pool holds num_cpu_blocks blocks, else as many as cpu_budget_bytes holds, else as many as
        CPU_POOL_CAP_BYTES holds up to the GPU pool's size."""
        max_binding = ctx.info.limits["maxStorageBufferBindingSize"]
        plan = plan_kv_pool(manifest, budget_bytes=budget_bytes, block_size=block_size, kv_dtype=kv_dtype,
                            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                            max_binding=max_binding)
        config, num_blocks, block_bytes = check_manifest(manifest), plan["num_blocks"], plan["block_bytes"]
        if num_blocks < 1:
            raise BudgetExceeded(
                f"a GPU budget of {budget_bytes / MIB:.1f} MiB leaves no room for the KV cache: weights, scratch "
                f"and staging need {plan['fixed_bytes'] / MIB:.1f} MiB and one KV block {block_bytes:,} bytes; "
                "raise the budget or lower max_num_batched_tokens")
        b = cls(ctx, config, GpuLedger(budget_bytes), block_size=block_size, kv_dtype=kv_dtype,
                max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, kernels=kernels)
        b.kv_layout = KVLayout(num_blocks, block_size, config.n_kv_heads, config.head_dim, kv_dtype)
        b.kv_kernels = await KVKernels(ctx, b.kv_layout, config.n_heads, family=kernels,
                                       subgroups=b.subgroups).compile()
        try:
            ctx.push_oom()
            try:
                await b._allocate(manifest, shard_source, on_progress)
            finally:
                await ctx.pop_oom("the model's GPU buffers")
        except BaseException:
            b.destroy()  # a failed load leaves no GPU buffer behind
            raise
        b.num_blocks = num_blocks
        if num_cpu_blocks is None:
            num_cpu_blocks = (cpu_budget_bytes // block_bytes if cpu_budget_bytes is not None
                              else min(num_blocks, CPU_POOL_CAP_BYTES // block_bytes))
        b.num_cpu_blocks = num_cpu_blocks
        shape = (max(b.num_cpu_blocks, 1),) + b.kv_layout.storage_shape[1:]
        # CPU swap pool (wasm memory): (layer) x (num_cpu_blocks, block_size, n_kv_heads, head_dim) in the cache
        # dtype for f32 / f16, (layer) x (num_cpu_blocks, block_size, token_u32s) u32 words for quantized dtypes
        b.cpu_k = [np.zeros(shape, b.kv_layout.storage_dtype) for _ in range(config.n_layers)]
        b.cpu_v = [np.zeros(shape, b.kv_layout.storage_dtype) for _ in range(config.n_layers)]
        return b

    async def _allocate(self, manifest: dict, shard_source, on_progress) -> None:
        """Weights, then scratch and staging, then the KV pool: every buffer reserved in the ledger first."""
        cfg = self.config
        await self._upload_weights(manifest, shard_source, on_progress)
        for label, nbytes, kind in (*self._scratch_specs(), *self._staging_specs()):
            self.scratch[label] = self._buffer(label, nbytes, kind, map_read=label == "readback",
                                               uniform=label == "params")
        self.ctx.write(self.scratch["cos_sin"], rope_cos_sin(cfg.head_dim, cfg.rope_base, cfg.context_length,
                                                           model_inv_freq(cfg)))
        for layer in range(cfg.n_layers):
            self.ledger.reserve(f"kv.{layer}.k", self.kv_layout.nbytes, "kv")
            self.ledger.reserve(f"kv.{layer}.v", self.kv_layout.nbytes, "kv")
            self.kv_caches.append(KVCacheBuffers(self.ctx, self.kv_layout))

    def _buffer(self, label: str, nbytes: int, kind: str, **kw):
        self.ledger.reserve(label, nbytes, kind)
        buf = self.ctx.buffer(nbytes, label, **kw)
        self._buffers[label] = buf
        return buf

    @staticmethod
    def _weights_bytes(manifest: dict) -> int:
        """Bytes _upload_weights reserves: each tensor's parts, the stacked projections (backends/webgpu/fused.py)
        instead of their members (or the members themselves where they are not stacked: fused.stacks), the norm
        weights both alone and inside their stacked tensor."""
        total, groups, biases, alone = 0, {}, {}, {}
        for name, t in manifest["tensors"].items():
            bias = bias_member(name)
            if bias is not None:  # uploaded stacked per layer (q | k | v)
                biases[bias[0]] = biases.get(bias[0], 0) + 4 * t["shape"][0]
                continue
            member = fused_member(name)
            nbytes = sum(rounded(loc["nbytes"]) for loc in t["parts"].values())
            if member is None or len(t["shape"]) == 1:  # a norm weight is also uploaded on its own
                total += nbytes
            else:
                alone[member[0]] = alone.get(member[0], 0) + nbytes
            if member is not None:
                groups.setdefault(member[0], {})[member[1]] = (t["dtype"], tuple(t["shape"]))
        for stacked, group in groups.items():
            members = [group[i] for i in sorted(group)]
            if stacks(d for d, _ in members[:-1]):
                total += sum(rounded(n) for n in stacked_nbytes(members).values())
            else:
                total += alone[stacked]
        return total + sum(rounded(n) for n in biases.values())

    async def _upload_weights(self, manifest: dict, shard_source, on_progress) -> None:
        total = sum(s["nbytes"] for s in manifest["shards"])
        loaded = 0
        pending: dict[str, dict[int, tuple]] = {}  # stacked tensor -> member index -> (dtype, shape, parts)
        biases: dict[str, dict[int, bytes]] = {}  # stacked bias -> member index -> f32 bytes
        for shard in manifest["shards"]:
            data = await shard_source(shard["file"])
            verify_shard(shard, data)
            for name, entry in manifest["tensors"].items():
                if entry["file"] != shard["file"]:
                    continue
                parts = tensor_parts(entry, data)
                if bias_member(name) is not None:
                    self._stack_bias(name, entry, parts, biases)
                    continue
                if entry["dtype"] == "q8_0":
                    ops.check_q8_0_codes(name, parts)
                elif len(entry["shape"]) == 2 and entry["dtype"] not in ops.LINEAR_TYPES:
                    raise ValueError(f"tensor {name}: {entry['dtype']} matrices have no WebGPU kernels "
                                     f"(supported: {', '.join(ops.LINEAR_TYPES)})")
                member = fused_member(name)
                if member is None or len(entry["shape"]) == 1:  # a norm weight is also used alone (prefill)
                    self._upload_tensor(name, entry["dtype"], parts)
                if member is None:
                    continue
                # q/k/v and gate/up run as one matvec over their stacked rows, their input norm fused (fused.py)
                stacked, index, count = member
                group = pending.setdefault(stacked, {})
                group[index] = (entry["dtype"], tuple(entry["shape"]), {k: bytes(v) for k, v in parts.items()})
                if len(group) == count:
                    self._upload_stack(stacked, [group[i] for i in sorted(group)])
                    del pending[stacked]
            loaded += shard["nbytes"]
            del data  # the CPU copy goes as soon as its tensors are on the GPU
            if on_progress is not None:
                on_progress(loaded, total)
        if pending or biases:
            raise ValueError(f"the manifest lacks members of the stacked tensors {sorted(pending) + sorted(biases)}")

    def _upload_stack(self, stacked: str, members: list[tuple]) -> None:
        """The members stacked (fused.stack_rows), or each on its own where they have no lossless common type."""
        if stacks(dtype for dtype, _, _ in members[:-1]):
            dtype, _, parts = stack_rows(stacked, members)
            self._upload_tensor(stacked, dtype, parts)
            return
        for name, (dtype, _, parts) in zip(member_names(stacked), members[:-1]):  # the norm weight is up already
            self._upload_tensor(name, dtype, parts)

    def _stack_bias(self, name: str, entry: dict, parts: dict, biases: dict) -> None:
        """Collect a q / k / v bias; upload the layer's (q | k | v) f32 row once all three are there."""
        if entry["dtype"] != "f32":
            raise ValueError(f"tensor {name}: biases must be f32, got {entry['dtype']}")
        stacked, index = bias_member(name)
        group = biases.setdefault(stacked, {})
        group[index] = bytes(parts["data"])[: 4 * entry["shape"][0]]
        if len(group) == len(BIAS_MEMBERS):
            self._upload_tensor(stacked, "f32", {"data": b"".join(group[i] for i in sorted(group))})
            del biases[stacked]

    def _upload_tensor(self, name: str, dtype: str, parts: dict) -> None:
        order = DTYPE_PARTS[dtype]
        bufs = []
        for part in order:
            buf = self._buffer(f"w:{name}.{part}", len(parts[part]), "weights")
            self.ctx.write(buf, np.frombuffer(parts[part], np.uint8))
            bufs.append(buf)
        self.weights[name] = (dtype, tuple(bufs))

    def _scratch_specs(self) -> list[tuple[str, int, str]]:
        cfg, t, s = self.config, self.max_num_batched_tokens, self.max_num_seqs
        max_parts = -(-self.max_blocks_per_seq // self._partition_blocks())
        f32 = 4
        return [
            ("token_ids", t * 4, "scratch"), ("positions", t * 4, "scratch"),  # (T,) int32
            ("slot_mapping", t * 4, "scratch"),  # (T,)
            ("block_tables", s * self.max_blocks_per_seq * 4, "scratch"),  # (S, max_blocks_per_seq)
            ("context_lens", s * 4, "scratch"), ("starts", 2 * (s + 1) * 4, "scratch"),  # (S,), (2, S + 1)
            ("params", len(SLOTS) * PARAM_SLOT_BYTES, "scratch"),  # (slots, 256) uniforms
            ("cos_sin", cfg.context_length * cfg.head_dim * f32, "scratch"),  # (context, head_dim / 2, 2)
            ("x", t * cfg.hidden * f32, "scratch"), ("h", t * cfg.hidden * f32, "scratch"),  # (T, hidden)
            ("qkv", t * (cfg.hidden + 2 * cfg.kv_dim) * f32, "scratch"),  # (T, n_heads*hd + 2 kv_dim)
            *([] if cfg.attention_bias else [("zero_bias", (cfg.hidden + 2 * cfg.kv_dim) * f32, "scratch")]),
            ("q", t * cfg.hidden * f32, "scratch"), ("attn", t * cfg.hidden * f32, "scratch"),  # (T, n_heads*hd)
            ("k", t * cfg.kv_dim * f32, "scratch"), ("v", t * cfg.kv_dim * f32, "scratch"),  # (T, kv_dim)
            ("act", t * cfg.ffn * f32, "scratch"),  # (T, ffn) silu(gate) * up
            ("part_acc", s * max_parts * cfg.hidden * f32, "scratch"),  # (S, parts, n_heads, head_dim)
            ("part_stats", s * max_parts * cfg.n_heads * 2 * f32, "scratch"),  # (S, parts, n_heads, 2)
            ("last", s * cfg.hidden * f32, "scratch"), ("last_norm", s * cfg.hidden * f32, "scratch"),  # (S, hid)
            ("logits", s * cfg.vocab * f32, "scratch"),  # (S, vocab)
            ("ids", s * 4, "scratch"),  # (S,) u32
        ]

    def _staging_specs(self) -> list[tuple[str, int, str]]:
        # The swap / copy temporaries are created and freed inside one call (KVKernels): this reservation
        # covers the largest of them (gather staging + its read-back copy, SWAP_CHUNK_BLOCKS blocks of K and V).
        chunk = 2 * SWAP_CHUNK_BLOCKS * self.kv_layout.block_words * 16
        return [("readback", self.max_num_seqs * self.config.vocab * 4, "staging"),  # (S, vocab) landing
                ("swap_temporaries", 2 * chunk + TEMP_SLACK_BYTES, "staging")]

    def _partition_blocks(self) -> int:
        return max(1, 128 // self.block_size)  # KVKernels' default 128-token flash-decoding partition

    @property
    def subgroups(self) -> bool:
        """Whether the gpu family's matvecs reduce with subgroups (the device requests them where it can)."""
        return "subgroups" in self.ctx.info.features

    @property
    def gpu_matmul(self) -> bool:
        """Whether prefill runs the gpu family's tiled matmuls: every matrix has one (GPU_MATMUL_TYPES; a step's
        grid per slot serves every layer, so one other type, float ones included, sends the model to the cpu
        family's). The norm weights and biases are f32 vectors, no matrices."""
        return self.kernels == "gpu" and all(d in ops.GPU_MATMUL_TYPES for name, (d, _) in self.weights.items()
                                             if not name.endswith(("norm.weight", ".bias")))

    @property
    def shader_f16(self) -> bool:
        """Whether the gpu family's matvecs run their dot products in f16 (the device requests `shader-f16`
        where the adapter has it)."""
        return "shader-f16" in self.ctx.info.features

    @property
    def bytes_per_token(self) -> int:
        cfg = self.config
        return lookup_kv_dtype(self.kv_dtype).bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim)

    def stats(self) -> dict:
        """KV dtype and sizes for the dashboard: bytes per token (K and V, every layer) and pool capacity."""
        return {"kv_dtype": self.kv_dtype, "bytes_per_token": self.bytes_per_token,
                "num_blocks": self.num_blocks, "kv_tokens": self.num_blocks * self.block_size}

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
                    pipeline = await self.ctx.kernel(d.shader, dict(d.constants))
                bindings = dict(d.bindings) if isinstance(d.bindings, dict) else dict(enumerate(d.bindings))
                # The attention kernels keep their uniform at binding 5 (paged_kv_read.wgsl).
                uniform_at = 5 if d.shader in UNIFORM_AT_5 else len(bindings)
                bindings[uniform_at] = (params, SLOT_INDEX[d.slot] * PARAM_SLOT_BYTES, PARAM_SLOT_BYTES)
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

    async def forward(self, batch: ForwardBatch, *, greedy: bool = False,
                      attention_mass: np.ndarray | None = None) -> np.ndarray:
        """(S, vocab) f32 logits of each sequence's last new token, or (S,) int32 argmax ids when greedy;
        attention_mass as in backends.Backend.forward."""
        t0 = time.perf_counter()
        self._check(batch)
        if attention_mass is not None:
            check_attention_mass(attention_mass, batch)
        cfg, s = self.config, self.scratch
        t, n = batch.token_ids.shape[0], batch.num_seqs
        key = PlanKey.of(t, n)
        plan = await self._plan(key)
        qsl = batch.query_start_loc  # (S + 1,)
        blocks = -(-int(batch.context_lens.max()) // self.block_size)
        q_tiles = -(-np.diff(qsl) // self.kv_kernels.query_tile)  # (S,)
        shape = StepShape(t, n, batch.block_tables.shape[1], -(-blocks // self._partition_blocks()),
                          int(q_tiles.sum()), key.decode)
        slot_grids, params = self._slots(shape)
        grids = slot_grids[self._dispatch_slots[key]]  # (dispatches, 3)
        write = self.ctx.write
        write(s["token_ids"], batch.token_ids)
        write(s["positions"], batch.positions)
        write(s["slot_mapping"], batch.slot_mapping)
        write(s["block_tables"], batch.block_tables)
        write(s["context_lens"], batch.context_lens)
        if not key.decode:
            write(s["starts"], np.concatenate([qsl, [0], np.cumsum(q_tiles)]).astype(np.uint32))
        write(s["params"], params)
        row = cfg.hidden * 4
        copies = np.stack([(qsl[1:] - 1) * row, np.arange(n) * row, np.full(n, row)], axis=1)  # (S, 3)
        nbytes = n * 4 if greedy else n * cfg.vocab * 4
        first = key not in self._validated
        if first:
            self.ctx.push_errors()
        t1 = time.perf_counter()
        data = await self.ctx.replay(plan, grids, copies, s["x"], s["last"], s["ids" if greedy else "logits"],
                                     s["readback"], nbytes)
        t2 = time.perf_counter()
        if first:
            await self.ctx.pop_errors(f"the first {key} step")
            self._validated.add(key)
        if greedy:
            out = np.frombuffer(data, np.uint32).astype(np.int32)  # (S,)
        else:
            out = np.frombuffer(data, np.float32).reshape(n, cfg.vocab).copy()  # (S, vocab)
        if attention_mass is not None:
            attention_mass[...] = await self._attention_mass(batch)
        # Wall time of the replay (encode + GPU + map) vs the Python around it; benchmarks read this.
        self.last_step_ms = {"replay": (t2 - t1) * 1e3, "python": (t1 - t0 + time.perf_counter() - t2) * 1e3}
        return out

    async def _attention_mass(self, batch: ForwardBatch) -> np.ndarray:
        """After a replay, scratch q still holds the last layer's rotated queries: score the blocks with them;
        (S, max_blocks) f32, heads summed."""
        if self._mass_kernel is None:
            self._mass_kernel = await AttentionMassKernel(self.kv_kernels).compile()
        mass = await self._mass_kernel.run(self.kv_caches[-1].k, self.scratch["q"], batch.query_start_loc,
                                           batch.block_tables, batch.context_lens)  # (S, n_heads, max_blocks)
        return mass.sum(axis=1)

    def destroy(self) -> None:
        """Free every GPU buffer and its ledger reservation."""
        for label, buf in self._buffers.items():
            buf.destroy()
            self.ledger.release(label)
        for layer, cache in enumerate(self.kv_caches):
            cache.destroy()
            self.ledger.release(f"kv.{layer}.k")
            self.ledger.release(f"kv.{layer}.v")
        self._buffers, self.kv_caches, self._plans = {}, [], {}


def plan_kv_pool(manifest: dict, *, budget_bytes: int, block_size: int, kv_dtype: str, max_num_batched_tokens: int,
                 max_num_seqs: int, max_binding: int) -> dict:
    """The ledger's split of `budget_bytes` without a GPU: weights + scratch + staging first (weights_bytes,
    scratch_bytes, staging_bytes; fixed_bytes their sum), then as many KV blocks (K and V of every layer, in
    `kv_dtype`) as kv_blocks_that_fit allows. create() uses it; so do the capacity benchmark
    (bench/kv_quality_dtypes.py) and bench/model_ledger.py."""
    config = check_manifest(manifest)
    if max_num_batched_tokens < 1 or max_num_seqs < 1 or max_num_seqs > max_num_batched_tokens:
        raise ValueError(f"need 1 <= max_num_seqs ({max_num_seqs}) <= max_num_batched_tokens "
                         f"({max_num_batched_tokens})")
    b = WebGpuBackend(None, config, GpuLedger(budget_bytes), block_size=block_size, kv_dtype=kv_dtype,
                      max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    b.kv_layout = KVLayout(1, block_size, config.n_kv_heads, config.head_dim, kv_dtype)
    split = {"weights_bytes": b._weights_bytes(manifest),
             "scratch_bytes": sum(rounded(n) for _, n, _ in b._scratch_specs()),
             "staging_bytes": sum(rounded(n) for _, n, _ in b._staging_specs())}
    fixed = sum(split.values())
    block_bytes = 2 * config.n_layers * b.kv_layout.nbytes  # K and V of every layer, one block
    num_blocks = kv_blocks_that_fit(budget_bytes - fixed, block_bytes, max_binding, config.n_layers)
    return {"fixed_bytes": fixed, "block_bytes": block_bytes, "num_blocks": num_blocks,
            "bytes_per_token": b.bytes_per_token, **split}
