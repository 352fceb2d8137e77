"""First-boot tuning of the gpu kernel family: which workgroup shapes (model_kernels.GpuShapes) run fastest on
this adapter, timed once and cached.

For each hot shape (the gate|up projection: a decode matvec and a 128-token prefill matmul; the q|k|v, o, down
and LM head matvecs each with threads and row groups of their own) 2-6 candidate
shapes are compiled, then timed with device.time_dispatches (GPU timestamps where the device has
`timestamp-query`, else the wall time of submits and a wait) until a budget of a second of measuring is
spent (compiling the candidates and making their inputs do not count: a real GPU's compiles outlast its runs,
and on the H200 a wall-clock budget ran out before the LM head's candidates were timed). A
candidate must first reproduce the default shape's output (the kernel tests' relative bound: f32 rounding
of a different summation order) or it is rejected, never timed. The choice is cached under a key of the adapter, the runtime (browser
version / wgpu-py), the shaders' text and the model's shape, so a later boot on the same setup reuses it.
Pure host code over the GpuDevice interface: the store is any object with async get(key) -> dict | None and
async put(key, dict): JsonFileStore (one JSON file, under .cache/ natively) or JsonInStore (one JSON file in a
file_store.FileStore: the page keeps it in OPFS `tuning/`, since its worker has no localStorage).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ...model.weights import check_manifest
from . import model_kernels as ops
from .kv_attention_gpu import SPLIT_WORKGROUPS, decode_partition_blocks

MATVEC_CANDIDATES = (64, 128, 256)  # threads of a matvec workgroup
# each projection's own: (threads, row groups: matvec_gpu_main.wgsl's ROW_GROUPS), the default first; where
# a shape's lanes can take whole blocks of the projection's K (model_kernels.whole_blocks_apply), that shape
# with WHOLE_BLOCKS too, (threads, row groups, "whole"), after these
SLOT_CANDIDATES = ((64, 1), (128, 1), (256, 1), (64, 2), (64, 4), (64, 8))
WHOLE = "whole"
# (threads, threads along rows[, tokens a thread]), as fit the device; 2 or 1 token a thread: 2x / 4x the threads
# of the 4-token tiles, for GPUs that a 128-token prompt's 12,288 gate|up threads leave mostly idle
MATMUL_CANDIDATES = ((64, 8), (64, 4), (128, 8), (128, 16), (64, 8, 2), (64, 8, 1), (128, 16, 1))
SPLIT_CANDIDATES = (SPLIT_WORKGROUPS, 24, 48, 192, 384)  # decode attention's workgroup aim; the default first
SPLIT_CONTEXT = 2048  # tokens of the decode step the splits are timed on (one sequence)
PREFILL_TOKENS = 128
AGREEMENT = 1e-5  # max |candidate - default| / max |default|: f32 rounding of another summation order
BUDGET_MS = 1000.0


class Budget:
    """Milliseconds of measuring left: only the time inside running() counts (candidates' runs, checks and
    timings), not compiling them or making their inputs."""

    def __init__(self, ms: float) -> None:
        self.left_ms = ms

    def over(self) -> bool:
        return self.left_ms <= 0

    @contextmanager
    def running(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.left_ms -= (time.perf_counter() - t0) * 1e3


@dataclass(frozen=True)
class Candidate:
    """One workgroup shape of one hot shape; call builds its KernelCall."""

    kind: str  # "matvec" | "matmul"
    shape: int | tuple[int, int]
    call: Callable[[], ops.KernelCall]


def candidates(ctx, config, subgroups: bool, f16: bool) -> list[Candidate]:
    """The gate|up projection's candidates on `ctx` (matmul shapes that fit its workgroup memory); the first
    of each kind is the default."""
    rows, cols = 2 * config.ffn, config.hidden
    room = ctx.info.limits.get("maxComputeWorkgroupStorageSize", 16384)
    out = [Candidate("matvec", size, lambda size=size: ops.matvec_gpu_call(
        "q4_1", rows, cols, 1, subgroups, size, norm_eps=1e-5, swiglu=True, f16=f16)) for size in MATVEC_CANDIDATES]
    out += [Candidate("matmul", shape, lambda shape=shape: ops.matmul_gpu_call(
        "q4_1", rows, cols, PREFILL_TOKENS, shape, swiglu=True))
        for shape in MATMUL_CANDIDATES if ops.matmul_gpu_workgroup_bytes(shape) <= room]
    return out


def cache_key(adapter: str, runtime: str, shader_sources: list[str], config) -> str:
    """The key a tuned choice is stored under: the adapter's name, the runtime (browser user agent, or
    wgpu-py's version), the tuned shaders' expanded text and the model's shape."""
    parts = {"adapter": adapter, "runtime": runtime,
             "shaders": hashlib.sha256("\0".join(shader_sources).encode()).hexdigest(),
             "model": [config.hidden, config.ffn, config.vocab, config.n_heads, config.n_kv_heads, config.head_dim]}
    return "gpu-tuning:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class JsonFileStore:
    """Tuned choices in one JSON file (native runs: under .cache/), keyed by cache_key."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    async def get(self, key: str) -> dict | None:
        if not self.path.exists():
            return None
        return json.loads(self.path.read_text(encoding="utf-8")).get(key)

    async def put(self, key: str, value: dict) -> None:
        data = json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}
        data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")


class JsonInStore:
    """Tuned choices in one JSON file `name` of a file_store.FileStore (the page: an OpfsStore). A file that is not
    a JSON object (damaged) reads as empty: the adapter is tuned again and the file rewritten."""

    def __init__(self, store, name: str = "gpu_tuning.json") -> None:
        self.store = store
        self.name = name

    async def _read(self) -> dict:
        data = await self.store.read(self.name)
        try:
            value = json.loads(data) if data else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    async def get(self, key: str) -> dict | None:
        return (await self._read()).get(key)

    async def put(self, key: str, value: dict) -> None:
        data = await self._read()
        data[key] = value
        await self.store.write(self.name, json.dumps(data, sort_keys=True).encode())


async def tune(ctx, config, store, runtime: str, subgroups: bool, f16: bool,
               cands: list[Candidate] | None = None, budget_ms: float = BUDGET_MS, split: bool = True) -> dict:
    """The gpu family's shapes for this adapter: {"shapes": GpuShapes, "source": "cache" | "tuned", "key",
    "timings": {kind: {shape: ms | "rejected" | "over budget"}}}; a fresh choice is stored under its key.
    split: also time decode attention's workgroup aims (SPLIT_CANDIDATES, _pick_split)."""
    cands = candidates(ctx, config, subgroups, f16) if cands is None else cands
    names = sorted({c.call().shader for c in cands} | ({*SPLIT_SHADERS, "paged_kv_read"} if split else set()))
    key = cache_key(ctx.info.name, runtime, [await ctx.shaders.source(n) for n in names], config)
    cached = await store.get(key)
    if cached is not None:
        return {"shapes": _shapes(cached["choice"]), "source": "cache", "key": key, "timings": cached["timings"]}
    rng = np.random.default_rng(0)
    rows, cols = 2 * config.ffn, config.hidden
    parts = ops_parts(rng, rows, cols)
    for c in cands:  # compiling is not measuring: the budget is for running them
        await ctx.kernel(c.call().shader, dict(c.call().constants))
    budget = Budget(budget_ms)
    choice, timings = {}, {}
    for kind in ("matvec", "matmul"):
        group = [c for c in cands if c.kind == kind]
        tokens = 1 if kind == "matvec" else PREFILL_TOKENS
        x = rng.standard_normal((tokens, cols), dtype=np.float32)  # (T, cols)
        buffers = [ctx.upload(parts["qs"], "tune.qs"), ctx.upload(parts["dm"], "tune.dm"), ctx.upload(x, "tune.x"),
                   ctx.buffer(tokens * rows // 2 * 4, "tune.y")]
        try:
            choice[kind], timings[kind] = await _pick(ctx, group, buffers, tokens * rows // 2, budget)
        finally:
            for buf in buffers:
                buf.destroy()
    if split:
        choice["split"], timings["split"] = await _pick_split(ctx, config, subgroups, f16, budget)
        choice["matvec_slots"], timings["matvec_slots"], choice["matvec_whole"] = {}, {}, []
        for slot, (rows, cols, flags) in slot_shapes(config).items():  # the other projections' own threads
            if budget.over():  # not even compiled
                choice["matvec_slots"][slot] = [choice["matvec"], 1]
                timings["matvec_slots"][slot] = {str(shape): "over budget" for shape in SLOT_CANDIDATES}
                continue
            shapes = [*SLOT_CANDIDATES, *((t, g, WHOLE) for t, g in SLOT_CANDIDATES
                                          if ops.whole_blocks_apply(cols, t // g))]
            group = [Candidate("matvec", shape, lambda shape=shape, rows=rows, cols=cols, flags=flags:
                               ops.matvec_gpu_call("q4_1", rows, cols, 1, subgroups, shape[0], f16=f16,
                                                   row_groups=shape[1], whole_blocks=WHOLE in shape, **flags))
                     for shape in shapes]
            for c in group:
                await ctx.kernel(c.call().shader, dict(c.call().constants))
            w = random_q4_1(rng, rows, cols)
            x = rng.standard_normal(cols, dtype=np.float32)  # (cols,)
            buffers = [ctx.upload(w["qs"], "tune.qs"), ctx.upload(w["dm"], "tune.dm"), ctx.upload(x, "tune.x"),
                       ctx.buffer(rows * 4, "tune.y")]
            try:
                best, timings["matvec_slots"][slot] = await _pick(
                    ctx, group, buffers, rows // 2 if flags.get("swiglu") else rows, budget)
                choice["matvec_slots"][slot] = best[:2]
                if WHOLE in best:
                    choice["matvec_whole"] = sorted([*choice["matvec_whole"], slot])
            finally:
                for buf in buffers:
                    buf.destroy()
    await store.put(key, {"choice": choice, "timings": timings})
    return {"shapes": _shapes(choice), "source": "tuned", "key": key, "timings": timings}


async def tune_device(ctx, manifest: dict, store, runtime: str) -> tuple[ops.GpuShapes, dict]:
    """tune() for the model of `manifest` on `ctx`, with the subgroups / shader-f16 kernels the device has:
    (the shapes for WebGpuBackend.gpu_shapes, a JSON-able report: source, key, choice, timings). Run it before
    the backend is created: its buffers (a few MiB) come and go while the GPU budget is still unspent."""
    features = ctx.info.features
    r = await tune(ctx, check_manifest(manifest), store, runtime, "subgroups" in features, "shader-f16" in features)
    shapes = r["shapes"]
    choice = {"matvec": shapes.matvec, "matmul": list(shapes.matmul), "split": shapes.split,
              "matvec_slots": {slot: [threads, groups] for slot, threads, groups in shapes.matvec_slots},
              "matvec_whole": list(shapes.matvec_whole)}
    return shapes, {"source": r["source"], "key": r["key"], "choice": choice, "timings": r["timings"]}


def slot_shapes(config) -> dict[str, tuple[int, int, dict]]:
    """plan slot -> (rows, cols, matvec_gpu_call flags) of the projections tuned on their own (gate|up's threads
    are also the default matvec's)."""
    qkv = config.n_heads * config.head_dim + 2 * config.n_kv_heads * config.head_dim
    return {"lin_qkv": (qkv, config.hidden, {"norm_eps": 1e-5}),
            "lin_ffn": (2 * config.ffn, config.hidden, {"norm_eps": 1e-5, "swiglu": True}),
            "lin_h": (config.hidden, config.n_heads * config.head_dim, {"accumulate": True}),
            "lin_down": (config.hidden, config.ffn, {"accumulate": True}), "lm_head": (config.vocab, config.hidden, {})}


def random_q4_1(rng, rows: int, cols: int) -> dict:
    """Random Q4_1 parts (rows, cols), drawn as codes (no quantization: the LM head is large), a unit RMSNorm
    weight after the codes (the NORM variant's)."""
    blocks = rows * cols // 32
    scales = (rng.standard_normal((blocks, 2), dtype=np.float32) * 0.01).astype(np.float16)  # (blocks, (d, m))
    codes = rng.integers(0, 256, blocks * 16, dtype=np.uint8)
    return {"qs": np.concatenate([codes, np.ones(cols, "<f4").view(np.uint8)]), "dm": scales.view(np.uint8).ravel()}


def ops_parts(rng, rows: int, cols: int) -> dict:
    """Random q4_1 weights (rows, cols) with a unit RMSNorm weight after the codes (the NORM variant's)."""
    from ...model.layout import pack_q4_1, quantize_q4_1

    parts = pack_q4_1(*quantize_q4_1(rng.standard_normal((rows, cols), dtype=np.float32) * 0.05))
    return {"qs": np.frombuffer(bytes(parts["qs"]) + np.ones(cols, "<f4").tobytes(), np.uint8),
            "dm": np.frombuffer(parts["dm"], np.uint8)}


async def _run(ctx, call: ops.KernelCall, buffers: list, n: int, params: list) -> tuple[list, np.ndarray]:
    """One dispatch of `call` (its uniform buffer appended to `params`, for the caller to destroy); its
    dispatch list (for timing) and its output (n,) f32."""
    pipeline = await ctx.kernel(call.shader, dict(call.constants))
    params.append(ctx.upload(np.frombuffer(call.params, np.uint8), f"{call.shader}.params", uniform=True))
    dispatches = [(pipeline, ctx.bind(pipeline, [*buffers, params[-1]]), call.workgroups)]
    ctx.write(buffers[-1], np.zeros(n, np.float32))
    ctx.submit(dispatches)
    return dispatches, await ctx.read_array(buffers[-1], np.float32, (n,))


async def _pick(ctx, group: list[Candidate], buffers: list, n: int, budget: Budget):
    """(the fastest candidate that agrees with the first, {candidate: ms | why not}) of one hot shape."""
    params = []
    try:
        with budget.running():
            _, want = await _run(ctx, group[0].call(), buffers, n, params)
        scale = float(np.abs(want).max())
        best, best_ms, timings = group[0].shape, None, {}
        for cand in group:
            label = str(cand.shape)
            if budget.over():
                timings[label] = "over budget"
                continue
            with budget.running():
                dispatches, got = await _run(ctx, cand.call(), buffers, n, params)
            if not float(np.abs(got - want).max()) <= AGREEMENT * scale:
                timings[label] = "rejected: output differs from the default's"
                continue
            with budget.running():
                ms = (await ctx.time_dispatches(dispatches, 3, 2))["min_ms"]
            timings[label] = round(ms, 4)
            if best_ms is None or ms < best_ms:
                best, best_ms = cand.shape, ms
    finally:
        for buf in params:
            buf.destroy()
    return list(best) if isinstance(best, tuple) else best, timings


SPLIT_SHADERS = ("paged_attention_gpu_main", "matvec_io_merge")  # what the split's timing runs (cache key)


async def _pick_split(ctx, config, subgroups: bool, f16: bool, budget: Budget):
    """(the fastest workgroup aim that agrees with the first, {aim: ms | why not}) of decode attention and the
    output projection merging its partitions (the pair the split trades between), one sequence at
    SPLIT_CONTEXT tokens of f16 KV with the model's heads, blocks scattered."""
    from ...kv.spec import KVSpec
    from .kv_kernels import KVKernels
    from .kv_layout import GpuKVLayout
    from .memory_plan import partition_blocks

    bs, hd, hidden = 16, config.head_dim, config.n_heads * config.head_dim
    blocks = SPLIT_CONTEXT // bs
    layout = GpuKVLayout(KVSpec(1, config.n_kv_heads, hd, bs, "f16"), blocks)
    kv = await KVKernels(ctx, layout, config.n_heads, family="gpu", subgroups=subgroups).compile()
    rng = np.random.default_rng(1)
    room = -(-blocks // partition_blocks(bs))  # the most partitions any aim makes (the engine's scratch)
    def rows():  # a cache of random f16 rows
        return rng.standard_normal(layout.nbytes // 2, dtype=np.float32).astype(np.float16).view(np.uint8)

    w = ops_parts(rng, hidden, hidden)
    bufs = {"k": ctx.upload(rows(), "tune.k"), "v": ctx.upload(rows(), "tune.v"),
            "q": ctx.upload(rng.standard_normal(hidden, dtype=np.float32), "tune.q"),
            "table": ctx.upload(rng.permutation(blocks).astype(np.uint32), "tune.table"),
            "lens": ctx.upload(np.array([SPLIT_CONTEXT], np.uint32), "tune.lens"),
            "attn": ctx.buffer(hidden * 4, "tune.attn"), "acc": ctx.buffer(room * hidden * 4, "tune.acc"),
            "stats": ctx.buffer(room * config.n_heads * 8, "tune.stats"),
            "qs": ctx.upload(w["qs"], "tune.qs"), "dm": ctx.upload(w["dm"], "tune.dm"),
            "x": ctx.buffer(hidden * 4, "tune.x")}
    params = []
    try:
        best, best_ms, timings, want = None, None, {}, None
        for aim in SPLIT_CANDIDATES:
            label = str(aim)
            if budget.over():
                timings[label] = "over budget"
                continue
            pb = decode_partition_blocks(aim, 1, config.n_heads // kv.head_tile, blocks, bs, room)
            parts = -(-blocks // pb)
            attn_words = ops.uniform_words(1, config.n_heads, config.n_kv_heads, bs, blocks, pb, parts,
                                           1.0 / float(np.sqrt(hd)), 0)  # window 0: a full-attention layer
            merge_words = ops.uniform_words(1, config.n_heads, bs, pb, parts)
            call = ops.matvec_gpu_call("q4_1", hidden, hidden, 1, subgroups, accumulate=True, f16=f16)
            params += [ctx.upload(a, "tune.params", uniform=True) for a in (attn_words, merge_words)]
            params.append(ctx.upload(np.frombuffer(call.params, np.uint8), "tune.params", uniform=True))
            attn = kv.pipelines[kv.decode.attention]
            proj = await ctx.kernel(ops.gpu_matvec_shader("q4_1", subgroups, f16, "_merge"),
                                    dict(call.constants, HEAD_DIM=hd))
            b = bufs
            dispatches = [
                (attn, ctx.bind(attn, {0: b["q"], 1: b["k"], 2: b["v"], 3: b["table"], 4: b["lens"], 5: params[-3],
                                       6: b["attn"], 7: b["acc"], 8: b["stats"]}), kv.decode_grids(1, parts)[0]),
                (proj, ctx.bind(proj, {0: b["qs"], 1: b["dm"], 2: b["attn"], 3: b["x"], 4: params[-1],
                                       8: b["lens"], 9: b["acc"], 10: b["stats"], 11: params[-2]}), call.workgroups)]
            with budget.running():
                ctx.write(b["x"], np.zeros(hidden, np.float32))
                ctx.submit(dispatches)
                got = await ctx.read_array(b["x"], np.float32, (hidden,))
            if want is None:
                want = got
            elif not float(np.abs(got - want).max()) <= AGREEMENT * float(np.abs(want).max()):
                timings[label] = "rejected: output differs from the default's"
                continue
            with budget.running():
                ms = (await ctx.time_dispatches(dispatches, 3, 2))["min_ms"]
            timings[label] = round(ms, 4)
            if best_ms is None or ms < best_ms:
                best, best_ms = aim, ms
    finally:
        for buf in [*bufs.values(), *params]:
            buf.destroy()
    return SPLIT_WORKGROUPS if best is None else best, timings


def _shapes(choice: dict) -> ops.GpuShapes:
    slots = tuple(sorted((slot, int(threads), int(groups))
                         for slot, (threads, groups) in choice.get("matvec_slots", {}).items()))
    return replace(ops.GpuShapes(), matvec=int(choice["matvec"]), matmul=tuple(choice["matmul"]),
                   split=int(choice.get("split", SPLIT_WORKGROUPS)), matvec_slots=slots,
                   matvec_whole=tuple(sorted(choice.get("matvec_whole", []))))
