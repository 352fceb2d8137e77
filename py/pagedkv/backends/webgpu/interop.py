"""Browser WebGPU interop: the ONLY engine module that imports `js` / `pyodide` (the app's UI bridge
imports its site fetch from here).

A thin host layer in the spirit of gpu.cpp. GpuContext is the whole vocabulary the rest of
backends/webgpu uses, so a second implementation (native, on wgpu-py) can stand beside it:
  device      create() (adapter + device at the adapter's real limits), info, lost_reason, done(), now_ms()
  buffers     buffer(), upload(), write(), read(), read_array()
  pipelines   kernel() compiles shaders/<name>.wgsl once per constant set (ShaderLibrary expands includes)
  dispatch    bind(), submit(), dispatch(); record_plan() + replay() for a whole step (web/replayer.js)
  errors      push_errors() / pop_errors(), push_oom() / pop_oom(): every error scope lives here
It only works inside Pyodide in a browser (window or worker) that exposes `navigator.gpu`.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

import numpy as np

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_once_callable, to_js  # type: ignore[import-not-found]

# Limits we ask the device for, at the adapter's real value (the defaults are smaller).
REQUESTED_LIMITS = ("maxBufferSize", "maxStorageBufferBindingSize", "maxComputeWorkgroupStorageSize",
                    "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX",
                    "maxStorageBuffersPerShaderStage", "maxComputeWorkgroupsPerDimension")

# A shader line `//#include other.wgsl` is replaced by that file's text (WGSL has no include of its own).
_INCLUDE = re.compile(r"^//#include ([A-Za-z0-9_]+)\.wgsl[ \t]*$", re.MULTILINE)


class WebGPUUnavailable(RuntimeError):
    """The browser has no usable WebGPU adapter; the message says what the user can do."""


class GPUError(RuntimeError):
    """A WebGPU validation / out-of-memory error reported by an error scope."""


@dataclass(frozen=True)
class AdapterInfo:
    vendor: str
    architecture: str
    description: str
    limits: dict
    features: tuple[str, ...]

    @property
    def name(self) -> str:
        parts = [p for p in (self.vendor, self.architecture, self.description) if p]
        return " / ".join(parts) or "unknown adapter"


def _js_obj(value: dict):
    return to_js(value, dict_converter=js.Object.fromEntries)


def _resource(binding) -> dict:
    """A bind group resource: a whole buffer, or a (buffer, offset, size) range of one."""
    if isinstance(binding, tuple):
        buffer, offset, size = binding
        return {"buffer": buffer, "offset": int(offset), "size": int(size)}
    return {"buffer": binding}


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


class ShaderLibrary:
    """WGSL sources by name, checked against dist/shaders/manifest.json (name -> sha256).

    `//#include name.wgsl` lines are expanded, so kernels can share a fragment of helpers.
    """

    def __init__(self) -> None:
        self._manifest: dict | None = None
        self._sources: dict[str, str] = {}

    async def source(self, name: str) -> str:
        if name in self._sources:
            return self._sources[name]
        if self._manifest is None:
            self._manifest = json.loads(await fetch_bytes("shaders/manifest.json"))
        entry = self._manifest.get(name)
        if entry is None:
            raise KeyError(f"no shader named {name!r}; known: {sorted(self._manifest)}")
        data = await fetch_bytes("shaders/" + entry["file"])
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            raise RuntimeError(f"shader {entry['file']} sha256 {digest} != manifest {entry['sha256']}")
        text = data.decode("utf-8")
        for included in set(_INCLUDE.findall(text)):
            if included == name:
                raise RuntimeError(f"shader {name}.wgsl includes itself")
            body = await self.source(included)
            text = re.sub(rf"^//#include {included}\.wgsl[ \t]*$", lambda _: body, text, flags=re.MULTILINE)
        self._sources[name] = text
        return text


class GpuContext:
    """Adapter + device + compiled kernels. Create with `await GpuContext.create()`."""

    def __init__(self, adapter, device, info: AdapterInfo) -> None:
        self.adapter = adapter
        self.device = device
        self.info = info
        self.shaders = ShaderLibrary()
        self._pipelines: dict[tuple, object] = {}
        self.lost_reason: str | None = None
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
        wanted = [f for f in ("subgroups",) if f in features]  # the gpu kernel family's reductions use them
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
        """A device buffer: storage (default), uniform, or a MAP_READ landing buffer for read backs."""
        if map_read:
            usage = js.GPUBufferUsage.MAP_READ | js.GPUBufferUsage.COPY_DST
        else:
            usage = js.GPUBufferUsage.COPY_DST | js.GPUBufferUsage.COPY_SRC
            usage |= js.GPUBufferUsage.UNIFORM if uniform else js.GPUBufferUsage.STORAGE
        size = max(16, (nbytes + 15) // 16 * 16)
        return self.device.createBuffer(_js_obj({"size": size, "usage": usage, "label": label}))

    def write(self, buffer, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        self.js_crossings += 1
        self.device.queue.writeBuffer(buffer, offset, to_js(memoryview(data).cast("B")))

    async def read(self, buffer, nbytes: int) -> bytes:
        staging = self.device.createBuffer(_js_obj({
            "size": max(16, (nbytes + 15) // 16 * 16),
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

    async def kernel(self, name: str, constants: dict | None = None, entry_point: str = "main"):
        """Compile `shaders/<name>.wgsl` once per constant set and entry point; validation errors raise GPUError."""
        key = (name, entry_point, tuple(sorted((constants or {}).items())))
        if key in self._pipelines:
            return self._pipelines[key]
        source = await self.shaders.source(name)
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
        self._pipelines[key] = pipeline
        return pipeline

    def bind(self, pipeline, buffers: list | dict):
        """A bind group with `buffers` at @group(0) @binding(0..n-1) (or {binding: buffer}); build once,
        dispatch many times."""
        pairs = buffers.items() if isinstance(buffers, dict) else enumerate(buffers)
        entries = [_js_obj({"binding": i, "resource": _js_obj(_resource(b))}) for i, b in pairs]
        self.js_crossings += 2 + len(entries)
        return self.device.createBindGroup(
            _js_obj({"layout": pipeline.getBindGroupLayout(0), "entries": to_js(entries)}))

    def submit(self, dispatches: list[tuple]) -> None:
        """Run (pipeline, bind_group, (x, y, z) workgroups) dispatches in order: one pass, one submit.

        Dispatches in one pass see each other's storage writes in order (WebGPU synchronises them).
        """
        encoder = self.device.createCommandEncoder()
        cpass = encoder.beginComputePass()
        for pipeline, bind_group, workgroups in dispatches:
            cpass.setPipeline(pipeline)
            cpass.setBindGroup(0, bind_group)
            cpass.dispatchWorkgroups(*workgroups)
        cpass.end()
        self.device.queue.submit(to_js([encoder.finish()]))
        self.js_crossings += 5 + 3 * len(dispatches)

    def dispatch(self, pipeline, buffers: list, workgroups: tuple[int, int, int]) -> None:
        """Bind `buffers` to @group(0) @binding(0..n-1) and run one compute pass in one submit."""
        self.submit([(pipeline, self.bind(pipeline, buffers), workgroups)])

    def upload(self, array: np.ndarray, label: str, *, uniform: bool = False):
        """A new buffer holding `array`'s bytes."""
        buf = self.buffer(array.nbytes, label, uniform=uniform)
        self.write(buf, array)
        return buf

    async def read_array(self, buffer, dtype, shape: tuple) -> np.ndarray:
        """Read `buffer` back as a numpy array of `shape` and `dtype`."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        return np.frombuffer(await self.read(buffer, nbytes), dtype=dtype).reshape(shape).copy()

    async def done(self) -> None:
        """Wait until the GPU has finished everything submitted so far."""
        self.js_crossings += 1
        await self.device.queue.onSubmittedWorkDone()

    def push_errors(self) -> None:
        """Start catching validation errors; pair with `await pop_errors(what)`."""
        self.device.pushErrorScope("validation")

    async def pop_errors(self, what: str) -> None:
        """Raise GPUError if anything since push_errors() failed validation."""
        error = await self.device.popErrorScope()
        if error is not None:
            raise GPUError(f"{what}: {error.message}")

    def push_oom(self) -> None:
        """Start catching out-of-memory errors of buffer creation; pair with `await pop_oom(what)`."""
        self.device.pushErrorScope("out-of-memory")

    async def pop_oom(self, what: str) -> None:
        """Raise GPUError if a buffer created since push_oom() could not be allocated."""
        error = await self.device.popErrorScope()
        if error is not None:
            raise GPUError(f"the GPU ran out of memory while allocating {what}: {error.message}. "
                           "Lower the GPU budget (budget_mib) or close other GPU-heavy tabs.")

    def record_plan(self, passes: list[list[tuple]]):
        """A replayable plan: compute passes of (pipeline, bind_group) built once (web/replayer.js runs it)."""
        self.js_crossings += 1
        return _js_obj({"passes": to_js([[to_js(list(d)) for d in p] for p in passes])})

    async def replay(self, plan, grids: np.ndarray, copies: np.ndarray, copy_src, copy_dst,
                     read_src=None, read_dst=None, read_bytes: int = 0) -> bytes | None:
        """Encode and submit one step of `plan` in one command encoder (one crossing), with its per-dispatch
        workgroup grids (n, 3) int32 (x = 0 skips a dispatch) and (m, 3) int32 (src offset, dst offset, bytes)
        copies between pass 0 and pass 1; returns read_bytes of read_src (via MAP_READ read_dst) if asked."""
        grids = np.ascontiguousarray(grids, dtype=np.int32)  # (n, 3)
        copies = np.ascontiguousarray(copies, dtype=np.int32)  # (m, 3)
        self.js_crossings += 1
        result = await js.pagedkvReplayer.step(self.device, plan, to_js(grids.reshape(-1)), to_js(copies.reshape(-1)),
                                               copy_src, copy_dst, read_src, read_dst, int(read_bytes))
        if result is None:
            return None
        self.js_crossings += 1
        return result.to_bytes()

    @staticmethod
    def now_ms() -> float:
        """The page's monotonic clock (performance.now), in milliseconds."""
        return float(js.performance.now())
