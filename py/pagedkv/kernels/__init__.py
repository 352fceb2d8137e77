"""Numpy references of the WGSL kernels in shaders/ (pure numpy; CPython and Pyodide)."""
