"""The WebGPU device interface the rest of backends/webgpu is written against, and what both of its
implementations share.

GpuDevice is the whole vocabulary (a thin host layer in the spirit of gpu.cpp):
  device      info (AdapterInfo), lost_reason, done(), now_ms()
  buffers     buffer(), upload(), write(), read(), read_array()
  pipelines   kernel() compiles a shader once per constant set (ShaderLibrary: files, includes, variants)
  dispatch    bind(), submit(), dispatch(); record_plan() + replay() for a whole step; time_dispatches()
  errors      push_errors() / pop_errors(), push_oom() / pop_oom()
Two implementations: interop.GpuContext (the browser's WebGPU through Pyodide's JS interop; a step is one
crossing into web/replayer.js) and native.NativeDevice (wgpu-py under CPython; a step is replayed in Python
into one command encoder; runtime.open_device picks the one this runtime has). backend.py, plan.py and the
kernels' host code see only this interface.
"""
from __future__ import annotations

import abc
import hashlib
import json
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from .shader_variants import VARIANTS

# Limits we ask the device for, at the adapter's real value (the defaults are smaller).
REQUESTED_LIMITS = ("maxBufferSize", "maxStorageBufferBindingSize", "maxComputeWorkgroupStorageSize",
                    "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX",
                    "maxStorageBuffersPerShaderStage", "maxComputeWorkgroupsPerDimension")

# A shader line `//#include other.wgsl` is replaced by that file's text (WGSL has no include of its own).
_INCLUDE = re.compile(r"^//#include ([A-Za-z0-9_]+)\.wgsl[ \t]*$", re.MULTILINE)


class WebGPUUnavailable(RuntimeError):
    """No usable WebGPU adapter; the message says what the user can do."""


class GPUError(RuntimeError):
    """A WebGPU validation / out-of-memory error reported by the device."""


@dataclass(frozen=True)
class AdapterInfo:
    vendor: str
    architecture: str
    description: str
    limits: dict  # REQUESTED_LIMITS -> the adapter's value
    features: tuple[str, ...]
    backend: str = ""  # the native API under the adapter (Vulkan, Metal, D3D12) where it is known

    @property
    def name(self) -> str:
        parts = [p for p in (self.vendor, self.architecture, self.description) if p]
        return " / ".join(parts) or "unknown adapter"


def resource(binding) -> dict:
    """A bind group resource: a whole buffer, or a (buffer, offset, size) range of one."""
    if isinstance(binding, tuple):
        buffer, offset, size = binding
        return {"buffer": buffer, "offset": int(offset), "size": int(size)}
    return {"buffer": binding}


def padded(nbytes: int) -> int:
    """Bytes of a buffer holding nbytes: a multiple of 16, at least 16 (uniform buffers need both)."""
    return max(16, (nbytes + 15) // 16 * 16)


class ShaderLibrary:
    """WGSL sources by name, checked against a manifest (name -> {file, sha256}) where there is one.

    A name in shader_variants.VARIANTS (`matvec_gpu_sg_q4_K`, ...) is composed from its part files; any other
    name is a file of its own. `//#include name.wgsl` lines are expanded, so kernels can share a fragment of
    helpers. `read(path)` returns a file's bytes: the page fetches dist/shaders/ (whose manifest.json
    build.py writes); native runs read the repo's shaders/, where the manifest is the directory itself
    (`manifest` given).
    """

    def __init__(self, read: Callable[[str], Awaitable[bytes]], manifest: dict | None = None) -> None:
        self._read = read
        self._manifest = manifest
        self._sources: dict[str, str] = {}

    async def source(self, name: str) -> str:
        if name not in self._sources:
            variant = VARIANTS.get(name)
            if variant is None:
                self._sources[name] = await self._file(name)
            else:
                self._sources[name] = variant.compose(name, [await self.source(part) for part in variant.all_parts])
        return self._sources[name]

    async def _file(self, name: str) -> str:
        """shaders/<name>.wgsl, checked against the manifest, its includes expanded."""
        if self._manifest is None:
            self._manifest = json.loads(await self._read("manifest.json"))
        entry = self._manifest.get(name)
        if entry is None:
            raise KeyError(f"no shader named {name!r}; known: {sorted([*self._manifest, *VARIANTS])}")
        data = await self._read(entry["file"])
        if "sha256" in entry:
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry["sha256"]:
                raise RuntimeError(f"shader {entry['file']} sha256 {digest} != manifest {entry['sha256']}")
        text = data.decode("utf-8")
        for included in set(_INCLUDE.findall(text)):
            if included == name:
                raise RuntimeError(f"shader {name}.wgsl includes itself")
            body = await self.source(included)
            text = re.sub(rf"^//#include {included}\.wgsl[ \t]*$", lambda _: body, text, flags=re.MULTILINE)
        return text


class GpuDevice(abc.ABC):
    """Adapter + device + compiled kernels; subclasses implement the device calls (see the module doc)."""

    js_crossings = 0  # Python->JS crossings so far (the browser counts them; a native device has none)

    def __init__(self, info: AdapterInfo, shaders: ShaderLibrary) -> None:
        self.info = info
        self.shaders = shaders
        self.lost_reason: str | None = None
        self._pipelines: dict[tuple, object] = {}

    # ---------------------------------------------------------------- implemented by each device

    @abc.abstractmethod
    def buffer(self, nbytes: int, label: str, *, readable: bool = False, uniform: bool = False,
               map_read: bool = False):
        """A device buffer: storage (default), uniform, or a MAP_READ landing buffer for read backs."""

    @abc.abstractmethod
    def write(self, buffer, array: np.ndarray, offset: int = 0) -> None:
        """Copy `array`'s bytes into `buffer` at byte `offset` (queued before the next submit)."""

    @abc.abstractmethod
    async def read(self, buffer, nbytes: int) -> bytes:
        """The first `nbytes` of `buffer`, once the GPU has written them."""

    @abc.abstractmethod
    async def compile(self, name: str, source: str, constants: dict | None, entry_point: str):
        """A compute pipeline of WGSL `source`; raises GPUError when it does not compile."""

    @abc.abstractmethod
    def bind(self, pipeline, buffers: list | dict):
        """A bind group with `buffers` at @group(0) @binding(0..n-1) (or {binding: buffer}); build once,
        dispatch many times."""

    @abc.abstractmethod
    def submit(self, dispatches: list[tuple]) -> None:
        """Run (pipeline, bind_group, (x, y, z) workgroups) dispatches in order: one pass, one submit.

        Dispatches in one pass see each other's storage writes in order (WebGPU synchronises them).
        """

    @abc.abstractmethod
    async def done(self) -> None:
        """Wait until the GPU has finished everything submitted so far."""

    @abc.abstractmethod
    def push_errors(self) -> None:
        """Start catching validation errors; pair with `await pop_errors(what)`."""

    @abc.abstractmethod
    async def pop_errors(self, what: str) -> None:
        """Raise GPUError if anything since push_errors() failed validation."""

    @abc.abstractmethod
    def push_oom(self) -> None:
        """Start catching out-of-memory errors of buffer creation; pair with `await pop_oom(what)`."""

    @abc.abstractmethod
    async def pop_oom(self, what: str) -> None:
        """Raise GPUError if a buffer created since push_oom() could not be allocated."""

    @abc.abstractmethod
    def record_plan(self, passes: list[list[tuple]]):
        """A replayable plan: compute passes of (pipeline, bind_group) built once."""

    @abc.abstractmethod
    def replay(self, plan, grids: np.ndarray, copies: np.ndarray, copy_src, copy_dst, *,
               read: tuple | None = None, feed: tuple | None = None) -> Awaitable[bytes | None]:
        """Encode one step of `plan` in one command encoder and submit it before returning: the feed copy first
        when given ((src, dst, bytes): the previous step's drawn ids into this step's token ids, on the GPU),
        then the passes with their per-dispatch workgroup grids (n, 3) int32 (x = 0 skips a dispatch) and
        (m, 3) int32 (src offset, dst offset, bytes) copies between pass 0 and pass 1, then the read copy
        ((src, MAP_READ dst, bytes)). Returns an awaitable of the read's bytes (None without a read): a caller
        may submit the next step before it awaits this one's (a pipelined decode, decode_chain.py)."""

    @staticmethod
    def now_ms() -> float:
        """A monotonic clock in milliseconds."""
        return time.perf_counter() * 1e3

    # ---------------------------------------------------------------- shared

    async def kernel(self, name: str, constants: dict | None = None, entry_point: str = "main"):
        """Compile `shaders/<name>.wgsl` once per constant set and entry point; errors raise GPUError."""
        key = (name, entry_point, tuple(sorted((constants or {}).items())))
        if key not in self._pipelines:
            self._pipelines[key] = await self.compile(name, await self.shaders.source(name), constants, entry_point)
        return self._pipelines[key]

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

    async def time_dispatches(self, dispatches: list[tuple], repeats: int, runs: int) -> dict:
        """Milliseconds per submit of `dispatches` (one pass): `runs` samples of `repeats` submits each,
        after one warm-up submit. This default is the wall time of the submits and a wait for the queue;
        a device with GPU timestamps overrides it. A figure, never a check."""
        self.submit(dispatches)
        await self.done()
        samples = []
        for _ in range(runs):
            start = self.now_ms()
            for _ in range(repeats):
                self.submit(dispatches)
            await self.done()
            samples.append((self.now_ms() - start) / repeats)
        return {"timer": "wall (submit + wait)", "median_ms": statistics.median(samples), "min_ms": min(samples),
                "samples_ms": samples}
