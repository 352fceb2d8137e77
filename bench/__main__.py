"""`npm run bench`: run every benchmark, print its JSON, and save it under bench/results/.

    python3 -m bench [--only NAME ...] [--list]

Benchmarks print figures; none of them passes or fails on a number.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# name -> argv after `python3 -m`; each prints one JSON document on stdout.
BENCHMARKS = {
    "kv_sim_1gib": ["bench.kv_sim", "--json", "--budget-gib", "1", "--seed", "0"],
    "kv_sim_2gib": ["bench.kv_sim", "--json", "--budget-gib", "2", "--seed", "0"],
    "kv_ops": ["bench.kv_ops"],
    "tokenizer": ["bench.bench_tokenizer"],
    "numpy_ref_speed": ["bench.numpy_ref_speed"],
    "page_boot": ["bench.page_boot", "--json"],
    "kv_kernels": ["bench.kv_kernels", "--quick"],
    "model_kernels": ["bench.model_kernels"],
    "webgpu_engine": ["bench.webgpu_engine"],
    "app_dashboard": ["bench.app_dashboard"],
    "kv_quality_dtypes": ["bench.kv_quality_dtypes"],
}


def run_one(name: str) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *BENCHMARKS[name]], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    text = proc.stdout
    result = json.loads(text[text.index("{"):])  # tolerate progress lines before the JSON
    result.setdefault("benchmark", name)
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run just these")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args()
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in args.only or BENCHMARKS:
        print(f"== {name}", flush=True)
        try:
            result = run_one(name)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            failed.append(name)
            continue
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2), flush=True)
    if failed:
        print(f"failed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
