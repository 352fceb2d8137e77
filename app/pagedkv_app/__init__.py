"""PagedKV in-tab application: runs in the Pyodide worker and wires UI messages to the engine."""
