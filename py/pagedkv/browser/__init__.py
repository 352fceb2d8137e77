"""The engine's browser edge: modules that import `js` / `pyodide` and run only in the page's worker.

    opfs.py   the origin private file system as a file_store.FileStore (block files, tuning, user models)
"""
