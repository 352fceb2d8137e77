"""The benchmarks' side of the browser harness (harness/, which the tests use too): the page most browser
benchmarks run in, shared by all of them when `python3 -m bench` runs them in one page (one_page.py), and how a
benchmark puts its own modules into that page."""
from __future__ import annotations

from contextlib import contextmanager

from harness.page import BootedPage, BrowserSession

# The page most browser benchmarks run in: the app loads only the tiny model, on the CPU, so the benchmark has
# the GPU (and the budget) to itself. `python3 -m bench` runs those benchmarks in one such page (one_page.py).
QUERY = "?model=tiny-random&backend=cpu"
SHARED: list[BrowserSession] = []  # the one page of bench/harness/one_page.py while it runs benchmarks in it


@contextmanager
def session(**kw):
    """A booted page at QUERY for one benchmark: the shared one when bench/harness/one_page.py runs this
    benchmark (its server also serves the wllama harness), else a BrowserSession(QUERY, **kw) of its own."""
    if SHARED:
        yield SHARED[0]
    else:
        with BrowserSession(QUERY, **kw) as s:
            yield s


def install_bench(page: BootedPage, *paths: str) -> BootedPage:
    """Install bench/<path> for each path (e.g. "page/ttft_turns.py", "kv_sim.py") into the page's worker with
    the package files above it, so page code imports them as in CPython (bench.page.ttft_turns, bench.kv_sim)."""
    return page.install_package("bench", *paths)
