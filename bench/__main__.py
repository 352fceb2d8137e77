"""`npm run bench`: run every benchmark, print its JSON, and save it under bench/results/.

    python3 -m bench [--quick] [--only NAME ...] [--list]      (npm run bench -- --quick)

Benchmarks print figures; none of them passes or fails on a number. --quick runs every benchmark in its
reduced form (each accepts --quick) and writes to bench/results/quick/ instead, so a quick run never
overwrites the full figures. A full run too runs kv_quality_window and long_chat in their quick forms (their full
forms take an hour or more: run them alone) and files those under results/quick/, so the published figures stay.
The plots and SUMMARY.md are regenerated from the JSON at the end.
dist/ is built once. Each benchmark runs in its own process, except the browser benchmarks of ONE_PAGE, which
run one after another in one process and one booted page (bench/one_page.py): one page boot instead of nine.
"""
from __future__ import annotations

import argparse
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

# name -> argv after `python3 -m`; each prints one JSON document on stdout.
BENCHMARKS = {
    "kv_sim_1gib": ["bench.kv_sim", "--json", "--budget-gib", "1", "--seed", "0"],
    "kv_sim_2gib": ["bench.kv_sim", "--json", "--budget-gib", "2", "--seed", "0"],
    "kv_browser": ["bench.kv_browser"],
    "kv_ops": ["bench.kv_ops"],
    "tokenizer": ["bench.bench_tokenizer"],
    "numpy_ref_speed": ["bench.numpy_ref_speed"],
    # Its full form (~35 CPU-minutes) runs alone: python3 -m bench.kv_quality_window; here always the quick form.
    "kv_quality_window": ["bench.kv_quality_window", "--quick"],
    "page_boot": ["bench.page_boot", "--json"],
    "kv_kernels": ["bench.kv_kernels"],
    "model_kernels": ["bench.model_kernels"],
    "roofline": ["bench.roofline"],
    "ttft": ["bench.ttft"],
    "webgpu_engine": ["bench.webgpu_engine"],
    "app_dashboard": ["bench.app_dashboard"],
    "concurrency": ["bench.concurrency"],
    "wllama": ["bench.wllama"],
    "kv_quality_dtypes": ["bench.kv_quality_dtypes"],
    # Full run (~1 h on SwiftShader, results/long_chat.json): python3 -m bench.long_chat, then --cpu-reference
    "long_chat_quick": ["bench.long_chat", "--quick"],
    "soak": ["bench.soak"],
}

# Browser benchmarks that take their page from bench.browser.session(): run in one page (bench/one_page.py).
ONE_PAGE = ("kv_browser", "kv_kernels", "model_kernels", "roofline", "ttft", "webgpu_engine", "concurrency", "wllama",
            "long_chat_quick")


def child_env(quick: bool, out_dir: Path) -> dict:
    env = dict(os.environ, PAGEDKV_BENCH_RESULTS=str(out_dir), PAGEDKV_BENCH_BUILT="1")  # built once in main()
    if quick:  # one BLAS thread: the numpy CPU benchmarks thrash with two on a shared 2-core machine
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def argv_of(name: str, quick: bool) -> list[str]:
    return BENCHMARKS[name] + (["--quick"] if quick else [])


def finish(name: str, result: dict, quick: bool, wall_s: float) -> dict:
    result.setdefault("benchmark", name)
    result["wall_s"] = round(wall_s, 2)
    result["quick"] = "--quick" in argv_of(name, quick)  # a full run runs some benchmarks in their quick form
    return result


def destination(out_dir: Path, result: dict, quick_run: bool) -> Path:
    """Where a result is filed: a benchmark that a full run runs in its quick form (kv_quality_window) goes to
    results/quick/ with the quick run's, so the published full-form figures (from running it alone) stay."""
    return out_dir / "quick" if result["quick"] and not quick_run else out_dir


def run_one(name: str, quick: bool, out_dir: Path) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *argv_of(name, quick)], cwd=ROOT, capture_output=True, text=True,
                          env=child_env(quick, out_dir))
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    text = proc.stdout
    result = json.loads(text[text.index("{"):])  # tolerate progress lines before the JSON
    return finish(name, result, quick, time.perf_counter() - t0)


def run_in_one_page(names: list[str], quick: bool, out_dir: Path):
    """Yield (name, result or RuntimeError) for each of `names` as bench/one_page.py finishes it."""
    jobs = json.dumps([[name, argv_of(name, quick)] for name in names])
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bench.one_page", jobs], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=err, text=True, env=child_env(quick, out_dir))
        done = set()
        for line in proc.stdout:
            if not line.startswith('{"name"'):
                continue
            row = json.loads(line)
            done.add(row["name"])
            if "error" in row:
                yield row["name"], RuntimeError(f"benchmark {row['name']} failed:\n{row['error']}")
            else:
                yield row["name"], finish(row["name"], row["result"], quick, row["wall_s"])
        proc.wait()
        err.seek(0)
        tail = err.read()[-4000:]
    for name in names:
        if name not in done:
            yield name, RuntimeError(f"benchmark {name} did not run: the shared page's process ended "
                                     f"(exit {proc.returncode}):\n{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run just these")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--quick", action="store_true", help="reduced runs (a few minutes), into results/quick/")
    args = parser.parse_args()
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    out_dir = RESULTS / "quick" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    import build

    build.build()  # once for the whole run: the browser benchmarks skip their own build (PAGEDKV_BENCH_BUILT)
    failed = []
    names = list(dict.fromkeys(args.only or BENCHMARKS))

    def alone():
        for name in names:
            if name not in ONE_PAGE:
                print(f"== {name}", flush=True)
                try:
                    yield name, run_one(name, args.quick, out_dir)
                except RuntimeError as exc:
                    yield name, exc

    def together():
        shared = [name for name in names if name in ONE_PAGE]
        if shared:
            print(f"== in one page: {', '.join(shared)}", flush=True)
            yield from run_in_one_page(shared, args.quick, out_dir)

    for name, result in itertools.chain(alone(), together()):
        if isinstance(result, RuntimeError):
            print(result, file=sys.stderr)
            failed.append(name)
            continue
        text = json.dumps(result)
        dest = destination(out_dir, result, args.quick)
        dest.mkdir(parents=True, exist_ok=True)
        # Traces (kv_browser's utilization series, block maps) stay one line; the rest is indented for diffs.
        (dest / f"{name}.json").write_text((text if len(text) > 100_000 else json.dumps(result, indent=2)) + "\n")
        print(json.dumps(result)[:2000], flush=True)
    from bench import plots, summary  # matplotlib loads only here

    print("== plots: " + ", ".join(plots.make_all(out_dir)), flush=True)
    (out_dir / "SUMMARY.md").write_text(summary.build_summary(out_dir))
    print(f"== {out_dir / 'SUMMARY.md'}", flush=True)
    if failed:
        print(f"failed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
