"""The WebGPU backend: the model forward as WGSL kernels over the paged KV cache.

Everything here is written against device.GpuDevice, which has two implementations: pagedkv.browser.interop
(the browser; the browser/ package holds the engine's only modules that import `js` / `pyodide`) and
native.py (wgpu-py under CPython, imported only when a native device is opened). This package imports nothing on its own, so CPython can import plan.py or
kv_kernels.py without a browser or wgpu-py.
"""
