"""Cost of the KV cache operations under the running interpreter (CPython or Pyodide).

    python3 -m bench.kv_ops [--repeat 5]

Prints JSON. Each figure is the best of `repeat` runs (least disturbed by other
processes), divided by the work done:
- pool_alloc_free_us_per_block: BlockPool.get_new_blocks(64) + free_blocks, per block.
- manager_alloc_free_us_per_block[_no_prefix_cache]: KVCacheManager.allocate_slots for
  a fresh 1,024-token prompt (64 blocks; with prefix caching that includes hashing
  and registering every full block, and evicting old cached blocks) + free, per block.
- lookup_prefix_hit_us_per_1k_tokens: lookup_prefix of a 1,000-token prompt whose 62
  full blocks are all cached (62 chained hashes + verifications), per 1,000 tokens.
- lookup_prefix_miss_us_per_1k_tokens: the same with its first block not cached.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time

from pagedkv.kv.block_pool import BlockPool
from pagedkv.config import CacheConfig
from pagedkv.kv.manager import KVCacheManager
from pagedkv.sequence import Sequence


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_pool(repeat: int, iters: int = 200) -> float:
    pool = BlockPool(2912)

    def run():
        for _ in range(iters):
            ids = pool.get_new_blocks(64)
            pool.free_blocks(reversed(ids))
    return _best(run, repeat) / (iters * 64) * 1e6


def bench_manager(repeat: int, prefix: bool, iters: int = 50) -> float:
    mgr = KVCacheManager(CacheConfig(num_blocks=2912, block_size=16,
                                     enable_prefix_caching=prefix), namespace="bench")
    rng = random.Random(0)
    prompts = [[rng.randrange(49152) for _ in range(1024)] for _ in range(iters * repeat)]
    it = iter(prompts)

    def run():
        for _ in range(iters):
            seq = Sequence(next(it))
            mgr.allocate_slots(seq, 1024)
            mgr.free(seq)
    return _best(run, repeat) / (iters * 64) * 1e6


def bench_lookup(repeat: int, hit: bool, iters: int = 100) -> float:
    mgr = KVCacheManager(CacheConfig(num_blocks=2912, block_size=16), namespace="bench")
    rng = random.Random(1)
    prompt = [rng.randrange(49152) for _ in range(1000)]
    seq = Sequence(prompt)
    mgr.allocate_slots(seq, 1000)
    query = prompt if hit else [prompt[0] + 1] + prompt[1:]
    n, ids = mgr.lookup_prefix(query)
    assert n == (992 if hit else 0), n

    def run():
        for _ in range(iters):
            mgr.lookup_prefix(query)
    return _best(run, repeat) / iters * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="--repeat 2")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeat = 2
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    out = {
        "python": sys.version.split()[0], "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "pool_alloc_free_us_per_block": bench_pool(args.repeat),
        "manager_alloc_free_us_per_block": bench_manager(args.repeat, prefix=True),
        "manager_alloc_free_us_per_block_no_prefix_cache": bench_manager(args.repeat, False),
        "lookup_prefix_hit_us_per_1k_tokens": bench_lookup(args.repeat, hit=True),
        "lookup_prefix_miss_us_per_1k_tokens": bench_lookup(args.repeat, hit=False),
    }
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()},
                     indent=2))


if __name__ == "__main__":
    main()
