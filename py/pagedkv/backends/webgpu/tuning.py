"""First-boot tuning of the gpu kernel family: which workgroup shapes (model_kernels.GpuShapes) run fastest on
this adapter, timed once and cached.

For each hot shape (the gate|up projection: a decode matvec and a 128-token prefill matmul) 2-4 candidate
shapes are compiled, then timed with device.time_dispatches (GPU timestamps where the device has
`timestamp-query`, else the wall time of submits and a wait) until a budget of a second is spent. A
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
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ...model.weights import check_manifest
from . import model_kernels as ops

MATVEC_CANDIDATES = (64, 128, 256)  # threads of a matvec workgroup
MATMUL_CANDIDATES = ((64, 8), (64, 4), (128, 8), (128, 16))  # (threads, threads along rows), as fit the device
PREFILL_TOKENS = 128
AGREEMENT = 1e-5  # max |candidate - default| / max |default|: f32 rounding of another summation order
BUDGET_MS = 1000.0


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
               cands: list[Candidate] | None = None, budget_ms: float = BUDGET_MS) -> dict:
    """The gpu family's shapes for this adapter: {"shapes": GpuShapes, "source": "cache" | "tuned", "key",
    "timings": {kind: {shape: ms | "rejected" | "over budget"}}}; a fresh choice is stored under its key."""
    cands = candidates(ctx, config, subgroups, f16) if cands is None else cands
    names = sorted({c.call().shader for c in cands})
    key = cache_key(ctx.info.name, runtime, [await ctx.shaders.source(n) for n in names], config)
    cached = await store.get(key)
    if cached is not None:
        return {"shapes": _shapes(cached["choice"]), "source": "cache", "key": key, "timings": cached["timings"]}
    rng = np.random.default_rng(0)
    rows, cols = 2 * config.ffn, config.hidden
    parts = ops_parts(rng, rows, cols)
    for c in cands:  # compiled before the clock starts: the budget is for running them
        await ctx.kernel(c.call().shader, dict(c.call().constants))
    start = time.perf_counter()
    choice, timings = {}, {}
    for kind in ("matvec", "matmul"):
        group = [c for c in cands if c.kind == kind]
        tokens = 1 if kind == "matvec" else PREFILL_TOKENS
        x = rng.standard_normal((tokens, cols), dtype=np.float32)  # (T, cols)
        buffers = [ctx.upload(parts["qs"], "tune.qs"), ctx.upload(parts["dm"], "tune.dm"), ctx.upload(x, "tune.x"),
                   ctx.buffer(tokens * rows // 2 * 4, "tune.y")]
        try:
            choice[kind], timings[kind] = await _pick(ctx, group, buffers, tokens * rows // 2, start, budget_ms)
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
    choice = {"matvec": r["shapes"].matvec, "matmul": list(r["shapes"].matmul)}
    return r["shapes"], {"source": r["source"], "key": r["key"], "choice": choice, "timings": r["timings"]}


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


async def _pick(ctx, group: list[Candidate], buffers: list, n: int, start: float, budget_ms: float):
    """(the fastest candidate that agrees with the first, {candidate: ms | why not}) of one hot shape."""
    params = []
    try:
        _, want = await _run(ctx, group[0].call(), buffers, n, params)
        scale = float(np.abs(want).max())
        best, best_ms, timings = group[0].shape, None, {}
        for cand in group:
            label = str(cand.shape)
            if (time.perf_counter() - start) * 1e3 > budget_ms:
                timings[label] = "over budget"
                continue
            dispatches, got = await _run(ctx, cand.call(), buffers, n, params)
            if not float(np.abs(got - want).max()) <= AGREEMENT * scale:
                timings[label] = "rejected: output differs from the default's"
                continue
            ms = (await ctx.time_dispatches(dispatches, 3, 2))["min_ms"]
            timings[label] = round(ms, 4)
            if best_ms is None or ms < best_ms:
                best, best_ms = cand.shape, ms
    finally:
        for buf in params:
            buf.destroy()
    return list(best) if isinstance(best, tuple) else best, timings


def _shapes(choice: dict) -> ops.GpuShapes:
    return replace(ops.GpuShapes(), matvec=int(choice["matvec"]), matmul=tuple(choice["matmul"]))
