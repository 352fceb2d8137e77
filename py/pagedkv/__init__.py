"""PagedKV: a paged KV cache LLM engine whose controller runs in CPython and Pyodide."""

__version__ = "0.1.0"
