"""The browser's kernel and model tests, run again under CPython on wgpu-py (lavapipe here): a second WebGPU
implementation (naga over Vulkan instead of Chrome's Tint over SwiftShader) for the same WGSL and host code.

The browser tests send Python snippets to the page's worker (`ready_page.py(code)`). Here `ready_page` is a
NativeWorker that runs the same snippets in this process, on a wgpu-py device, so the test functions, their
cases (tests/browser/*_cases.py) and their bounds are the browser's own, imported, not copied.
No adapter is a failure with what to install, never a skip.
"""
from __future__ import annotations

import pytest

from native_harness import LoopThread, NativeWorker


@pytest.fixture(scope="session")
def native_loop():
    """An event loop of its own thread: the browser tests' Playwright (sync API) keeps a loop running in the
    main thread for the whole session, and a second loop cannot run there."""
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def native_device(native_loop):
    """A wgpu-py device (open_device under CPython); the cases open their own the same way."""
    from pagedkv.backends.webgpu.device import WebGPUUnavailable
    from pagedkv.backends.webgpu.runtime import open_device

    try:
        return native_loop.run(open_device())
    except ImportError as exc:
        pytest.fail(f"wgpu-py is missing ({exc}): pip install -r requirements-dev.txt", pytrace=False)
    except WebGPUUnavailable as exc:
        pytest.fail(f"{exc} (npm test installs mesa-vulkan-drivers when it runs as root)", pytrace=False)


@pytest.fixture(scope="session")
def dist_models():
    """dist/ with its models (the engine cases read them from there), built when missing."""
    import build

    if not (build.DIST / "models" / "tiny-random" / "model.json").exists():
        build.build()
    return build.DIST / "models"


@pytest.fixture(scope="module")
def ready_page(native_loop, native_device, dist_models):
    """A fresh worker per test module; the cases open their own device with open_device(), as in the page
    (native_device first makes a missing adapter fail loudly)."""
    return NativeWorker(native_loop)
