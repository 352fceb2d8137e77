"""Native WebGPU: device.GpuDevice over wgpu-py (wgpu-native: naga over Vulkan / Metal / D3D12) under CPython.

The same WGSL (read from the repo's shaders/, includes expanded by device.ShaderLibrary), the same backend,
plan and kernels' host code as in the browser. A step's plan is replayed here in Python into one command
encoder and one submit. wgpu-py raises a device error from the call that caused it, as wgpu.GPUError; the
calls here turn it into device.GPUError with what was being done, and an error the device reports outside a
call (wgpu-py logs those) is raised by the next pop_errors() / pop_oom(), so none is lost.

The methods keep the browser's async signatures, but wait synchronously (map_sync, queue.read_buffer):
awaiting wgpu-py's promises polls with a back-off of up to 10 ms, which would be added to every step.
Imports wgpu only when a NativeDevice is created: CPython without wgpu-py runs everything else.
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
import time
from pathlib import Path

import numpy as np

from .device import (REQUESTED_LIMITS, AdapterInfo, GPUError, GpuDevice, ShaderLibrary, WebGPUUnavailable, padded,
                     resource)

SHADERS = Path(__file__).resolve().parents[4] / "shaders"  # the repo's shaders/ (py/pagedkv/backends/webgpu/..)
# Asked for when the adapter has them: kernel timing, the gpu kernel family's subgroup reductions and f16 math.
OPTIONAL_FEATURES = ("timestamp-query", "subgroup", "shader-f16")
# wgpu-native names some features its own way; the engine reads the WebGPU standard's names.
STANDARD_FEATURE_NAMES = {"subgroup": "subgroups"}
ENABLE_SUBGROUPS = "enable subgroups;"
NO_ADAPTER = ("wgpu-py found no GPU adapter. It needs a Vulkan, Metal or D3D12 driver: on Linux install one "
              "(`apt-get install mesa-vulkan-drivers` gives lavapipe, a CPU Vulkan; a GPU's own driver ships "
              "its Vulkan ICD) and the Vulkan loader (libvulkan1).")


def _kebab(name: str) -> str:
    """WebGPU's JS limit names are camelCase; wgpu-py spells them in kebab-case."""
    return "".join("-" + c.lower() if c.isupper() else c for c in name)


def repo_shaders(root: Path = SHADERS) -> ShaderLibrary:
    """The shaders of `root` (default: the repo's shaders/); a manifest.json there (dist/shaders/) is checked."""
    manifest = None if (root / "manifest.json").is_file() else {
        p.stem: {"file": p.name} for p in sorted(root.glob("*.wgsl"))}

    async def read(name: str) -> bytes:
        return (root / name).read_bytes()

    return ShaderLibrary(read, manifest)


class _LoggedErrors(logging.Handler):
    """Device errors that wgpu-py logs (those reported outside any API call), kept until the next pop."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def take(self) -> list[str]:
        messages, self.messages = self.messages, []
        return messages


@dataclass
class _StepTimer:
    """NativeDevice.time_steps' state: a timestamp pair a replay, `stamped` of `steps` taken so far."""

    queries: object  # GPUQuerySet, 2 * steps timestamps
    resolved: object  # GPUBuffer, 8 bytes a timestamp
    steps: int
    stamped: int = 0


class NativeDevice(GpuDevice):
    """wgpu-py's adapter + device. Create with `await NativeDevice.create()`."""

    def __init__(self, wgpu, adapter, device, info: AdapterInfo, shaders: ShaderLibrary) -> None:
        super().__init__(info, shaders)
        self.wgpu = wgpu
        self.adapter = adapter
        self.device = device
        self._fence = None  # a 16-byte buffer that done() reads back
        self._step_timer: _StepTimer | None = None  # while time_steps() runs
        self._errors = _LoggedErrors()
        logging.getLogger("wgpu").addHandler(self._errors)

    @classmethod
    async def create(cls, on_lost=None, shaders: ShaderLibrary | None = None) -> "NativeDevice":
        import wgpu

        if on_lost is not None:
            raise ValueError("wgpu-py 0.32 does not report a lost device (its `lost` promise is not implemented); "
                             "a lost native device raises GPUError from its next call instead")
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        except RuntimeError as exc:
            raise WebGPUUnavailable(f"{NO_ADAPTER} ({exc})") from exc
        if adapter is None:
            raise WebGPUUnavailable(NO_ADAPTER)
        limits = {name: int(adapter.limits[_kebab(name)]) for name in REQUESTED_LIMITS}
        raw = adapter.info
        info = AdapterInfo(vendor=str(raw.get("vendor", "")), architecture=str(raw.get("architecture", "")),
                           description=str(raw.get("device", "") or raw.get("description", "")), limits=limits,
                           features=tuple(sorted(STANDARD_FEATURE_NAMES.get(f, f) for f in adapter.features)),
                           backend=str(raw.get("backend_type", "")))
        device = adapter.request_device_sync(
            required_features=[f for f in OPTIONAL_FEATURES if f in adapter.features],
            required_limits={_kebab(name): value for name, value in limits.items()})
        ctx = cls(wgpu, adapter, device, info, shaders or repo_shaders())
        return ctx

    def _raise_logged(self, what: str) -> None:
        messages = self._errors.take()
        if messages:
            raise GPUError(f"{what}: " + "\n".join(messages))

    # ---------------------------------------------------------------- buffers

    def buffer(self, nbytes: int, label: str, *, readable: bool = False, uniform: bool = False,
               map_read: bool = False):
        usage = self.wgpu.BufferUsage
        if map_read:
            flags = usage.MAP_READ | usage.COPY_DST
        else:
            flags = usage.COPY_DST | usage.COPY_SRC | (usage.UNIFORM if uniform else usage.STORAGE)
        try:
            return self.device.create_buffer(size=padded(nbytes), usage=flags, label=label)
        except self.wgpu.GPUError as exc:
            raise GPUError(f"creating buffer {label!r} of {nbytes:,} bytes: {exc}") from exc

    def write(self, buffer, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        self.device.queue.write_buffer(buffer, offset, memoryview(data).cast("B"))

    async def read(self, buffer, nbytes: int) -> bytes:
        return bytes(self.device.queue.read_buffer(buffer, 0, padded(nbytes))[:nbytes])

    # ---------------------------------------------------------------- kernels

    async def compile(self, name: str, source: str, constants: dict | None, entry_point: str):
        # Naga (wgpu-native 25) compiles subgroup builtins once the device has the feature, but refuses the
        # standard's `enable subgroups;` directive that Tint requires; the rest of the source is unchanged.
        source = source.replace(ENABLE_SUBGROUPS, "")
        compute = {"module": None, "entry_point": entry_point}
        if constants:
            compute["constants"] = dict(constants)
        try:
            compute["module"] = self.device.create_shader_module(code=source, label=name)
            return self.device.create_compute_pipeline(layout="auto", compute=compute, label=f"{name}:{entry_point}")
        except self.wgpu.GPUError as exc:
            raise GPUError(f"compiling {name}.wgsl: {exc}") from exc

    def bind(self, pipeline, buffers: list | dict):
        pairs = buffers.items() if isinstance(buffers, dict) else enumerate(buffers)
        entries = [{"binding": i, "resource": resource(b)} for i, b in pairs]
        try:
            return self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        except self.wgpu.GPUError as exc:
            raise GPUError(f"binding {pipeline.label}: {exc}") from exc

    def _encode(self, encoder, dispatches, timestamp_writes=None) -> None:
        cpass = encoder.begin_compute_pass(timestamp_writes=timestamp_writes)
        for pipeline, bind_group, (x, y, z) in dispatches:
            if x == 0:  # a plan's skipped dispatch
                continue
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, bind_group)
            cpass.dispatch_workgroups(int(x), int(y), int(z))
        cpass.end()

    def _finish(self, encoder, what: str) -> None:
        try:
            self.device.queue.submit([encoder.finish()])
        except self.wgpu.GPUError as exc:
            raise GPUError(f"{what}: {exc}") from exc

    def submit(self, dispatches: list[tuple]) -> None:
        encoder = self.device.create_command_encoder()
        self._encode(encoder, dispatches)
        self._finish(encoder, "submitting " + ", ".join(sorted({p.label for p, _, _ in dispatches})))

    async def done(self) -> None:
        # wgpu-py 0.32's on_submitted_work_done_* fail (a callback signature mismatch with wgpu-native), so
        # wait by reading a small buffer back: its copy runs after everything submitted before it.
        if self._fence is None:
            self._fence = self.buffer(16, "fence")
        self.device.queue.read_buffer(self._fence, 0, 16)

    # ---------------------------------------------------------------- errors

    def push_errors(self) -> None:
        self._raise_logged("an earlier device error")

    async def pop_errors(self, what: str) -> None:
        self._raise_logged(what)

    def push_oom(self) -> None:
        self._raise_logged("an earlier device error")

    async def pop_oom(self, what: str) -> None:
        self._raise_logged(f"allocating {what}")

    # ---------------------------------------------------------------- plans

    def record_plan(self, passes: list[list[tuple]]):
        return [list(p) for p in passes]

    def replay(self, plan, grids: np.ndarray, copies: np.ndarray, copy_src, copy_dst, *,
               read: tuple | None = None, feed: tuple | None = None):
        grids = np.asarray(grids, dtype=np.int32).tolist()  # (n, 3)
        encoder = self.device.create_command_encoder()
        if feed is not None:
            encoder.copy_buffer_to_buffer(feed[0], 0, feed[1], 0, feed[2])
        stamps = self._next_step_stamps(len(plan))  # (n passes,) timestamp writes or None
        d = 0
        for p, dispatches in enumerate(plan):
            if p > 0:
                for src, dst, nbytes in np.asarray(copies, dtype=np.int64).tolist():  # (m, 3)
                    encoder.copy_buffer_to_buffer(copy_src, src, copy_dst, dst, nbytes)
            self._encode(encoder, [(pipe, group, grids[d + i]) for i, (pipe, group) in enumerate(dispatches)],
                         stamps[p])
            d += len(dispatches)
        if read is not None:
            encoder.copy_buffer_to_buffer(read[0], 0, read[1], 0, read[2])
        self._finish(encoder, "replaying a step plan")
        return self._landed(read)

    async def _landed(self, read: tuple | None) -> bytes | None:
        """The read's bytes, mapped when awaited (map_sync waits for the queue: the submit ran before)."""
        if read is None:
            return None
        _, dst, nbytes = read
        dst.map_sync(self.wgpu.MapMode.READ, 0, nbytes)
        try:
            return bytes(dst.read_mapped(0, nbytes, copy=False))
        finally:
            dst.unmap()

    # ---------------------------------------------------------------- timing

    def time_steps(self, steps: int) -> None:
        """GPU-time the next `steps` replays, each from its first pass's start to its last pass's end (the
        copies between its passes included; the writes before it and its read after not): step_times_ms()
        returns them. Needs timestamp-query (AdapterInfo.features)."""
        if "timestamp-query" not in self.device.features:
            raise GPUError("timing steps on the GPU needs the adapter's timestamp-query feature; this one lacks it")
        usage = self.wgpu.BufferUsage.QUERY_RESOLVE | self.wgpu.BufferUsage.COPY_SRC
        self._step_timer = _StepTimer(self.device.create_query_set(type=self.wgpu.QueryType.timestamp,
                                                                   count=2 * steps),
                                      self.device.create_buffer(size=16 * steps, usage=usage), steps)

    def _next_step_stamps(self, passes: int) -> list:
        """Each pass's timestamp_writes for this replay: the first pass's start and the last's end while
        time_steps() has steps left, else None for every pass."""
        stamps = [None] * passes
        timer = self._step_timer
        if timer is None or timer.stamped == timer.steps:
            return stamps
        queries, i = timer.queries, timer.stamped
        timer.stamped += 1
        if passes == 1:
            stamps[0] = {"query_set": queries, "beginning_of_pass_write_index": 2 * i,
                         "end_of_pass_write_index": 2 * i + 1}
        else:
            stamps[0] = {"query_set": queries, "beginning_of_pass_write_index": 2 * i}
            stamps[-1] = {"query_set": queries, "end_of_pass_write_index": 2 * i + 1}
        return stamps

    async def step_times_ms(self) -> list[float]:
        """The steps time_steps() asked for, in milliseconds (GPU timestamps); ends the timing."""
        if self._step_timer is None:
            raise GPUError("step_times_ms() without time_steps() first")
        timer, self._step_timer = self._step_timer, None
        try:
            if timer.stamped != timer.steps:
                raise GPUError(f"time_steps({timer.steps}) saw {timer.stamped} replays")
            encoder = self.device.create_command_encoder()
            encoder.resolve_query_set(timer.queries, 0, 2 * timer.steps, timer.resolved, 0)
            self._finish(encoder, "resolving step timestamps")
            ticks = np.frombuffer(self.device.queue.read_buffer(timer.resolved), np.uint64).reshape(timer.steps, 2)
        finally:
            timer.queries.destroy()
            timer.resolved.destroy()
        return ((ticks[:, 1] - ticks[:, 0]).astype(np.float64) / 1e6).tolist()  # WebGPU resolves nanoseconds

    async def time_dispatches(self, dispatches: list[tuple], repeats: int, runs: int) -> dict:
        """GPU timestamps at the start and end of each pass (one pass per submit) where the adapter has
        timestamp-query, else the wall time of device.GpuDevice.time_dispatches."""
        if "timestamp-query" not in self.device.features:
            return await super().time_dispatches(dispatches, repeats, runs)
        wgpu = self.wgpu
        count = 2 * repeats
        queries = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=count)
        resolved = self.device.create_buffer(size=8 * count, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                             | wgpu.BufferUsage.COPY_SRC)
        self.submit(dispatches)
        await self.done()
        samples, walls = [], []
        try:
            for _ in range(runs):
                start = time.perf_counter()
                encoder = self.device.create_command_encoder()
                for i in range(repeats):
                    self._encode(encoder, dispatches, {"query_set": queries, "beginning_of_pass_write_index": 2 * i,
                                                       "end_of_pass_write_index": 2 * i + 1})
                encoder.resolve_query_set(queries, 0, count, resolved, 0)
                self._finish(encoder, "timing dispatches")
                ticks = np.frombuffer(self.device.queue.read_buffer(resolved), np.uint64).reshape(repeats, 2)
                walls.append((time.perf_counter() - start) * 1e3 / repeats)
                # WebGPU resolves timestamps in nanoseconds.
                samples.append(float((ticks[:, 1] - ticks[:, 0]).astype(np.float64).mean()) / 1e6)
        finally:
            queries.destroy()
            resolved.destroy()
        return {"timer": "gpu timestamps", "median_ms": statistics.median(samples), "min_ms": min(samples),
                "samples_ms": samples, "wall_median_ms": statistics.median(walls)}
