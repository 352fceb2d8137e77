"""Boot sequence of the in-tab app after the worker has loaded Pyodide, numpy and the wheels."""
from __future__ import annotations

import traceback

import numpy as np

import pagedkv
from pagedkv.backends import webgpu

from . import bridge

STAGES = ("download", "python", "numpy", "engine", "gpu")


def progress(stage: str, detail: str) -> None:
    bridge.post("progress", stage=stage, index=STAGES.index(stage), total=len(STAGES), detail=detail)


async def boot() -> None:
    """Request the WebGPU device from Python, run the self-test kernel, report `ready` or `error`."""
    try:
        progress("engine", f"pagedkv {pagedkv.__version__} with numpy {np.__version__}")
        progress("gpu", "requesting a WebGPU adapter")
        ctx = await webgpu.GpuContext.create(on_lost=lambda reason: bridge.post("device-lost", reason=reason))
        progress("gpu", f"adapter {ctx.info.name}: running the self-test kernel")
        check = await webgpu.self_test(ctx)
        bridge.post(
            "ready",
            engine=pagedkv.__version__,
            numpy=np.__version__,
            adapter={
                "name": ctx.info.name,
                "vendor": ctx.info.vendor,
                "architecture": ctx.info.architecture,
                "description": ctx.info.description,
                "limits": ctx.info.limits,
                "features": list(ctx.info.features),
            },
            selftest=check,
        )
    except webgpu.WebGPUUnavailable as exc:
        bridge.post("error", kind="no-webgpu", message=str(exc))
    except Exception as exc:  # reported to the page, never swallowed
        bridge.post("error", kind="internal", message=f"{type(exc).__name__}: {exc}",
                    detail=traceback.format_exc())
