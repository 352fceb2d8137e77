"""Benchmark of the KV-cache kernels in headless Chromium (real WebGPU; SwiftShader on this machine).

    python3 -m bench.kv_kernels [--quick]     (prints JSON; `python3 -m bench` files it)

Prints JSON: decode and prefill attention times with a scattered (paged) block table vs an identity
(contiguous) one on the same cache at 512 and 4,096 context tokens, timed alternately, and their ratio;
kv_write times; ablations (head tile, partition size, workgroup size). Figures only; nothing here passes
or fails on time. Other jobs on the machine make single figures noisy: compare the alternated pairs.
"""
from __future__ import annotations

import argparse
import json
import sys

from bench import emit
from bench.harness import install_bench, session


def runs(quick: bool) -> list[str]:
    calls = []
    for context in (512, 4096):
        for dtype in ("f32", "f16"):
            calls.append(f"bench_paged_vs_contiguous('decode', {context}, dtype={dtype!r})")
    calls.append("bench_paged_vs_contiguous('decode', 4096, batch=4)")
    # A 512-token prompt: 512 new query tokens over 512 keys.
    calls.append("bench_paged_vs_contiguous('prefill', 512, rounds=5, inner=1)")
    calls += ["bench_kv_write(1)", "bench_kv_write(512)", "bench_kv_write(512, dtype='f16')"]
    if not quick:  # the ablations behind the defaults
        for tile in (3, 1):
            calls.append(f"bench_attention('decode', 4096, head_tile={tile})")
        for tile in (4, 1):
            calls.append(f"bench_attention('prefill', 512, reps=3, inner=1, query_tile={tile})")
        for context in (512, 4096):
            for partition in (64, 128, 256, 512, 4096):
                calls.append(f"bench_attention('decode', {context}, partition_tokens={partition})")
        for wg in (4, 16, 64):
            calls.append(f"bench_attention('decode', 4096, workgroup_size={wg})")
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the partition / workgroup-size sweep")
    args = parser.parse_args(argv)
    with session() as page:
        install_bench(page, "page/kv_kernels.py")
        page.py("from bench.page.kv_kernels import *\nNone")
        results = []
        for call in runs(args.quick):
            results.append(page.py(f"import json\njson.dumps(await {call})"))
            print(json.dumps(results[-1]), file=sys.stderr)
        adapter = json.loads(page.dataset()["adapter"])
    report = {"benchmark": "kv_kernels", "adapter": adapter["name"], "results": results}
    emit(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
