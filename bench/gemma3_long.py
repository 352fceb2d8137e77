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
import asyncio
import json
import os
import platform
import subprocess
import sys
import time

from bench import ROOT, emit, previous_result

sys.path.insert(0, str(ROOT / "tests"))
GOLDEN = json.loads((ROOT / "tests" / "golden" / "gemma3_golden.json").read_text())
CASE = 7
CHUNK = 256  # the prefill chunk of the native test's run of this case
PATHS = ("wgpu_cpu", "wgpu_gpu", "tab_webgpu")


def forced_case(n: int) -> tuple[list[int], list[int], list[float]]:
    """Golden case 7's prompt, llama.cpp's first n ids and their margins."""
    g = GOLDEN["cases"][CASE]
    return g["prompt_ids"], g["output_ids"][:n], g["margins"][:n]


def judged(rows: list, ids: list[int], margins: list[float]) -> dict:
    """A path's forced rows beside llama.cpp's ids."""
    return {"ours": [argmax for argmax, _ in rows], "our_margins": [round(m, 4) for _, m in rows],
            "llama_cpp": ids, "llama_cpp_margins": margins, "equal": [a for a, _ in rows] == ids}


async def wgpu(n: int, kernels: str) -> dict:
    """A kernel family on the wgpu-py adapter (lavapipe)."""
    from forced_rows import forced_rows

    from pagedkv.backends.webgpu.backend import WebGpuBackend
    from pagedkv.backends.webgpu.runtime import open_device
    from pagedkv.engine import EngineConfig, LLMEngine
    from pagedkv.model.convert import convert_cached, fetch_gemma3_gguf
    from pagedkv.tokenizer import Tokenizer

    models = ROOT / ".cache" / "models"
    model_dir = convert_cached(fetch_gemma3_gguf(models), models)
    manifest = json.loads((model_dir / "model.json").read_text())

    async def source(name: str) -> bytes:
        return (model_dir / name).read_bytes()

    prompt, ids, margins = forced_case(n)
    t0 = time.perf_counter()
    ctx = await open_device()
    b = await WebGpuBackend.create(ctx, manifest, source, budget_bytes=600 << 20, block_size=16, kv_dtype="f16",
                                   max_num_batched_tokens=CHUNK, max_num_seqs=1, kernels=kernels)
    engine = LLMEngine(b, Tokenizer.from_manifest(manifest), EngineConfig(max_num_batched_tokens=CHUNK,
                                                                          max_num_seqs=1))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    [rows] = await forced_rows(engine, [(prompt, ids)])
    run_s = time.perf_counter() - t0
    out = {"adapter": ctx.info.name, "kernels": b.kernels, "prefill_chunk": CHUNK, "kv_groups": b.kv_groups.num_groups,
           "prefill_passes": b.kv_kernels.prefill_passes([len(prompt)]), "load_s": round(load_s, 1),
           "forced_run_s": round(run_s, 1), **judged(rows, ids, margins)}
    b.destroy()
    return out


def tab_webgpu(n: int) -> dict:
    """The page on ?backend=webgpu (SwiftShader), forced through its own engine in the worker."""
    from harness.page import BrowserSession

    prompt, ids, margins = forced_case(n)
    t0 = time.perf_counter()
    with BrowserSession("?model=gemma-3-270m&backend=webgpu&kv_disk=0", build_first=False) as s:
        load_s = time.perf_counter() - t0
        s.install({"forced_rows.py": (ROOT / "tests" / "forced_rows.py").read_text()})
        t0 = time.perf_counter()
        got = s.py("import json\nfrom forced_rows import forced_rows\nfrom pagedkv_app.main import state\n"
                   "e = state['engine']\n"
                   f"rows = await forced_rows(e, [({prompt!r}, {ids!r})])\n"
                   "json.dumps({'rows': rows[0], 'kernels': e.backend.kernels, 'kv_groups': e.kv.num_groups, "
                   "'chunk': e.config.max_num_batched_tokens})", timeout_ms=3_600_000)
        run_s = time.perf_counter() - t0
        info = s.model_info
    return {"backend": info["backend"], "adapter": info.get("adapter"), "kernels": got["kernels"],
            "prefill_chunk": got["chunk"], "kv_groups": got["kv_groups"], "load_s": round(load_s, 1),
            "forced_run_s": round(run_s, 1), **judged(got["rows"], ids, margins)}


def code_version() -> str:
    """The commit the path ran at, "+changes" when the work tree differed from it."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "py", "shaders") else "")


def run_path(name: str, n: int) -> dict:
    before = os.getloadavg()
    version = code_version()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"== {name}", file=sys.stderr, flush=True)
    try:
        out = asyncio.run(wgpu(n, name.removeprefix("wgpu_"))) if name.startswith("wgpu_") else tab_webgpu(n)
    except Exception as exc:  # one path's failure is that path's figure; the other still runs
        out = {"error": f"{type(exc).__name__}: {exc}"}
    out["code"] = version
    out["started"] = started
    out["load_avg_before"] = [round(x, 2) for x in before]
    out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--ids", type=int, default=4, help="llama.cpp's ids forced (margins 4.2-8.0 for the first 4)")
    parser.add_argument("--quick", action="store_true",
                        help="the reduced form: lavapipe's gpu family only, llama.cpp's first id (~8 minutes here)")
    args = parser.parse_args()
    if args.quick:
        args.paths, args.ids = ["wgpu_gpu"], 1
    prompt, _, _ = forced_case(args.ids)
    # A run of some paths keeps the other paths' rows of the result it replaces (each row says its code and when it started).
    previous = previous_result() or {}
    paths = {k: v for k, v in previous.get("paths", {}).items() if previous.get("ids") == args.ids}
    paths.update({name: run_path(name, args.ids) for name in args.paths})
    emit({"benchmark": "gemma3_long", "model": "gemma-3-270m (Q4_K_M GGUF)", "golden_case": CASE,
          "prompt_tokens": len(prompt), "ids": args.ids, "machine": platform.machine(), "cpus": os.cpu_count(),
          "paths": paths})


if __name__ == "__main__":
    main()
