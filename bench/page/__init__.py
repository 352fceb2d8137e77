"""Code installed into the page's Pyodide worker (BootedPage.install_bench), imported there as bench.page.*;
it uses only pagedkv, numpy and the page's own modules."""
