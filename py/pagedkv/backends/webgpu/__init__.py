"""The WebGPU backend: the model forward as WGSL kernels over the paged KV cache.

interop.py is the only module here that imports `js` / `pyodide`; everything else is pure Python over its
GpuContext and runs (and is unit tested) under CPython. This package imports nothing on its own, so CPython
can import plan.py or kv_kernels.py without a browser.
"""
