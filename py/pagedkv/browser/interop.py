"""Browser WebGPU interop: with opfs.py beside it, the only engine code that imports `js` / `pyodide`
(the app's UI bridge imports its site fetch from here).

GpuContext implements device.GpuDevice over the browser's WebGPU (navigator.gpu), beside
native.NativeDevice over wgpu-py; every error scope of the browser lives here, and a whole step is one
crossing into web/replayer.js. It only works inside Pyodide in a browser (window or worker) that exposes
`navigator.gpu`.
"""
from __future__ import annotations

import statistics

import numpy as np

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_once_callable, to_js  # type: ignore[import-not-found]

from ..backends.webgpu.device import (REQUESTED_LIMITS, AdapterInfo, GPUError, GpuDevice, ShaderLibrary,
                                      WebGPUUnavailable, padded, resource)

__all__ = ["GpuContext", "WasmUnavailable", "fetch_bytes", "linear_threads", "linear_wasm_matmul", "site_url",
           "wasm_attention", "wasm_relaxed_simd"]


class WasmUnavailable(RuntimeError):
    """The worker could not load the wasm projection kernel; the message says why."""


def _wasm_kernels():
    loaded = getattr(js, "pagedkvLinear", None)
    if loaded is None:
        raise WasmUnavailable("the worker did not load web/linear_wasm.js")
    if loaded.error is not None:
        raise WasmUnavailable(str(loaded.error))
    return loaded


def linear_wasm_matmul():
    """The wasm kernel's matmul export the worker instantiated on Pyodide's memory (web/linear_wasm.js), for
    backends/cpu_wasm.py; WasmUnavailable with the worker's reason when it has none."""
    return _wasm_kernels().matmul


def wasm_relaxed_simd() -> bool:
    """Whether the worker loaded the kernel with its relaxed-SIMD functions (the 8-bit activations: this browser
    validates i32x4.relaxed_dot_i8x16_i7x16_add_s); WasmUnavailable as linear_wasm_matmul."""
    return bool(_wasm_kernels().relaxedSimd)


def wasm_attention():
    """The same instance's exports, whose attn_scores / attn_values backends/cpu_attention.py calls;
    WasmUnavailable as linear_wasm_matmul."""
    return _wasm_kernels().attention


async def linear_threads(count: int):
    """The same kernel on `count` threads (0: one per core the browser reports) sharing one memory that holds the
    weights (web/linear_threads.js), for backends/cpu_wasm.SharedStore; WasmUnavailable saying why the products
    stay on one thread (no kernel, a page without cross-origin isolation, one core, threads=1)."""
    loaded = _wasm_kernels()
    result = await loaded.startThreads(count)
    if result.error is not None:
        raise WasmUnavailable(str(result.error))
    return result.api


def _js_obj(value: dict):
    return to_js(value, dict_converter=js.Object.fromEntries)


def site_url(path: str) -> str:
    """The URL of a file of this site; workers resolve relative URLs against the worker script, which lives
    at the site root."""
    return str(js.location.href).rsplit("/", 1)[0] + "/" + path


async def fetch_bytes(path: str, on_chunk=None) -> bytes:
    """GET a file of this site; on_chunk(n) after each chunk that arrives."""
    resp = await js.fetch(site_url(path))
    if not resp.ok:
        raise RuntimeError(f"fetching {path} failed: HTTP {resp.status}")
    if on_chunk is None:
        return bytes((await resp.arrayBuffer()).to_py())
    reader = resp.body.getReader()
    parts = []
    while True:
        chunk = await reader.read()
        if chunk.done:
            break
        data = chunk.value.to_py()
        parts.append(bytes(data))
        on_chunk(len(data))
    return b"".join(parts)


class GpuContext(GpuDevice):
    """The browser's adapter + device. Create with `await GpuContext.create()`."""

    def __init__(self, adapter, device, info: AdapterInfo) -> None:
        super().__init__(info, ShaderLibrary(lambda path: fetch_bytes("shaders/" + path)))
        self.adapter = adapter
        self.device = device
        self.js_crossings = 0

    @classmethod
    async def create(cls, on_lost=None) -> "GpuContext":
        gpu = getattr(js.navigator, "gpu", None)
        if gpu is None:
            raise WebGPUUnavailable(
                "This browser does not expose WebGPU (navigator.gpu is missing). Use Chrome or Edge 113+ "
                "on a secure origin (https or localhost); on Linux enable it at chrome://flags/#enable-unsafe-webgpu."
            )
        adapter = await gpu.requestAdapter(_js_obj({"powerPreference": "high-performance"}))
        if adapter is None:
            raise WebGPUUnavailable(
                "WebGPU is present but no GPU adapter is available. Use Chrome or Edge 113+ with hardware "
                "acceleration on (chrome://settings/system), or enable chrome://flags/#enable-unsafe-webgpu "
                "(on Linux also chrome://flags/#enable-vulkan), then reload."
            )
        limits = {name: int(getattr(adapter.limits, name)) for name in REQUESTED_LIMITS}
        features = tuple(sorted(str(f) for f in getattr(js.Array, "from")(adapter.features)))
        raw_info = getattr(adapter, "info", None)
        info = AdapterInfo(
            vendor=str(getattr(raw_info, "vendor", "") or ""),
            architecture=str(getattr(raw_info, "architecture", "") or ""),
            description=str(getattr(raw_info, "description", "") or ""),
            limits=limits,
            features=features,
        )
        # The gpu kernel family uses subgroups and shader-f16; timestamps time its first-boot tuning.
        wanted = [f for f in ("subgroups", "shader-f16", "timestamp-query") if f in features]
        device = await adapter.requestDevice(_js_obj({"requiredLimits": _js_obj(limits),
                                                      "requiredFeatures": to_js(wanted)}))
        ctx = cls(adapter, device, info)

        def lost(lost_info):
            ctx.lost_reason = f"{lost_info.reason}: {lost_info.message}"
            if on_lost is not None:
                on_lost(ctx.lost_reason)

        device.lost.then(create_once_callable(lost))
        return ctx

    # ---------------------------------------------------------------- buffers

    def buffer(self, nbytes: int, label: str, *, readable: bool = False, uniform: bool = False,
               map_read: bool = False):
        if map_read:
            usage = js.GPUBufferUsage.MAP_READ | js.GPUBufferUsage.COPY_DST
        else:
            usage = js.GPUBufferUsage.COPY_DST | js.GPUBufferUsage.COPY_SRC
            usage |= js.GPUBufferUsage.UNIFORM if uniform else js.GPUBufferUsage.STORAGE
        return self.device.createBuffer(_js_obj({"size": padded(nbytes), "usage": usage, "label": label}))

    def write(self, buffer, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        self.js_crossings += 1
        self.device.queue.writeBuffer(buffer, offset, to_js(memoryview(data).cast("B")))

    async def read(self, buffer, nbytes: int) -> bytes:
        staging = self.device.createBuffer(_js_obj({
            "size": padded(nbytes),
            "usage": js.GPUBufferUsage.MAP_READ | js.GPUBufferUsage.COPY_DST,
            "label": "readback",
        }))
        encoder = self.device.createCommandEncoder()
        encoder.copyBufferToBuffer(buffer, 0, staging, 0, staging.size)
        self.device.queue.submit(to_js([encoder.finish()]))
        await staging.mapAsync(js.GPUMapMode.READ)
        data = bytes(staging.getMappedRange(0, staging.size).to_py())[:nbytes]
        staging.unmap()
        staging.destroy()
        return data

    # ---------------------------------------------------------------- kernels

    async def compile(self, name: str, source: str, constants: dict | None, entry_point: str):
        self.device.pushErrorScope("validation")
        module = self.device.createShaderModule(_js_obj({"code": source, "label": name}))
        compute = {"module": module, "entryPoint": entry_point}
        if constants:
            compute["constants"] = _js_obj(constants)
        pipeline = await self.device.createComputePipelineAsync(
            _js_obj({"layout": "auto", "compute": _js_obj(compute), "label": f"{name}:{entry_point}"}))
        error = await self.device.popErrorScope()
        if error is not None:
            raise GPUError(f"compiling {name}.wgsl: {error.message}")
        return pipeline

    def bind(self, pipeline, buffers: list | dict):
        pairs = buffers.items() if isinstance(buffers, dict) else enumerate(buffers)
        entries = [_js_obj({"binding": i, "resource": _js_obj(resource(b))}) for i, b in pairs]
        self.js_crossings += 2 + len(entries)
        return self.device.createBindGroup(
            _js_obj({"layout": pipeline.getBindGroupLayout(0), "entries": to_js(entries)}))

    def submit(self, dispatches: list[tuple]) -> None:
        encoder = self.device.createCommandEncoder()
        cpass = encoder.beginComputePass()
        for pipeline, bind_group, workgroups in dispatches:
            cpass.setPipeline(pipeline)
            cpass.setBindGroup(0, bind_group)
            cpass.dispatchWorkgroups(*workgroups)
        cpass.end()
        self.device.queue.submit(to_js([encoder.finish()]))
        self.js_crossings += 5 + 3 * len(dispatches)

    async def done(self) -> None:
        self.js_crossings += 1
        await self.device.queue.onSubmittedWorkDone()

    async def time_dispatches(self, dispatches: list[tuple], repeats: int, runs: int) -> dict:
        """Where the device has timestamp-query: GPU timestamps at the start and end of one pass holding
        `repeats` copies of `dispatches` (Chrome rounds timestamps to 100 us unless its WebGPU developer
        features are on, so one pass of many spreads that rounding over them), `runs` samples; else the wall
        time of device.GpuDevice.time_dispatches. A figure, never a check."""
        if not self.device.features.has("timestamp-query"):
            return await super().time_dispatches(dispatches, repeats, runs)
        queries = self.device.createQuerySet(_js_obj({"type": "timestamp", "count": 2}))
        resolved = self.device.createBuffer(_js_obj({
            "size": 256, "usage": js.GPUBufferUsage.QUERY_RESOLVE | js.GPUBufferUsage.COPY_SRC, "label": "ticks"}))
        staging = self.buffer(16, "ticks.read", map_read=True)
        writes = _js_obj({"querySet": queries, "beginningOfPassWriteIndex": 0, "endOfPassWriteIndex": 1})
        self.submit(dispatches)
        await self.done()
        samples, walls = [], []
        try:
            for _ in range(runs):
                start = self.now_ms()
                encoder = self.device.createCommandEncoder()
                cpass = encoder.beginComputePass(_js_obj({"timestampWrites": writes}))
                for _ in range(repeats):
                    for pipeline, bind_group, workgroups in dispatches:
                        cpass.setPipeline(pipeline)
                        cpass.setBindGroup(0, bind_group)
                        cpass.dispatchWorkgroups(*workgroups)
                cpass.end()
                encoder.resolveQuerySet(queries, 0, 2, resolved, 0)
                encoder.copyBufferToBuffer(resolved, 0, staging, 0, 16)
                self.device.queue.submit(to_js([encoder.finish()]))
                await staging.mapAsync(js.GPUMapMode.READ)
                ticks = np.frombuffer(bytes(staging.getMappedRange(0, 16).to_py()), "<u8")
                staging.unmap()
                self.js_crossings += 10 + 3 * repeats * len(dispatches)
                walls.append((self.now_ms() - start) / repeats)
                samples.append(float(np.int64(ticks[1] - ticks[0])) / 1e6 / repeats)  # nanoseconds
        finally:
            queries.destroy()
            resolved.destroy()
            staging.destroy()
        if min(samples) <= 0:  # no usable timestamps from this implementation: the wall time says more
            return await super().time_dispatches(dispatches, repeats, runs)
        return {"timer": "gpu timestamps (one pass)", "median_ms": statistics.median(samples),
                "min_ms": min(samples), "samples_ms": samples, "wall_median_ms": statistics.median(walls)}

    def push_errors(self) -> None:
        self.device.pushErrorScope("validation")

    async def pop_errors(self, what: str) -> None:
        error = await self.device.popErrorScope()
        if error is not None:
            raise GPUError(f"{what}: {error.message}")

    def push_oom(self) -> None:
        self.device.pushErrorScope("out-of-memory")

    async def pop_oom(self, what: str) -> None:
        error = await self.device.popErrorScope()
        if error is not None:
            raise GPUError(f"the GPU ran out of memory while allocating {what}: {error.message}. "
                           "Lower the GPU budget (budget_mib) or close other GPU-heavy tabs.")

    def record_plan(self, passes: list[list[tuple]]):
        """A replayable plan: compute passes of (pipeline, bind_group) built once (web/replayer.js runs it)."""
        self.js_crossings += 1
        return _js_obj({"passes": to_js([[to_js(list(d)) for d in p] for p in passes])})

    def replay(self, plan, grids: np.ndarray, copies: np.ndarray, copy_src, copy_dst, *,
               read: tuple | None = None, feed: tuple | None = None):
        """One crossing: web/replayer.js encodes every dispatch of the step and submits it at once (the JS
        function runs synchronously up to its mapAsync); the returned coroutine awaits the read."""
        grids = np.ascontiguousarray(grids, dtype=np.int32)  # (n, 3)
        copies = np.ascontiguousarray(copies, dtype=np.int32)  # (m, 3)
        read_src, read_dst, read_bytes = read or (None, None, 0)
        feed_src, feed_dst, feed_bytes = feed or (None, None, 0)
        self.js_crossings += 1
        landing = js.pagedkvReplayer.step(self.device, plan, to_js(grids.reshape(-1)), to_js(copies.reshape(-1)),
                                          copy_src, copy_dst, read_src, read_dst, int(read_bytes),
                                          feed_src, feed_dst, int(feed_bytes))
        return self._landed(landing)

    async def _landed(self, landing) -> bytes | None:
        result = await landing
        if result is None:
            return None
        self.js_crossings += 1
        return result.to_bytes()

    @staticmethod
    def now_ms() -> float:
        """The page's monotonic clock (performance.now), in milliseconds."""
        return float(js.performance.now())
