"""The engine's browser edge: modules that import `js` / `pyodide` and run only in the page's worker.

    interop.py  the browser's WebGPU device (GpuContext, backends.webgpu.device.GpuDevice over navigator.gpu),
                site fetches, the tab's wasm kernels
    opfs.py     the origin private file system as a file_store.FileStore (block files, tuning, user models)
"""
