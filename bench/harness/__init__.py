"""The browser harness shared by tests/browser/, the benchmarks and `npm run generate`."""
from bench.harness.browser import (BootedPage, BrowserSession, QUERY, SHARED, ensure_built, launch, open_and_boot,
                                   serve_dist, session, wait_model)

__all__ = ["BootedPage", "BrowserSession", "QUERY", "SHARED", "ensure_built", "launch", "open_and_boot",
           "serve_dist", "session", "wait_model"]
