"""KV groups on Gemma 3 270M: what its sliding-window layers hold with groups (kv/groups.py) and with every layer
holding the whole context.

    python3 -m bench.hybrid_kv [--quick] [--backend cpu|wgpu]

Prints one JSON object (--backend cpu, the default):
- `held`: KV bytes one sequence holds at 1k / 4k / 16k / 32k tokens (prefilled in chunks of 512, then one decode
  token), counted by the engine's own KV cache manager, both ways, and their ratio;
- `fits_64mib`: the longest context whose KV fits 64 MiB of pages, both ways;
- `greedy`: the engine's greedy ids on the CPU backend for a 600-token prompt (past the 512-token window) + 8
  new tokens, both ways (equal when groups are right);
- `decode`: decode tokens per second at a 4k-token context on the CPU backend (the numpy reference), both ways.
Byte figures use the GPU's default KV dtype (kv.dtypes); the CPU backend's pools hold f32.

--backend wgpu (the WebGPU backend on this machine's wgpu-py adapter, lavapipe here): the model loaded both ways
(WebGpuBackend.create(kv_groups=True / False), a 1 GiB budget, the cpu kernel family), and
- `page_bytes`, `num_blocks`: the bytes of one page the backend's ledger reserved, and the pool's pages;
- `held`: at 1k / 4k tokens, the blocks the manager holds (as above) x the ledger's page bytes, both ways;
- `engine_1k`: a 1,024-token prompt prefilled in chunks of 512 and one token decoded by the engine on the adapter:
  the blocks its manager then holds (kv_stats) both ways, and the prefill seconds (a 4k prefill takes lavapipe
  minutes, so 4k is the manager's count only).
Benchmarks print figures; nothing here passes or fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from pagedkv.backends.cpu import CpuBackend  # noqa: E402
from pagedkv.config import CacheConfig  # noqa: E402
from pagedkv.kv.accounting import kv_stats  # noqa: E402
from pagedkv.engine import EngineConfig, LLMEngine, run_sync  # noqa: E402
from pagedkv.kv.groups import KVGroups  # noqa: E402
from pagedkv.kv.manager import KVCacheManager  # noqa: E402
from pagedkv.kv.spec import KVSpec  # noqa: E402
from pagedkv.model.convert import convert_cached, fetch_gemma3_gguf  # noqa: E402
from pagedkv.model.weights import ModelWeights  # noqa: E402
from pagedkv.sampling import SamplingParams  # noqa: E402
from pagedkv.sequence import Sequence  # noqa: E402
from pagedkv.tokenizer import Tokenizer  # noqa: E402

MODELS = ROOT / ".cache" / "models"
BLOCK = 16
CHUNK = 512
MIB = 1 << 20


def held_blocks(groups: KVGroups | None, n: int) -> int:
    """Blocks the manager holds for one sequence of n tokens prefilled in chunks of CHUNK, then one decode token."""
    num = -(-(n + 1) // BLOCK) * (groups.num_groups if groups else 1) + 2
    mgr = KVCacheManager(CacheConfig(num_blocks=num, block_size=BLOCK), namespace="bench", groups=groups)
    seq = Sequence(list(range(n)))
    done = 0
    while done < n:
        step = min(CHUNK, n - done)
        mgr.allocate_slots(seq, step)
        mgr.mark_computed(seq, step)
        done += step
    mgr.append_tokens(seq, [0])
    return mgr.num_held_blocks(seq)


def longest_fit(groups: KVGroups | None, pages: int) -> int:
    """The most tokens a sequence may reach (chunks of CHUNK) with its blocks in `pages` pages."""
    usable = pages - (1 if groups is not None and groups.has_windows else 0)  # the null block
    need = (lambda n: groups.blocks_needed(n, CHUNK, BLOCK)) if groups else (lambda n: -(-n // BLOCK))
    lo, hi = 0, 1 << 24
    while lo < hi:  # the largest n with need(n) <= usable
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid) <= usable else (lo, mid - 1)
    return lo


def engine_of(weights, grouped: bool, tokens: int) -> LLMEngine:
    groups = KVGroups.of(weights.config)
    blocks = -(-tokens // BLOCK) * (groups.num_groups if grouped else 1) + 2
    backend = CpuBackend(weights, num_blocks=blocks, block_size=BLOCK, kv_groups=grouped)
    return LLMEngine(backend, Tokenizer.from_manifest(weights.manifest),
                     EngineConfig(max_num_batched_tokens=CHUNK, enable_prefix_caching=False))


def greedy(weights, grouped: bool, prompt: list[int], n: int) -> tuple[list[int], float]:
    engine = engine_of(weights, grouped, len(prompt) + n)
    t0 = time.perf_counter()
    req = run_sync(engine.generate(prompt, SamplingParams(max_tokens=n, stop_token_ids=(1 << 30,))))
    return req.output_ids, time.perf_counter() - t0


def decode_speed(weights, grouped: bool, prompt: list[int], n: int) -> dict:
    """Decode tokens per second after a prefill of `prompt` (the steps after the first new token)."""
    engine = engine_of(weights, grouped, len(prompt) + n)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=n, stop_token_ids=(1 << 30,)))
    req = engine.request(rid)
    t0 = time.perf_counter()
    while not req.output_ids:
        run_sync(engine.step())
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    while engine.is_unfinished(rid):
        run_sync(engine.step())
    decode_s = time.perf_counter() - t0
    return {"prefill_s": round(prefill_s, 2), "decode_tokens": n - 1,
            "decode_tok_s": round((n - 1) / decode_s, 2), "output_ids": req.output_ids}


def text_prompt(tokenizer: Tokenizer, n: int) -> list[int]:
    """BOS and n - 1 tokens of a ledger whose first line the question at the end asks about (600 tokens: the
    answer lies outside the window layers' 512)."""
    lines = ["The secret word is lantern."] + [f"Entry {i}: the crate on shelf {i % 7} holds {3 * i + 1} bolts."
                                               for i in range(1, 200)]
    ids = tokenizer.encode(" ".join(lines))
    question = tokenizer.encode(" Question: what is the secret word? Answer: the secret word is")
    return [tokenizer.bos_token_id or 2] + ids[: n - 1 - len(question)] + question


async def wgpu_way(model_dir: Path, grouped: bool, prompt: list[int]) -> dict:
    """The WebGPU backend on the wgpu-py adapter, one way: its ledger's page and the engine's blocks after prompt."""
    from pagedkv.backends.webgpu.backend import WebGpuBackend
    from pagedkv.backends.webgpu.runtime import open_device

    manifest = json.loads((model_dir / "model.json").read_text())

    async def source(name: str) -> bytes:
        return (model_dir / name).read_bytes()

    ctx = await open_device()
    backend = await WebGpuBackend.create(ctx, manifest, source, budget_bytes=1 << 30, block_size=BLOCK, kv_dtype="f16",
                                         max_num_batched_tokens=CHUNK, max_num_seqs=1, kernels="cpu",
                                         kv_groups=grouped)
    engine = LLMEngine(backend, Tokenizer.from_manifest(manifest),
                       EngineConfig(max_num_batched_tokens=CHUNK, max_num_seqs=1, enable_prefix_caching=False))
    req = engine.request(engine.add_request(prompt, SamplingParams(max_tokens=3, stop_token_ids=(1 << 30,))))
    t0 = time.perf_counter()
    while not req.output_ids:
        await engine.step()
    prefill_s = time.perf_counter() - t0
    await engine.step()  # one decode token: its allocation releases what the window left behind
    out = {"page_bytes": backend.ledger.by_kind()["kv"] // backend.num_blocks, "num_blocks": backend.num_blocks,
           "groups": engine.kv.num_groups, "used_blocks": kv_stats(engine.kv).used_blocks,
           "prefill_s": round(prefill_s, 1), "adapter": ctx.info.name}
    while engine.has_unfinished:
        await engine.step()
    backend.destroy()
    return out


def wgpu_main() -> None:
    """--backend wgpu: the module docstring's figures on the WebGPU backend."""
    model_dir = convert_cached(fetch_gemma3_gguf(MODELS), MODELS)
    cfg = ModelWeights.load(model_dir).config
    groups = KVGroups.of(cfg)
    rng = np.random.default_rng(0)
    prompt = [2] + [int(t) for t in rng.integers(100, 20_000, 1023)]
    ways = {name: asyncio.run(wgpu_way(model_dir, grouped, prompt)) for name, grouped in (("groups", True),
                                                                                         ("flat", False))}
    held = []
    for n in (1024, 4096):
        g, f = held_blocks(groups, n), held_blocks(None, n)
        gb, fb = g * ways["groups"]["page_bytes"], f * ways["flat"]["page_bytes"]
        held.append({"tokens": n, "groups_blocks": g, "groups_bytes": gb, "flat_blocks": f, "flat_bytes": fb,
                     "ratio": round(gb / fb, 4)})
    engine = {name: {k: ways[name][k] for k in ("groups", "used_blocks", "prefill_s")} for name in ways}
    for name in ways:
        engine[name]["bytes"] = ways[name]["used_blocks"] * ways[name]["page_bytes"]
    print(json.dumps({
        "benchmark": "hybrid_kv", "backend": "wgpu", "adapter": ways["groups"]["adapter"],
        "model": "gemma-3-270m (Q4_K_M GGUF)", "machine": platform.machine(), "kv_dtype": "f16", "block_size": BLOCK,
        "prefill_chunk": CHUNK, "budget_bytes": 1 << 30,
        "page_bytes": {n: w["page_bytes"] for n, w in ways.items()},
        "num_blocks": {n: w["num_blocks"] for n, w in ways.items()},
        "held": held, "engine_1k": {"prompt_tokens": len(prompt), "decoded": 1, **engine},
    }, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="decode speed at 1k tokens, 4 new tokens")
    parser.add_argument("--backend", choices=("cpu", "wgpu"), default="cpu",
                        help="wgpu: page bytes and blocks held on the WebGPU backend (wgpu-py's adapter)")
    args = parser.parse_args()
    if args.backend == "wgpu":
        wgpu_main()
        return
    weights = ModelWeights.load(convert_cached(fetch_gemma3_gguf(MODELS), MODELS))
    cfg = weights.config
    groups = KVGroups.of(cfg)
    grouped_spec = KVSpec.of(cfg, block_size=BLOCK, groups=groups)
    flat_spec = KVSpec.of(cfg, block_size=BLOCK)
    held = []
    for n in (1024, 4096, 16384, 32768):
        g, f = held_blocks(groups, n), held_blocks(None, n)
        gb, fb = g * grouped_spec.bytes_per_block, f * flat_spec.bytes_per_block
        held.append({"tokens": n, "groups_blocks": g, "groups_bytes": gb, "flat_blocks": f, "flat_bytes": fb,
                     "ratio": round(gb / fb, 4)})
    budget = 64 * MIB
    fits = {"budget_bytes": budget,
            "groups_pages": budget // grouped_spec.bytes_per_block, "flat_pages": budget // flat_spec.bytes_per_block}
    fits["groups_tokens"] = longest_fit(groups, fits["groups_pages"])
    fits["flat_tokens"] = longest_fit(None, fits["flat_pages"])
    rng = np.random.default_rng(0)
    prompt = text_prompt(Tokenizer.from_manifest(weights.manifest), 600)
    ids_groups, s_groups = greedy(weights, True, prompt, 8)
    ids_flat, s_flat = greedy(weights, False, prompt, 8)
    ctx, new = (1024, 4) if args.quick else (4096, 9)
    long_prompt = [2] + [int(t) for t in rng.integers(100, 20_000, ctx - 1)]
    speed = {"context_tokens": ctx, "groups": decode_speed(weights, True, long_prompt, new),
             "flat": decode_speed(weights, False, long_prompt, new)}
    speed["ids_equal"] = speed["groups"].pop("output_ids") == speed["flat"].pop("output_ids")
    print(json.dumps({
        "benchmark": "hybrid_kv", "quick": args.quick, "model": "gemma-3-270m (Q4_K_M GGUF)",
        "machine": platform.machine(), "python": platform.python_version(),
        "kv_dtype": grouped_spec.dtype, "block_size": BLOCK, "prefill_chunk": CHUNK,
        "groups": {"group_size": groups.group_size, "layers": [list(g.layers) for g in groups.groups],
                   "windows": list(groups.windows), "page_bytes": grouped_spec.bytes_per_block,
                   "flat_page_bytes": flat_spec.bytes_per_block},
        "held": held, "fits_64mib": fits,
        "greedy": {"prompt_tokens": len(prompt), "new_tokens": 8, "groups": ids_groups, "flat": ids_flat,
                   "equal": ids_groups == ids_flat, "groups_s": round(s_groups, 2), "flat_s": round(s_flat, 2)},
        "decode": speed,
    }, indent=1))


if __name__ == "__main__":
    main()
