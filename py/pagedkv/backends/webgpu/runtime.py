"""The WebGPU device of the runtime we run in: the browser's through Pyodide (interop.GpuContext) or wgpu-py's
under CPython (native.NativeDevice).

The one place that knows both implementations; device.py, the interface they implement, imports neither.
"""
from __future__ import annotations

import sys

from .device import GpuDevice


async def open_device(on_lost=None) -> GpuDevice:
    """The WebGPU device of this runtime: the browser's (Pyodide) or wgpu-py's (CPython); raises
    WebGPUUnavailable without an adapter."""
    if sys.platform == "emscripten":
        from ...browser.interop import GpuContext  # imports `js`: only in the browser

        return await GpuContext.create(on_lost=on_lost)
    from .native import NativeDevice  # imports wgpu when a device is opened

    return await NativeDevice.create(on_lost=on_lost)
