"""Gemma 3 270M's long golden (tests/golden/gemma3_golden.json case 7: 1,783 prompt tokens) on the paths too slow
for the test suite: does each give llama.cpp's greedy ids where the window layers cannot see the prompt's first
line and the global layers must?

    python3 -m bench.gemma3_long [--paths wgpu_cpu wgpu_gpu tab_webgpu] [--ids 4]   (python3 -m bench --only gemma3_long)

Under `python3 -m bench`, a run of some paths (`-- --paths wgpu_gpu`) keeps the other paths' rows of the result it
replaces; each row carries the commit it ran at and when it started.

- `wgpu_cpu`, `wgpu_gpu`: the WebGPU backend on wgpu-py (lavapipe here), the cpu or the gpu kernel family,
  256-token prefill chunks, teacher forced through LLMEngine (tests/forced_rows.py). The cpu family takes ~60 s of
  a quiet machine here, the gpu family 4-16x that.
- `tab_webgpu`: the page on ?backend=webgpu (SwiftShader in headless Chromium: the cpu kernel family there), the
  same forcing run on the tab's own engine in its worker. SwiftShader prefills a few tokens a second.

The suite runs this case on the numpy reference (tests/test_gemma3.py) and the tab's CPU path
(tests/browser/test_gemma3_page.py); the prefill passes these paths take are tested at kernel level on both
emulators and in the engine on a tiny head-256 Gemma (tests/native/test_prefill_passes_native.py). Per path: our argmax and margin over llama.cpp's id at each forced
position, whether the ids equal llama.cpp's, the wall time of the forced run (prefill and the decode steps) and of
the model load, and the machine's load average around it (this 2-core machine is shared: its times are its own).
Figures only; nothing passes or fails here.
"""
from __future__ import annotations

import argparse
import os
import platform

from bench import emit, previous_result
from bench.gemma3_goldens import GOLDEN, forced_cases, run_path

CASE = 7
PATHS = ("wgpu_cpu", "wgpu_gpu", "tab_webgpu")  # the tab's CPU path runs it in the suite


def one_case(row: dict) -> dict:
    """A gemma3_goldens path row of the one case, flattened: this benchmark's rows keep their shape."""
    if "cases" in row:
        [case] = row.pop("cases")
        row.update(case)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--ids", type=int, default=4, help="llama.cpp's ids forced (margins 4.2-8.0 for the first 4)")
    parser.add_argument("--quick", action="store_true",
                        help="the reduced form: lavapipe's gpu family only, llama.cpp's first id (~8 minutes here)")
    args = parser.parse_args()
    if args.quick:
        args.paths, args.ids = ["wgpu_gpu"], 1
    prompt = GOLDEN["cases"][CASE]["prompt_ids"]
    # A run of some paths keeps the other paths' rows of the result it replaces (each row says its code and when it started).
    previous = previous_result() or {}
    paths = {k: v for k, v in previous.get("paths", {}).items() if previous.get("ids") == args.ids}
    paths.update({name: one_case(run_path(name, forced_cases([CASE], args.ids))) for name in args.paths})
    emit({"benchmark": "gemma3_long", "model": "gemma-3-270m (Q4_K_M GGUF)", "golden_case": CASE,
          "prompt_tokens": len(prompt), "ids": args.ids, "machine": platform.machine(), "cpus": os.cpu_count(),
          "paths": paths})


if __name__ == "__main__":
    main()
