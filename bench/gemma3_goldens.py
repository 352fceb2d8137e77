"""Gemma 3 270M's llama.cpp goldens (tests/golden/gemma3_golden.json) on every path, all of them: cases 0-6 x 24
ids, teacher forced. The suite checks a subset per path (the numpy reference runs all 8 cases x 24 in
tests/test_gemma3.py); this runs the rest where a test run cannot afford them. Case 7 (1,783 tokens) has its own
benchmark, bench.gemma3_long.

    python3 -m bench.gemma3_goldens [--paths wgpu_cpu wgpu_gpu tab_webgpu tab_cpu] [--cases 0 1 ...] [--ids 24]
    python3 -m bench --only gemma3_goldens

- `wgpu_cpu`, `wgpu_gpu`: the WebGPU backend on wgpu-py (lavapipe here), the cpu or the gpu kernel family,
  teacher forced through LLMEngine (tests/forced_rows.py).
- `tab_webgpu`: the page on ?backend=webgpu (SwiftShader in headless Chromium: the cpu kernel family there),
  forced through the tab's own engine in its worker.
- `tab_cpu`: the page on its CPU path (the wasm kernels), the same forcing.

Per path and case: our argmax and margin over llama.cpp's id at each forced position, the positions that differ,
whether each is a near tie (tests/llama_reference.py's rule: llama.cpp's margin or ours under NEAR_TIE) and so
whether the case agrees; the wall time of the forced runs and of the model load, and the machine's load average
around it (this 2-core machine is shared: its times are its own). Figures only; nothing passes or fails here.
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
CHUNK = 256  # prefill chunk of the wgpu paths
PATHS = ("wgpu_cpu", "wgpu_gpu", "tab_webgpu", "tab_cpu")
TAB_QUERY = {"tab_webgpu": "?model=gemma-3-270m&backend=webgpu&kv_disk=0",
             "tab_cpu": "?model=gemma-3-270m&backend=cpu&kv_disk=0"}


def forced_cases(cases: list[int], n: int) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt ids, llama.cpp's first n ids, their margins) of each golden case."""
    return [(GOLDEN["cases"][c]["prompt_ids"], GOLDEN["cases"][c]["output_ids"][:n], GOLDEN["cases"][c]["margins"][:n])
            for c in cases]


def judged(rows: list, ids: list[int], margins: list[float]) -> dict:
    """One case's forced rows beside llama.cpp's ids, under the suite's near-tie rule."""
    from llama_reference import near_tie

    differ = [{"position": i, "ours": a, "llama_cpp": b, "llama_cpp_margin": margins[i], "our_margin": round(m, 4)}
              for i, ((a, m), b) in enumerate(zip(rows, ids)) if a != b]
    ties = all(near_tie(d["llama_cpp_margin"]) or near_tie(d["our_margin"]) for d in differ)
    return {"ours": [a for a, _ in rows], "our_margins": [round(m, 4) for _, m in rows], "llama_cpp": ids,
            "llama_cpp_margins": margins, "equal": not differ, "differ": differ,
            "agrees": ties and len(differ) <= 4}


async def wgpu(cases: list, kernels: str) -> dict:
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

    t0 = time.perf_counter()
    ctx = await open_device()
    b = await WebGpuBackend.create(ctx, manifest, source, budget_bytes=600 << 20, block_size=16, kv_dtype="f16",
                                   max_num_batched_tokens=CHUNK, max_num_seqs=1, kernels=kernels)
    engine = LLMEngine(b, Tokenizer.from_manifest(manifest), EngineConfig(max_num_batched_tokens=CHUNK,
                                                                          max_num_seqs=1))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rows = await forced_rows(engine, [(prompt, ids) for prompt, ids, _ in cases])
    run_s = time.perf_counter() - t0
    out = {"adapter": ctx.info.name, "kernels": b.kernels, "prefill_chunk": CHUNK, "kv_groups": b.kv_groups.num_groups,
           "prefill_passes": b.kv_kernels.prefill_passes([len(prompt) for prompt, _, _ in cases]),
           "load_s": round(load_s, 1), "forced_run_s": round(run_s, 1),
           "cases": [judged(r, ids, margins) for r, (_, ids, margins) in zip(rows, cases)]}
    b.destroy()
    return out


def tab(cases: list, path: str) -> dict:
    """The page (TAB_QUERY[path]), forced through its own engine in the worker."""
    from harness.page import BrowserSession

    forced = [(prompt, ids) for prompt, ids, _ in cases]
    t0 = time.perf_counter()
    with BrowserSession(TAB_QUERY[path], build_first=False) as s:
        load_s = time.perf_counter() - t0
        s.install({"forced_rows.py": (ROOT / "tests" / "forced_rows.py").read_text()})
        t0 = time.perf_counter()
        got = s.py("import json\nfrom forced_rows import forced_rows\nfrom pagedkv_app.main import state\n"
                   "e = state['engine']\n"
                   f"rows = await forced_rows(e, {forced!r})\n"
                   "json.dumps({'rows': rows, 'kernels': getattr(e.backend, 'kernels', None), "
                   "'kv_groups': e.kv.num_groups, 'chunk': e.config.max_num_batched_tokens})", timeout_ms=3_600_000)
        run_s = time.perf_counter() - t0
        info = s.model_info
    return {"backend": info["backend"], "adapter": info.get("adapter"), "kernels": got["kernels"],
            "prefill_chunk": got["chunk"], "kv_groups": got["kv_groups"], "load_s": round(load_s, 1),
            "forced_run_s": round(run_s, 1),
            "cases": [judged([tuple(x) for x in r], ids, margins) for r, (_, ids, margins) in zip(got["rows"], cases)]}


def code_version() -> str:
    """The commit the path ran at, "+changes" when the work tree differed from it."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "py", "shaders") else "")


def run_path(name: str, cases: list) -> dict:
    """One path's figures; an exception is that path's figure (the other paths still run)."""
    before = os.getloadavg()
    version = code_version()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"== {name}", file=sys.stderr, flush=True)
    try:
        out = asyncio.run(wgpu(cases, name.removeprefix("wgpu_"))) if name.startswith("wgpu_") else tab(cases, name)
    except Exception as exc:
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
    parser.add_argument("--cases", nargs="+", type=int, default=list(range(7)))
    parser.add_argument("--ids", type=int, default=24)
    parser.add_argument("--quick", action="store_true", help="the reduced form: the tab's CPU path, cases 0-6 x 8")
    args = parser.parse_args()
    if args.quick:
        args.paths, args.ids = ["tab_cpu"], 8
    cases = forced_cases(args.cases, args.ids)
    # A run of some paths keeps the other paths' rows of the result it replaces (each row says its code and when
    # it started), when it forced the same cases and ids.
    previous = previous_result() or {}
    same = previous.get("ids") == args.ids and previous.get("golden_cases") == args.cases
    paths = {k: v for k, v in previous.get("paths", {}).items() if same}
    paths.update({name: run_path(name, cases) for name in args.paths})
    emit({"benchmark": "gemma3_goldens", "model": "gemma-3-270m (Q4_K_M GGUF)", "golden_cases": args.cases,
          "prompt_tokens": [len(prompt) for prompt, _, _ in cases], "ids": args.ids, "machine": platform.machine(),
          "cpus": os.cpu_count(), "paths": paths,
          "agree": {name: all(c["agrees"] for c in row.get("cases", [])) and "cases" in row
                    for name, row in paths.items()}})


if __name__ == "__main__":
    main()
