"""`npm run bench`: run the benchmarks and file their JSON under bench/results/: the only writer of results.

    python3 -m bench [--quick] [--only NAME ...] [--list] [-- ARG ...]      (npm run bench -- --quick)
    python3 -m bench --report                  rewrite the plots, SUMMARY.md and docs/results.md from the JSON

Each benchmark prints one JSON document on stdout (`python3 -m bench.NAME` alone only prints it); this runner
writes it to results/NAME.json, then the plots and SUMMARY.md (bench/report/). Benchmarks print figures; none
of them passes or fails on a number. --quick runs every benchmark in its reduced form (each accepts --quick)
and files into results/quick/, so a quick run never overwrites the full figures. The benchmarks of LONG
(an hour or more in their full form) run in their quick form, filed under results/quick/, unless --only names
them: `python3 -m bench --only long_chat` runs the full form into results/. Arguments after `--` go to every
benchmark run (`python3 -m bench --only long_chat -- --cpu-reference`).
dist/ is built once. Each benchmark runs in its own process, except the browser benchmarks of ONE_PAGE, which
run one after another in one process and one booted page (bench/harness/one_page.py): one page boot, not nine.
A result may carry "files" ({name: base64}); they are written next to its JSON, which keeps only the names.
"""
from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"

# name -> argv after `python3 -m`; each prints one JSON document on stdout.
BENCHMARKS = {
    "kv_sim_1gib": ["bench.kv_sim", "--json", "--budget-gib", "1", "--seed", "0"],
    "kv_sim_2gib": ["bench.kv_sim", "--json", "--budget-gib", "2", "--seed", "0"],
    # the KV pool a synthetic 1.5B-class Q4_K model leaves in 1 GiB (its GGUF is written on first use, ~1 min)
    "kv_sim_synthetic_1_5b": ["bench.kv_sim", "--json", "--budget-gib", "1", "--seed", "0",
                              "--model", "synthetic-1.5b"],
    # SmolLM2-135M and the synthetic 1.5B in one page, one budget: a static KV share each vs one shared paged pool
    "two_models": ["bench.two_models", "--json", "--budget-gib", "1", "--seed", "0"],
    "kv_browser": ["bench.kv_browser"],
    "kv_ops": ["bench.kv_ops"],
    "tokenizer": ["bench.bench_tokenizer"],
    "numpy_ref_speed": ["bench.numpy_ref_speed"],
    "kv_quality_window": ["bench.kv_quality_window"],  # full form ~35 CPU-minutes
    "page_boot": ["bench.page_boot", "--json"],
    "kv_kernels": ["bench.model_kernels", "--kv"],
    "model_kernels": ["bench.model_kernels"],
    "kernels_wgpu": ["bench.kernels", "--backend", "wgpu", "--json"],
    "kernels_browser": ["bench.kernels", "--backend", "browser", "--json"],
    "roofline": ["bench.roofline"],
    "ttft": ["bench.ttft"],
    "webgpu_engine": ["bench.webgpu_engine"],
    "app_dashboard": ["bench.app_dashboard"],
    "concurrency": ["bench.webgpu_engine", "--concurrency"],
    "wllama": ["bench.wllama"],
    "wllama_q4_k_m": ["bench.wllama", "--gguf", "q4_k_m"],  # llama.cpp's Q4_K_M mix, beside the Q4_1 model's row
    # Gemma 3 270M (its 262,144-row head): the tab, wllama at 2 threads (its best on every file so far) and native
    # llama.cpp; no SwiftShader row (~7 minutes for Gemma there)
    "wllama_gemma3": ["bench.wllama", "--gguf", "gemma3", "--no-webgpu", "--wllama-threads", "2"],
    "wllama_2k": ["bench.wllama", "--prompt", "2000", "--new", "8"],  # a pasted document's time to first token
    "cpu_limits": ["bench.cpu_limits"],
    # how many of Gemma 3's 262,144 head rows a provable candidate screen keeps (why the head has no such path)
    "cpu_limits_head": ["bench.cpu_limits_head"],  # the tab's CPU path (bench.wllama's default row) against the cores' limits
    # Gemma 3's decode step in the page: the one-token step vs the layer loop, the head with d alone vs (d, 0) pairs
    "cpu_limits_step": ["bench.cpu_limits_step"],
    "cpu_limits_step_1thread": ["bench.cpu_limits_step", "--threads", "1"],  # the same without thread handoffs
    # SmolLM2's decode step (8- and 560-token contexts) and 512-token prefill in the page taken apart: the step's
    # tape walked in one crossing vs by Python, the products' share, each prefill part
    "cpu_step_parts": ["bench.cpu_step_parts"],
    # Gemma 3's head alone vs a plain read of its bytes, 1 and 2 threads, V8 (Node) and wasmtime
    "cpu_limits_head_rate": ["bench.cpu_limits_head_rate"],
    "kv_quality_dtypes": ["bench.kv_quality_dtypes"],
    "long_chat": ["bench.long_chat"],  # full form ~1 h on SwiftShader; then `-- --cpu-reference` merges its part
    "soak": ["bench.soak"],  # the chat page under random Send / Stop / Regenerate / Delete / New chat / reload
    # two tabs' GPU ledgers and a turn's delivery to the other tab; what a SharedWorker can use (per-tab engines' why)
    "tab_engines": ["bench.tab_engines"],
    "kv_disk": ["bench.kv_disk"],  # TTFT after a reload, disk tier on / off
    # a 1,000-token chat: its blocks on disk at the reply's end, the flush, write MB/s, TTFT 1 s after the reply
    "kv_disk_flush": ["bench.kv_disk", "--sizes", "1000"],
    # Gemma 3 270M's KV held with sliding-window KV groups vs every layer full; greedy ids and decode speed both ways
    "hybrid_kv": ["bench.hybrid_kv"],
    # the same on the WebGPU backend (wgpu-py's adapter): its ledger's pages, and the engine's after a 1k prompt
    "hybrid_kv_wgpu": ["bench.hybrid_kv", "--backend", "wgpu"],
    # Gemma 3's 1,783-token golden (case 7) where the suite cannot afford it: lavapipe's gpu kernel family and the
    # tab on WebGPU (SwiftShader); llama.cpp's ids beside ours, wall times and the machine's load (~25 min here)
    "gemma3_long": ["bench.gemma3_long"],
    # Gemma 3's short goldens (cases 0-6 x 24 ids) on the paths where the suite runs a subset: lavapipe's two kernel
    # families, the tab on WebGPU (SwiftShader) and the tab's CPU path; near ties judged as the tests judge them
    "gemma3_goldens": ["bench.gemma3_goldens"],
    # SmolLM2 on the CPU backend: decode ms/token free text vs json_schema vs a forced tool call (interleaved
    # rounds), and the token mask's cost (cold, cached)
    "structured": ["bench.structured"],
    # the same decode comparison on the WebGPU backend (wgpu-py's adapter, the gpu kernel family): a plain greedy
    # token is picked on the device, a grammar's needs a logits row on the host
    "structured_wgpu": ["bench.structured", "--backend", "wgpu"],
}
# Run in their quick form unless --only names them.
LONG = ("kv_quality_window", "long_chat", "gemma3_long", "gemma3_goldens")
# Browser benchmarks that take their page from bench.harness.session(): run in one page.
ONE_PAGE = ("kv_browser", "kv_kernels", "kernels_browser", "model_kernels", "roofline", "ttft", "webgpu_engine",
            "concurrency", "wllama", "long_chat")


def child_env(quick: bool, out_dir: Path) -> dict:
    env = dict(os.environ, PAGEDKV_BENCH_RESULTS=str(out_dir), PAGEDKV_BENCH_BUILT="1")  # built once in main()
    if quick:  # one BLAS thread: the numpy CPU benchmarks thrash with two on a shared 2-core machine
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def argv_of(name: str, quick: bool, named: bool = False, extra: tuple[str, ...] = ()) -> list[str]:
    """The benchmark's command line; `named`: --only named it (a LONG benchmark then runs its full form)."""
    reduced = quick or (name in LONG and not named)
    return BENCHMARKS[name] + (["--quick"] if reduced else []) + list(extra)


def finish(name: str, result: dict, argv: list[str], wall_s: float) -> dict:
    result.setdefault("benchmark", name)
    result["wall_s"] = round(wall_s, 2)
    result["quick"] = "--quick" in argv  # a full run runs the LONG benchmarks in their quick form
    return result


def destination(out_dir: Path, quick_form: bool, quick_run: bool) -> Path:
    """Where a result is filed: a benchmark that a full run runs in its quick form (LONG) goes to results/quick/
    with the quick run's, so the published full-form figures stay."""
    return out_dir / "quick" if quick_form and not quick_run else out_dir


def run_one(name: str, argv: list[str], quick: bool, out_dir: Path, previous: Path) -> dict:
    t0 = time.perf_counter()
    env = dict(child_env(quick, out_dir), PAGEDKV_BENCH_PREVIOUS=str(previous))
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    text = proc.stdout
    result = json.loads(text[text.index("{"):])  # tolerate progress lines before the JSON
    return finish(name, result, argv, time.perf_counter() - t0)


def run_in_one_page(jobs: list[tuple[str, list[str], Path]], quick: bool, out_dir: Path):
    """Yield (name, result or RuntimeError) for each (name, argv, previous result's path) of `jobs` as
    bench/harness/one_page.py finishes it."""
    argvs = {name: argv for name, argv, _ in jobs}
    spec = json.dumps([[name, argv, str(previous)] for name, argv, previous in jobs])
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bench.harness.one_page", spec], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=err, text=True, env=child_env(quick, out_dir))
        done = set()
        for line in proc.stdout:
            if not line.startswith('{"name"'):
                continue
            row = json.loads(line)
            done.add(row["name"])
            if "error" in row:
                yield row["name"], RuntimeError(f"benchmark {row['name']} failed:\n{row['error']}")
            else:
                yield row["name"], finish(row["name"], row["result"], argvs[row["name"]], row["wall_s"])
        proc.wait()
        err.seek(0)
        tail = err.read()[-4000:]
    for name in argvs:
        if name not in done:
            yield name, RuntimeError(f"benchmark {name} did not run: the shared page's process ended "
                                     f"(exit {proc.returncode}):\n{tail}")


def save(dest: Path, name: str, result: dict) -> None:
    """results/NAME.json, and the files the result carries next to it."""
    dest.mkdir(parents=True, exist_ok=True)
    for file, data in result.pop("files", {}).items():
        (dest / file).write_bytes(base64.b64decode(data))
    text = json.dumps(result)
    # Traces (kv_browser's utilization series, block maps) stay one line; the rest is indented for diffs.
    (dest / f"{name}.json").write_text((text if len(text) > 100_000 else json.dumps(result, indent=2)) + "\n")


def report(results: Path, docs: Path | None) -> None:
    """The plots and SUMMARY.md in `results` from its JSON; with `docs`, also docs/results.md."""
    from bench.report import plots, summary  # matplotlib loads only here

    print("== plots: " + ", ".join(plots.make_all(results)), flush=True)
    text = summary.build_summary(results)
    (results / "SUMMARY.md").write_text(text)
    print(f"== {results / 'SUMMARY.md'}", flush=True)
    if docs is not None:
        link = Path(os.path.relpath(results.resolve(), docs.resolve())).as_posix()
        (docs / "results.md").write_text(summary.results_page(text, link))
        print(f"== {docs / 'results.md'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[:argv.index("--")], tuple(argv[argv.index("--") + 1:])) if "--" in argv else (argv, ())
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run just these")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--quick", action="store_true", help="reduced runs (a few minutes), into results/quick/")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: rewrite the plots, SUMMARY.md and docs/results.md from bench/results/")
    args = parser.parse_args(ours)
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    if args.report:
        report(RESULTS, DOCS)
        return 0
    out_dir = RESULTS / "quick" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    import build

    build.build()  # once for the whole run: the browser benchmarks skip their own build (PAGEDKV_BENCH_BUILT)
    failed = []
    names = list(dict.fromkeys(args.only or BENCHMARKS))
    jobs = {}
    for name in names:
        job_argv = argv_of(name, args.quick, name in (args.only or ()), extra)
        jobs[name] = (job_argv, destination(out_dir, "--quick" in job_argv, args.quick) / f"{name}.json")

    def alone():
        for name in names:
            if name not in ONE_PAGE:
                print(f"== {name}", flush=True)
                try:
                    yield name, run_one(name, jobs[name][0], args.quick, out_dir, jobs[name][1])
                except RuntimeError as exc:
                    yield name, exc

    def together():
        shared = [name for name in names if name in ONE_PAGE]
        if shared:
            print(f"== in one page: {', '.join(shared)}", flush=True)
            yield from run_in_one_page([(name, *jobs[name]) for name in shared], args.quick, out_dir)

    for name, result in itertools.chain(alone(), together()):
        if isinstance(result, RuntimeError):
            print(result, file=sys.stderr)
            failed.append(name)
            continue
        save(jobs[name][1].parent, name, result)
        print(json.dumps(result)[:2000], flush=True)
    report(out_dir, None)
    if failed:
        print(f"failed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
