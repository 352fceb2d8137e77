"""Hot WGSL kernels at SmolLM2-135M's decode and prefill shapes, on a native adapter (wgpu-py) or in the page.

    python3 -m bench.kernels --backend wgpu|browser [--kernels NAME ...] [--quick] [--rotate-mib N] [--json]

For each kernel (the projections and attention in both kernel families, cpu and gpu: `family` in each row):
time per dispatch (GPU timestamp queries where the device has them, else the wall time of submits and a wait;
`timer` says which), bytes it must move, achieved GB/s and that as a fraction of the adapter's streaming-read
bandwidth, invocations launched; then a whole decode step per family (WebGpuBackend.forward, one sequence,
greedy, its wall time: decode_step, decode_step_gpu).

The yardstick tells DRAM's truth on a GPU: the streaming read (measured first) is a grid-stride coalesced read
(shaders/stream_read_grid.wgsl, 1,024 workgroups of 256) of a buffer of --rotate-mib (default 256 MiB, more
than twice any GPU's L2); each projection is timed over copies of its weights rotated through that many bytes
(one dispatch per copy in a pass; the time is the pass's over the copies), so no copy is still in the L2 when
it is read again. `dispatch_floor` is the time of an empty dispatch (256 in one pass). `stream_read_runs` is the
old per-thread runs pattern (stream_read.wgsl), kept because the CPU emulators read faster that way. Weights are random at
SmolLM2's shapes (times do not depend on the values), so no model file is needed: the same run works on any
machine with `pip install wgpu` and a Vulkan / Metal / D3D12 driver. Prints JSON (`python3 -m bench --only
kernels_wgpu kernels_browser` saves it under bench/results/). A figure, never a pass/fail.

measure() runs where the device is: in this process for wgpu, in the page's worker for browser (the page
imports this file as bench.kernels; nothing at its top needs CPython).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time

import numpy as np

from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout, KVCacheBuffers
from pagedkv.kernels.ref_ops import rope_cos_sin
from pagedkv.kv.spec import KVSpec
from pagedkv.model.config import ModelConfig
from pagedkv.model.layout import pack_float, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0
from pagedkv.model.quantize import random_gguf
from pagedkv.model.quants import pack_gguf
from pagedkv.model.weights import expected_shapes
from pagedkv.model.writer import PackedTensor, write_model
from pagedkv.model_runner import ForwardBatch

SMOLLM2 = ModelConfig(architecture="llama", n_layers=30, hidden=576, n_heads=9, n_kv_heads=3, head_dim=64, ffn=1536,
                      vocab=49152, rope_base=100000.0, rope_convention="adjacent_pairs", rms_eps=1e-5,
                      context_length=8192, tied_embeddings=True)
KERNELS = ("qkv", "o", "gate_up", "down", "lm_head", "down_q4_K", "down_q6_K", "decode_attention",
           "prefill_attention", "rmsnorm", "rope", "argmax", "sample", "sample_shape", "decode_step")
# the synthetic 1.5B model's projections (pagedkv.model.synthetic's preset: hidden 2048, 32 + 2 x 8 heads of
# 64, ffn 8192, every matrix Q4_K): asked for by name, not in the default set
KERNELS_1_5B = ("qkv_1.5b", "o_1.5b", "gate_up_1.5b", "down_1.5b")
# name -> (dtype, rows, cols, variant): the plan's fused projections (backends/webgpu/plan.py, fused.py); the
# K-quant rows are a Q4_K_M file's down projections (K a multiple of 256: SmolLM2's ffn)
LINEAR = {"qkv": ("q4_1", 960, 576, "norm"), "o": ("q4_1", 576, 576, "accumulate"),
          "gate_up": ("q4_1", 3072, 576, "swiglu"), "down": ("q4_1", 576, 1536, "accumulate"),
          "lm_head": ("q8_0", 49152, 576, ""), "down_q4_K": ("q4_K", 576, 1536, "accumulate"),
          "down_q6_K": ("q6_K", 576, 1536, "accumulate"),
          "qkv_1.5b": ("q4_K", 3072, 2048, "norm"), "o_1.5b": ("q4_K", 2048, 2048, "accumulate"),
          "gate_up_1.5b": ("q4_K", 16384, 2048, "swiglu"), "down_1.5b": ("q4_K", 2048, 8192, "accumulate")}


def quantized(dtype: str, rows: int, cols: int, rng) -> dict[str, bytes]:
    """Parts of a random (rows, cols) matrix: one 64-row block quantized and repeated (cheap in the page too);
    a K-quant's random GGUF blocks."""
    if dtype not in ("q4_1", "q8_0"):
        return pack_gguf(dtype, random_gguf(dtype, rows, cols, int(rng.integers(1 << 30)), scale=3e-4), (rows, cols))
    block = rng.standard_normal((min(rows, 64), cols), dtype=np.float32) * 0.05
    codes = quantize_q4_1(block) if dtype == "q4_1" else quantize_q8_0(block)
    reps = -(-rows // block.shape[0])
    codes = [np.tile(c, (reps, 1))[:rows] for c in codes]
    return pack_q4_1(*codes) if dtype == "q4_1" else pack_q8_0(*codes)


def random_tensors(config: ModelConfig, seed: int = 0) -> list[PackedTensor]:
    """Every tensor of a model of `config` with random values: Q8_0 embedding, Q4_1 matrices, f32 norms."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape in expected_shapes(config).items():
        if len(shape) == 1:
            out.append(PackedTensor(name, "f32", shape, pack_float(np.ones(shape, np.float32), "f32")))
        else:
            dtype = "q8_0" if name == "token_embd.weight" else "q4_1"
            out.append(PackedTensor(name, dtype, shape, quantized(dtype, *shape, rng)))
    return out


class Bench:
    """Times dispatch lists on one device and turns them into rows."""

    def __init__(self, ctx, repeats: int, runs: int, rotate_bytes: int = 0, progress: bool = False) -> None:
        self.ctx, self.repeats, self.runs = ctx, repeats, runs
        self.progress = progress  # each row to stderr as it is measured: a run stopped at a deadline keeps them
        self.rotate_bytes = rotate_bytes  # the weight copies a projection's timing rotates through
        self.stream_gb_s = None
        self.rows = []

    async def row(self, name: str, phase: str, dispatches: list, nbytes: int, invocations: int, per: int = 1,
                  **shape) -> dict:
        """Time `dispatches` as one pass; `per`: the dispatches it holds of the one timed (rotated copies), the
        row's times, bytes and invocations are one dispatch's."""
        t = await self.ctx.time_dispatches(dispatches, self.repeats, self.runs)
        ms, ms_min = t["median_ms"] / per, t["min_ms"] / per
        gb_s = nbytes / ms_min / 1e6
        row = {"kernel": name, "phase": phase, **shape, "timer": t["timer"], "ms_median": ms, "ms_min": ms_min,
               "wall_ms_median": t.get("wall_median_ms", t["median_ms"]) / per, "bytes": nbytes, "gb_s": gb_s,
               "invocations": invocations, "dispatches_per_pass": per,
               "fraction_of_stream_read": gb_s / self.stream_gb_s if self.stream_gb_s else None}
        self.rows.append(row)
        if self.progress:
            print(json.dumps(row), file=sys.stderr, flush=True)
        return row

    def upload(self, data, label: str, uniform: bool = False):
        arr = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else np.ascontiguousarray(data)
        return self.ctx.upload(arr, label, uniform=uniform)

    async def call(self, call: ops.KernelCall, buffers: list) -> tuple[list, int]:
        """A KernelCall bound to `buffers` + its uniform: (dispatches, invocations launched)."""
        pipeline = await self.ctx.kernel(call.shader, dict(call.constants))
        params = self.upload(call.params, f"{call.shader}.params", uniform=True)
        wg = dict(call.constants)["WORKGROUP_SIZE"]
        group = self.ctx.bind(pipeline, [*buffers, params])
        return [(pipeline, group, call.workgroups)], math.prod(call.workgroups) * wg


def n_threads(call: ops.KernelCall) -> int:
    return math.prod(call.workgroups) * dict(call.constants)["WORKGROUP_SIZE"]


def invocations(kk: KVKernels, dispatches: list) -> int:
    sizes = {id(kk.pipelines[name]): size for name, _, _, size in kk.decode.specs}  # the attention kernels' own
    sizes[id(kk.pipelines[kk.prefill.name])] = kk.prefill.workgroup
    return sum(math.prod(groups) * sizes.get(id(pipeline), kk.workgroup_size) for pipeline, _, groups in dispatches)


def family_linear(ctx, family: str, kind: str, dtype: str, rows: int, cols: int, t: int,
                  variant: str, whole_blocks: bool = False, thread_tokens: int = 4) -> ops.KernelCall:
    """The KernelCall a plan of kernel `family` records for this projection on device `ctx` (the gpu family
    with subgroups and in f16 where the device has them, in its default workgroup shapes; whole_blocks: its
    matvec with WHOLE_BLOCKS; thread_tokens: its matmul's tokens a thread, THREAD_TOKENS)."""
    flags = {"accumulate": variant == "accumulate", "swiglu": variant == "swiglu"}
    norm = {"norm_eps": 1e-5} if variant == "norm" and kind == "matvec" else {}
    if family == "cpu":
        return (ops.matvec_call if kind == "matvec" else ops.matmul_call)(dtype, rows, cols, t, **flags, **norm)
    if kind == "matmul":
        return ops.matmul_gpu_call(dtype, rows, cols, t, (*ops.GPU_MATMUL_SHAPE, thread_tokens), **flags)
    features = ctx.info.features
    return ops.matvec_gpu_call(dtype, rows, cols, t, "subgroups" in features, **flags, **norm,
                               f16="shader-f16" in features, whole_blocks=whole_blocks)


async def linear_rows(b: Bench, names: list[str], prefills: list[int], rng) -> None:
    for name in names:
        dtype, rows, cols, variant = LINEAR[name]
        parts = quantized(dtype, rows, cols, rng)
        weight_bytes = sum(len(p) for p in parts.values())
        for phase, t in [("decode", 1)] + [("prefill", p) for p in prefills]:
            kind = "matvec" if t == 1 else "matmul"
            norm = variant == "norm" and kind == "matvec"
            qs = parts["qs"] + (np.ones(cols, "<f4").tobytes() if norm else b"")
            out_rows = rows // 2 if variant == "swiglu" else rows
            x = b.upload(rng.standard_normal((t, cols), dtype=np.float32), "x")
            y = b.ctx.buffer(t * out_rows * 4, "y")
            moved = weight_bytes + t * cols * 4 + t * out_rows * 4 * (2 if variant == "accumulate" else 1)
            copies = max(1, -(-b.rotate_bytes // weight_bytes))  # rotated through more than the L2 holds
            weights = [(b.upload(qs, "qs"), b.upload(parts[list(parts)[1]], "s")) for _ in range(copies)]
            runs = [(family, False, 4) for family in ops.FAMILIES]
            if kind == "matvec" and ops.whole_blocks_apply(cols, ops.GpuShapes().matvec, 8 if dtype == "q8_0" else 4):
                runs.append(("gpu", True, 4))  # its lanes taking whole blocks (WHOLE_BLOCKS): the row "...:whole"
            if kind == "matmul" and dtype in ops.GPU_MATMUL_TYPES:  # 2 or 1 token a thread: the rows "...:t2", ":t1"
                runs += [("gpu", False, per) for per in ops.GPU_THREAD_TOKENS[1:]]
            for family, whole, per in runs:
                call = family_linear(b.ctx, family, kind, dtype, rows, cols, t, variant, whole, per)
                dispatches = []
                for w in weights:
                    one, n = await b.call(call, [*w, x, y])
                    dispatches += one
                tag = (":whole" if whole else "") + (f":t{per}" if per != 4 else "")
                await b.row(f"{name}:{call.shader}{tag}", phase, dispatches, moved, n,
                            per=copies, family=family, rows=rows, cols=cols, tokens=t, weight_copies=copies)
            for w in weights:
                for buf in w:
                    buf.destroy()


DECODE_CONTEXTS = (512, 4096)  # decode attention of both kernel families is timed here too


async def attention_rows(b: Bench, contexts: list[int], prefills: list[int], decode: bool, rng) -> None:
    """Decode attention at `contexts` and DECODE_CONTEXTS, or prefill attention over each of `prefills` tokens, in each
    kernel family (cpu; gpu with its workgroup tree and, where the device has them, with subgroups), each with
    the cache's blocks head-major (the kernels' layout) and token-major (rows ":token", the layout before)."""
    cfg, bs = SMOLLM2, 16
    contexts = sorted(set(contexts) | set(DECODE_CONTEXTS)) if decode else contexts
    spec = KVSpec.of(cfg, block_size=bs, dtype="f16")
    cache = KVCacheBuffers(b.ctx, GpuKVLayout(spec, -(-max(contexts + prefills) // bs) + 1))
    kv_token = 2 * cache.layout.token_bytes  # K and V of one token
    q_bytes = cfg.n_heads * cfg.head_dim * 4
    families = [("cpu", False), ("gpu", False)] + [("gpu", True)] * ("subgroups" in b.ctx.info.features)
    for family, subgroups in families if decode else families[:2]:  # prefill has no subgroup variant
        for head_major in (True, False):
            layout = GpuKVLayout(spec, cache.layout.num_blocks, head_major=head_major)
            kk = await KVKernels(b.ctx, layout, cfg.n_heads, family=family, subgroups=subgroups).compile()
            tag = "" if head_major else ":token"
            for context in contexts if decode else ():
                table = rng.permutation(layout.num_blocks)[None, : -(-context // bs)]  # (1, blocks) scattered
                p = kk.prepare_paged_attention(cache, np.zeros((1, cfg.n_heads, cfg.head_dim), np.float32), table,
                                               np.array([context]))
                await b.row(kk.decode.attention + tag, "decode", p.dispatches, context * kv_token + 2 * q_bytes,
                            invocations(kk, p.dispatches), context=context, passes=len(p.dispatches), family=family)
                p.destroy()
            for prefill in () if decode else prefills:
                table = rng.permutation(layout.num_blocks)[None, : -(-prefill // bs)]
                p = kk.prepare_prefill_attention(cache, np.zeros((prefill, cfg.n_heads, cfg.head_dim), np.float32),
                                                 np.array([0, prefill]), table, np.array([prefill]))
                await b.row(kk.prefill.name + tag, "prefill", p.dispatches, prefill * (kv_token + 2 * q_bytes),
                            invocations(kk, p.dispatches), context=prefill, tokens=prefill, family=family)
                p.destroy()
    cache.destroy()


async def small_rows(b: Bench, names: list[str], rng) -> None:
    cfg = SMOLLM2
    if "rmsnorm" in names:
        x = b.upload(rng.standard_normal(cfg.hidden, dtype=np.float32), "x")
        d, n = await b.call(ops.rmsnorm_call(cfg.hidden, 1, cfg.rms_eps), [x, x, b.ctx.buffer(cfg.hidden * 4, "o")])
        await b.row("rmsnorm", "decode", d, 3 * cfg.hidden * 4, n, hidden=cfg.hidden)
    if "rope" in names:
        width = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        outs = [b.ctx.buffer(w * 4, "out") for w in (cfg.hidden, cfg.kv_dim, cfg.kv_dim)]
        table = b.upload(rope_cos_sin(cfg.head_dim, cfg.rope_base, cfg.context_length), "cos_sin")
        d, n = await b.call(ops.rope_call(1, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim),
                            [b.upload(np.zeros(width, np.float32), "qkv"), *outs,
                             b.upload(np.array([8000], np.int32), "pos"), table,
                             b.upload(np.zeros(width, np.float32), "bias")])
        await b.row("rope", "decode", d, 2 * width * 4 + (cfg.n_heads + cfg.n_kv_heads) * cfg.head_dim * 4, n)
    if "argmax" in names:
        logits = b.upload(rng.standard_normal(cfg.vocab, dtype=np.float32), "logits")
        d, n = await b.call(ops.argmax_call(cfg.vocab, 1), [logits, b.ctx.buffer(16, "ids")])
        await b.row("argmax", "decode", d, cfg.vocab * 4, n, vocab=cfg.vocab)
    if "sample" in names:  # the app's default draw: temperature 0.7, top-p 0.95 (one sequence; 12 row passes)
        logits = b.upload(rng.standard_normal(cfg.vocab, dtype=np.float32) * 4, "logits")
        settings = b.upload(np.array([0.7, 0.95, 0.5, 0.0], np.float32), "settings")
        d, n = await b.call(ops.sample_call(cfg.vocab, 1), [logits, settings, b.ctx.buffer(16, "ids")])
        await b.row("sample", "decode", d, 12 * cfg.vocab * 4, n, vocab=cfg.vocab, temperature=0.7, top_p=0.95)
    if "sample_shape" in names:  # a shaped draw's first kernel: 5 log-probs, penalties, min-p 0.05, top-k 50
        from pagedkv.device_draws import LP_STRIDE

        rows = np.array([[50, *np.array([0.05, 0.5, 0.5], np.float32).view(np.uint32), 0, 0, 0, 5]], np.uint32)
        bufs = [b.upload(rng.standard_normal(cfg.vocab, dtype=np.float32) * 4, "logits"),
                b.upload(np.array([0.7, 0.95, 0.5, 0.0], np.float32), "settings"), b.upload(rows, "rows"),
                b.upload(np.zeros(2, np.uint32), "bias"), b.upload(np.ones(cfg.vocab, np.uint32), "counts"),
                b.ctx.buffer(cfg.vocab * 4, "shaped"), b.ctx.buffer((1 + LP_STRIDE) * 4, "io")]
        d, n = await b.call(ops.sample_shape_call(cfg.vocab, 1, 1), bufs)
        # row passes: 2 for the lse, 2 a best id, 3 for penalties (logits, counts in; shaped out), 2 for min-p,
        # 8 digit passes and 2 for top-k's cut
        await b.row("sample_shape", "decode", d, (2 + 2 * 5 + 3 + 2 + 10) * cfg.vocab * 4, n, vocab=cfg.vocab,
                    top_n=5, top_k=50, min_p=0.05)


CHAIN_LENGTHS = (1, 16, 128)  # dependent empty dispatches a pass


async def dispatch_chain_rows(b: Bench) -> float:
    """Rows "dispatch_chain" (shaders/dispatch_chain.wgsl): chains of CHAIN_LENGTHS dispatches in one pass, each
    reading the counter the one before wrote, as a decode step's kernels each wait for the one before. Returns
    the dependent-dispatch floor: ms a dispatch, the slope between the shortest and the longest chain (the
    pass's own start and end cancel)."""
    counter = b.ctx.upload(np.zeros(4, np.uint32), "chain.counter")
    call = ops.KernelCall("dispatch_chain", (("WORKGROUP_SIZE", 1),), (1, 1, 1), ops.uniform_words(1).tobytes())
    one, _ = await b.call(call, [counter])
    totals = {}
    for n in CHAIN_LENGTHS:
        b.ctx.write(counter, np.zeros(4, np.uint32))
        row = await b.row("dispatch_chain", "roofline", one * n, 0, n, per=n, chain=n)
        totals[n] = row["ms_min"] * n
        # the timing ran the pass once to warm up, then runs x repeats times: each dispatch added 1
        got = int((await b.ctx.read_array(counter, np.uint32, (1,)))[0])
        if got != n * (1 + b.runs * b.repeats):
            raise RuntimeError(f"dispatch_chain: a chain of {n} counted {got}, not {n * (1 + b.runs * b.repeats)}: "
                               "the device did not run the chain's dispatches one after another")
    counter.destroy()
    lo, hi = CHAIN_LENGTHS[0], CHAIN_LENGTHS[-1]
    return (totals[hi] - totals[lo]) / (hi - lo)


async def decode_step(ctx, context: int, reps: int, kernels: str = "cpu") -> dict:
    """WebGpuBackend.forward of one sequence's decode token at `context` (random SmolLM2-shaped weights), with
    the `kernels` family (the gpu family in its default workgroup shapes, untuned)."""
    from pagedkv.backends.webgpu.backend import WebGpuBackend
    from pagedkv.backends.webgpu.plan import PlanKey, layer_program

    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_model(tmp, SMOLLM2, random_tensors(SMOLLM2), {}, "", {"file": "random", "sha256": None})

        async def shard(name: str) -> bytes:
            with open(f"{tmp}/{name}", "rb") as f:
                return f.read()

        backend = await WebGpuBackend.create(ctx, manifest, shard, budget_bytes=1 << 30, block_size=16,
                                             kernels=kernels)
    bs, pos = backend.block_size, context - 1
    table = np.zeros((1, backend.max_blocks_per_seq), np.int32)
    table[0, : -(-context // bs)] = np.random.default_rng(1).permutation(backend.num_blocks)[: -(-context // bs)]
    batch = ForwardBatch(np.array([17], np.int32), np.array([pos], np.int32),
                         np.array([table[0, pos // bs] * bs + pos % bs], np.int32), np.array([0, 1], np.int32),
                         table, np.array([context], np.int32))
    # GPU timestamps around each step's passes where the device can (a NativeDevice with timestamp-query);
    # the page's replayer (web/replayer.js) has no step timer: wall time only, said so in the row
    stamped = hasattr(ctx, "time_steps") and "timestamp-query" in ctx.info.features

    async def timed() -> tuple[list[float], list[float] | None, int]:
        await backend.forward(batch, greedy=True)  # records and validates the plan
        if stamped:
            ctx.time_steps(reps)
        walls = []
        for _ in range(reps):
            t0 = time.perf_counter()
            await backend.forward(batch, greedy=True)
            walls.append((time.perf_counter() - t0) * 1e3)
        gpu = await ctx.step_times_ms() if stamped else None
        return walls, gpu, sum(map(len, layer_program(backend, PlanKey.of(1, 1, sampled=False, greedy=True))))

    walls, gpu, dispatches = await timed()
    # the same step with q | k | v a matvec of its own (WebGpuBackend.fold_qkv): what the fold saves, same weights
    unfolded = None
    if kernels == "gpu" and backend.fold_qkv:
        backend.fold_qkv = False
        u_walls, u_gpu, u_dispatches = await timed()
        unfolded = {"plan_dispatches": u_dispatches, "ms_median": float(np.median(u_walls)), "ms_min": min(u_walls),
                    "gpu_ms_median": float(np.median(u_gpu)) if u_gpu else None,
                    "gpu_ms_min": min(u_gpu) if u_gpu else None}
    weights = backend.ledger.by_kind()["weights"]
    nbytes = weights + context * backend.bytes_per_token
    backend.destroy()
    return {"context": context, "kernels": kernels, "timer": "wall (forward: write inputs, replay, read ids)",
            "ms_median": float(np.median(walls)), "ms_min": min(walls), "bytes": nbytes, "weights_bytes": weights,
            "gb_s": nbytes / min(walls) / 1e6, "tok_s": 1000 / min(walls),
            "plan_dispatches": dispatches,  # recorded in the step's plan (a shape may skip some)
            "gpu_timer": "gpu timestamps (first pass start to last pass end)" if stamped else None,
            "gpu_timer_missing": None if stamped else (
                "the adapter lacks timestamp-query" if "timestamp-query" not in ctx.info.features
                else "this device has no step timer (the page's replayer)") + ": wall time only",
            "gpu_ms_median": float(np.median(gpu)) if gpu else None, "gpu_ms_min": min(gpu) if gpu else None,
            "gpu_tok_s": 1000 / min(gpu) if gpu else None,
            "unfolded": unfolded}  # the gpu family with WebGpuBackend.fold_qkv off (None: the cpu family's)


async def measure(ctx, kernels: list[str], quick: bool, rotate_mib: int | None = None,
                  prefill_tokens: list[int] | None = None, progress: bool = False) -> dict:
    """Every figure of this benchmark on the device `ctx` (any device.GpuDevice). rotate_mib: the bytes the
    streaming read and each projection's weight copies span (default 256 MiB, 16 with quick); prefill_tokens:
    the prefill rows' token counts, each a row of its own (default [128], [32] with quick); progress: each row
    to stderr, one JSON line, as it is measured."""
    repeats, runs = (3, 3) if quick else (10, 5)
    contexts, prefill = ([256, 1024], 32) if quick else ([256, 1024, 4096], 128)
    prefills = list(prefill_tokens or [prefill])
    rotate = (rotate_mib if rotate_mib is not None else 16 if quick else 256) << 20
    b = Bench(ctx, repeats, runs, rotate, progress)
    rng = np.random.default_rng(0)
    nbytes = max(rotate, 16 << 20)  # a multiple of both streams' units (1 MiB, 16 MiB)
    data = b.upload(rng.integers(0, 2**32, nbytes // 4, dtype=np.uint32), "stream")
    grid = ops.stream_read_grid_call(nbytes)
    d, n = await b.call(grid, [data, ctx.buffer(n_threads(grid) * 4, "stream.out")])
    stream = await b.row("stream_read", "roofline", d, nbytes, n, pattern="grid-stride coalesced")
    b.stream_gb_s = stream["gb_s"]
    stream["fraction_of_stream_read"] = 1.0
    d, n = await b.call(ops.stream_read_call(nbytes), [data, ctx.buffer(256 * 64 * 4, "stream.runs")])
    await b.row("stream_read_runs", "roofline", d, nbytes, n, pattern="a contiguous run per thread")
    data.destroy()
    floor, _ = await b.call(ops.empty_call(), [ctx.buffer(16, "empty.out")])
    await b.row("dispatch_floor", "roofline", floor * 256, 0, 256, per=256)
    chain = await dispatch_chain_rows(b)
    await linear_rows(b, [k for k in kernels if k in LINEAR], prefills, rng)
    for decode, name in ((True, "decode_attention"), (False, "prefill_attention")):
        if name in kernels:
            await attention_rows(b, contexts, prefills, decode, rng)
    await small_rows(b, kernels, rng)
    info = ctx.info
    out = {"adapter": {"name": info.name, "backend": info.backend, "features": list(info.features),
                       "limits": info.limits},
           "quick": quick, "repeats": repeats, "runs": runs, "stream_read_gb_s": b.stream_gb_s,
           "rotate_bytes": rotate, "dispatch_floor_ms": next(r["ms_min"] for r in b.rows if r["kernel"] == "dispatch_floor"),
           "dependent_dispatch_ms": chain, "timestamp_query": "timestamp-query" in info.features,
           "kernels": b.rows}
    if "decode_step" in kernels:  # "decode_step": the cpu family's, "decode_step_gpu": the gpu family's
        for family in ops.FAMILIES:
            step = await decode_step(ctx, contexts[-1], repeats, family)
            step["fraction_of_stream_read"] = step["gb_s"] / b.stream_gb_s
            if step.get("gpu_ms_min") is not None:  # what of the step the dependent dispatches' floor explains
                step["dispatch_chain_ms"] = step["plan_dispatches"] * chain
            out["decode_step" if family == "cpu" else f"decode_step_{family}"] = step
    return out


PAGE = """
import json
from bench.kernels import measure
from pagedkv.backends.webgpu.runtime import open_device
json.dumps(await measure(await open_device(), {kernels!r}, {quick!r}, {rotate!r}, {prefill!r}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("wgpu", "browser"), required=True,
                        help="wgpu: a native adapter through wgpu-py; browser: headless Chromium's WebGPU")
    parser.add_argument("--kernels", nargs="+", choices=KERNELS + KERNELS_1_5B, default=list(KERNELS),
                        help="default: every one but the 1.5B model's projections (" + " ".join(KERNELS_1_5B) + ")")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller shapes")
    parser.add_argument("--rotate-mib", type=int, default=None,
                        help="bytes the streaming read and each projection's weight copies span (default 256 MiB, "
                             "16 with --quick): more than twice the GPU's L2")
    parser.add_argument("--prefill", type=int, nargs="+", default=None, metavar="TOKENS",
                        help="tokens of the prefill rows (matmuls, prefill attention), a row for each count given "
                             "(default 128, 32 with --quick)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--progress", action="store_true",
                        help="--backend wgpu: each row to stderr as a JSON line as soon as it is measured")
    args = parser.parse_args(argv)
    if args.prefill is not None and min(args.prefill) < 1:
        parser.error("--prefill must be at least 1")
    t0 = time.perf_counter()
    if args.backend == "wgpu":
        import asyncio

        from pagedkv.backends.webgpu.native import NativeDevice

        async def run() -> dict:
            return await measure(await NativeDevice.create(), args.kernels, args.quick, args.rotate_mib, args.prefill,
                                 args.progress)

        result = asyncio.run(run())
    else:
        from bench.harness import install_bench, session

        with session() as page:
            install_bench(page, "kernels.py")
            result = page.py(PAGE.format(kernels=args.kernels, quick=args.quick, rotate=args.rotate_mib,
                                         prefill=args.prefill))
    result.update({"benchmark": "kernels", "backend": args.backend, "wall_s": round(time.perf_counter() - t0, 1),
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    # The runner (`python3 -m bench --only kernels_wgpu`) saves the JSON; run alone, this only prints.
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


def table(result: dict) -> str:
    """The figures as aligned text lines, for a person at a terminal."""
    lines = [f"{result['adapter']['name']} ({result['adapter']['backend'] or result['backend']}); "
             f"stream read {result['stream_read_gb_s']:.2f} GB/s"]
    steps = [dict(result[k], kernel=k, phase="step") for k in ("decode_step", "decode_step_gpu") if k in result]
    for r in result["kernels"] + steps:
        name = r["kernel"] + (f" x{r['chain']}" if "chain" in r else f" @{r['tokens']}" if r["phase"] == "prefill" else "")
        lines.append(f"{name:<38} {r['phase']:<8} {r['ms_min']:9.3f} ms {r['gb_s']:8.2f} GB/s "
                     f"{r['fraction_of_stream_read']:6.1%}  {r['timer']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
