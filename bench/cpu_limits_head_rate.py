"""Why Gemma 3's output head streams slower than memory (issue 51): its product alone against a plain read of the
same bytes, on 1 and 2 threads, in V8 (Node: the engine the tab runs its kernels on) and in wasmtime (CPython).

    python3 -m bench.cpu_limits_head_rate [--rows 262144] [--cols 640] [--reps 5] [--no-wasmtime] [--quick]

V8: bench/page/cpu_limits_head_rate.mjs on the built linear_shared module: a head of Gemma 3 270M's shape (random
q8_0 codes) in both layouts, (d, 0) f32 pairs (kind 3, before) and d alone, a row's d then its codes (kind 67:
cpu_wasm.d_rows), each product against bench/page/cpu_limits.wat's `stream` over the same bytes, with one thread
and with two claiming linear_threads.js's chunks. wasmtime: one SharedMemory with the (d, 0) layout and one
token's 16-bit activations quantized once (quant_x), as web/linear_threads.js runs a product; each thread an
instance of linear_relaxed_shared (tests/wasm_kernels.py builds it as the page's) claims cpu_wasm.chunks of the
rows, runs `matmul` on them, and the sweep `stream`s the same chunks' codes and scales; in cache: the same
products over the first `--cache-rows` rows again and again (their 1.35 MB stay in the caches, one call a pass
so each call's ~10 us from Python weighs little), the kernel's arithmetic rate without memory. wasmtime's
compiler (Cranelift) is not V8's. Best and median of `reps`, every case in turn within a rep (the machine's load
moves them alike); the load average goes with the figures. Prints JSON. Never asserts on a time.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import ROOT, emit

sys.path.insert(0, str(ROOT / "tests"))  # the built modules as the tests and the page run them
import build  # noqa: E402
import wasm_kernels  # noqa: E402
import wasmtime  # noqa: E402

from pagedkv.backends.cpu_wasm import ACT16, KINDS, QUANTIZED_X, XQ_BYTES, array_at, chunks  # noqa: E402

PAGE = 65536


class Heads:
    """The head and its token in one SharedMemory, `threads` instances of the kernels and of the sweep on it."""

    def __init__(self, rows: int, cols: int, threads: int) -> None:
        self.rows, self.cols, self.nb = rows, cols, cols // 32
        eng = wasm_kernels.engine()
        sweep_text = (ROOT / "bench" / "page" / "cpu_limits.wat").read_text(encoding="utf-8")
        sweep = wasmtime.Module(eng, build.wat2wasm(build.with_shared_memory(sweep_text), "cpu_limits.wat",
                                                    ("threads",)))
        kernels = wasmtime.Module(eng, wasm_kernels.modules()["linear_relaxed_shared"])
        self.qs_at = PAGE
        self.dm_at = self.qs_at + rows * cols
        self.x_at = self.dm_at + rows * self.nb * 8
        self.s_at = self.x_at + cols * 4
        self.out_at = self.s_at + self.nb * XQ_BYTES[16] + 64
        top = self.out_at + rows * 4
        self.memory = wasm_kernels.SharedMemory(eng, wasmtime.MemoryType(
            wasmtime.Limits(-(-top // PAGE) + 1, 65536), shared=True))
        heap = array_at(ctypes.addressof(self.memory.data_ptr().contents), ctypes.c_uint8, self.memory.data_len())
        rng = np.random.default_rng(0)
        heap[self.qs_at:self.dm_at] = rng.integers(-127, 128, rows * cols, dtype=np.int8).view(np.uint8)
        dm = np.zeros((rows, self.nb, 2), np.float32)
        dm[:, :, 0] = rng.random((rows, self.nb)) * 0.01
        heap[self.dm_at:self.x_at] = dm.view(np.uint8).reshape(-1)
        heap[self.x_at:self.s_at] = rng.standard_normal(cols).astype(np.float32).view(np.uint8)
        self.instances = []
        for _ in range(threads):
            store = wasmtime.Store(eng)
            self.instances.append((store, wasmtime.Instance(store, kernels, [self.memory]).exports(store),
                                   wasmtime.Instance(store, sweep, [self.memory]).exports(store)))
        store, ex, _ = self.instances[0]
        ex["quant_x"](store, self.x_at, self.nb, 1, self.s_at)

    def run(self, threads: int, what: str, rows: int | None = None, repeat: int = 1) -> float:
        """Seconds for `threads` threads to take every chunk of the first `rows` rows (`repeat` times over):
        `matmul` ("head") or `stream` over the chunk's codes and scales ("sweep")."""
        rows = rows or self.rows
        # the head: linear_threads.js's chunks; in cache: the first `rows` rows in one call, `repeat` calls in all
        work = iter(chunks(rows, threads) if repeat == 1 else [(0, rows)] * repeat)
        lock, start = threading.Lock(), threading.Barrier(threads + 1)
        kind = KINDS["q8_0"] | ACT16 | QUANTIZED_X

        def take(i: int) -> None:
            store, ex, sw = self.instances[i]
            start.wait()
            while True:
                with lock:
                    r0, r1 = next(work, (None, None))
                if r0 is None:
                    return
                if what == "head":
                    ex["matmul"](store, kind, self.qs_at + r0 * self.cols, self.dm_at + r0 * self.nb * 8, r1 - r0,
                                 self.cols, self.x_at, 1, self.out_at + 4 * r0, self.rows, self.s_at)
                else:
                    sw["stream"](store, self.qs_at + r0 * self.cols, (r1 - r0) * self.cols)
                    sw["stream"](store, self.dm_at + r0 * self.nb * 8, (r1 - r0) * self.nb * 8)

        helpers = [threading.Thread(target=take, args=(i,)) for i in range(threads)]
        for h in helpers:
            h.start()
        start.wait()
        t0 = time.perf_counter()
        for h in helpers:
            h.join()
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=262_144)
    parser.add_argument("--cols", type=int, default=640)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cache-rows", type=int, default=2048)
    parser.add_argument("--wasmtime", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--quick", action="store_true", help="65,536 rows, 2 reps")
    parser.add_argument("--json", action="store_true", help="accepted for `python3 -m bench`")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.reps = 65_536, 2
    load_before = os.getloadavg()
    report = {"rows": args.rows, "cols": args.cols, "reps": args.reps,
              "v8": v8_rates(args.rows, args.cols, args.reps)}
    if args.wasmtime:
        report["wasmtime"] = wasmtime_rates(args.rows, args.cols, args.reps, args.cache_rows)
    emit({**report, "load_before": [round(v, 2) for v in load_before],
          "load_after": [round(v, 2) for v in os.getloadavg()]})
    return 0


def v8_rates(rows: int, cols: int, reps: int) -> dict:
    """bench/page/cpu_limits_head_rate.mjs under Node on the built linear_shared and a shared cpu_limits.wat."""
    sweep_text = (ROOT / "bench" / "page" / "cpu_limits.wat").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        linear, sweep = Path(tmp) / "linear_shared.wasm", Path(tmp) / "cpu_limits.wasm"
        linear.write_bytes(wasm_kernels.modules()["linear_shared"])
        sweep.write_bytes(build.wat2wasm(build.with_shared_memory(sweep_text), "cpu_limits.wat", ("threads",)))
        out = subprocess.run(["node", str(ROOT / "bench" / "page" / "cpu_limits_head_rate.mjs"), str(linear),
                              str(sweep), str(rows), str(cols), str(reps)], check=True, capture_output=True,
                             text=True, timeout=600)
    return json.loads(out.stdout)


def wasmtime_rates(rows: int, cols: int, reps: int, cache_rows: int) -> dict:
    """The (d, 0) layout's product, its sweep and its in-cache rate in wasmtime, on 1 and 2 threads."""
    heads = Heads(rows, cols, 2)
    nbytes = rows * (cols + cols // 32 * 8)  # codes and (d, m) scales
    cache_bytes = cache_rows * (cols + cols // 32 * 8)
    repeat = max(1, rows // cache_rows)  # as many bytes through the kernel as the whole head
    times: dict[str, list[float]] = {}
    for _ in range(reps):
        for threads in (1, 2):
            for what in ("head", "sweep"):
                times.setdefault(f"{what}_{threads}", []).append(heads.run(threads, what))
            times.setdefault(f"in_cache_{threads}", []).append(heads.run(threads, "head", cache_rows, repeat))
    cases = {}
    for name, ts in times.items():
        moved = cache_bytes * repeat if name.startswith("in_cache") else nbytes
        cases[name] = {"fastest_ms": round(1e3 * min(ts), 2), "median_ms": round(1e3 * statistics.median(ts), 2),
                       "gb_s": round(moved / min(ts) / 1e9, 2)}
    return {"bytes": nbytes, "cases": cases}


if __name__ == "__main__":
    raise SystemExit(main())
