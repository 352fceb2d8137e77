"""Code installed into the page's Pyodide worker (bench.harness.install_bench), imported there as bench.page.*;
it uses only pagedkv, numpy and the page's own modules."""
