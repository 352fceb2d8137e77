"""One long chat past the model's 8,192-token context, in the browser: WebGPU backend, sliding window + sinks.

    python3 build.py && python3 -m bench.long_chat             (full run: ~40+ min on SwiftShader)
    python3 -m bench.long_chat --cpu-reference                 (the same tokens on the numpy CPU engine)
    python3 -m bench.long_chat --quick                         (same code, 128-token context: about a minute)

Headless Chromium, WebGPU (SwiftShader here), the real SmolLM2-135M on WebGpuBackend (1 GiB ledger, f16 KV,
block size 16 like the app), one LLMEngine request with KVRetention(window_tokens=1024, sink_tokens=4):
  1. the conversation so far: the first 8,192 tokens of the corpus (CPython's pydoc_data/topics.py, as in
     bench/kv_quality_window.py) as one prompt, prefilled in chunks; past 1,024 tokens every step drops the
     blocks that left the window back to the pool and re-rotates the cached keys (shifted positions);
  2. the continuation: the next 512 corpus tokens teacher-forced through ordinary decode steps of the same
     request (a ForcedSampler emits them and scores each step's full logits): perplexity of corpus tokens
     8,192..8,703, each predicted from everything before it as the window leaves it;
  3. a greedy reply of 48 tokens past that, as text.
Also the most KV blocks the sequence held (bound: ceil((S + W) / block_size) + 1), the blocks freed, the
wall time. --cpu-reference scores the same 512 tokens on the numpy CPU engine (f32 KV, same window, sinks,
block size; pagedkv.evaluate) and the two runs are compared in the same JSON: their
perplexities and their greedy next-token agreement over the continuation.
Prints the JSON: under `python3 -m bench` (`--only long_chat`, then `--only long_chat -- --cpu-reference`) each
mode merges its part into the result it replaces. The figures so far go to stderr after every page call, so a
run stopped early leaves what it measured in its log. Timings are wall clock on a shared machine: noisy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from bench import ROOT, previous_result
from bench.kv_quality_window import corpus_tokens, ppl
from pagedkv.evaluate import evaluate
from pagedkv.kv.retention import KVRetention
from pagedkv.model.weights import ModelWeights, read_manifest
from pagedkv.tokenizer import Tokenizer

MODEL = "smollm2-135m-instruct"
CORPUS = "CPython pydoc_data/topics.py (topics sorted, joined by blank lines)"
SLICE_S = 120  # engine time per page call; progress is printed between calls


def settings(args) -> dict:
    """The run's parameters; a quick run caps the engine's context at 128 tokens (EngineConfig.max_context)."""
    manifest = read_manifest(ROOT / "dist" / "models" / MODEL)
    if args.quick:
        return {"model": MODEL, "context": 128, "max_context": 128, "window": 64, "sinks": 4, "continuation": 32,
                "reply": 8, "block_size": 16, "kv_dtype": "f16", "budget_mib": 1024, "quick": True}
    return {"model": MODEL, "context": manifest["config"]["context_length"], "max_context": None,
            "window": args.window, "sinks": 4, "continuation": args.continuation, "reply": args.reply,
            "block_size": 16, "kv_dtype": "f16", "budget_mib": 1024, "quick": False}


def the_tokens(cfg: dict) -> list[int]:
    manifest = read_manifest(ROOT / "dist" / "models" / cfg["model"])
    return corpus_tokens(Tokenizer.from_manifest(manifest))[:cfg["context"] + cfg["continuation"]]


def browser_run(cfg: dict, tokens: list[int]) -> dict:
    """The conversation in the page's worker (bench/page/long_chat.py); returns its figures, and prints the
    figures so far on stderr after every slice."""
    import build
    from bench.harness import install_bench, session

    t0 = time.perf_counter()
    with session(build_first=not (build.DIST / "index.html").exists()) as s:
        install_bench(s, "page/webgpu_engine.py", "page/long_chat.py")
        s.py("from bench.page.long_chat import LongChat\n"
             f"_chat = await LongChat.start({cfg['model']!r}, {tokens!r}, {cfg['context']}, {cfg['continuation']}, "
             f"{cfg['reply']}, {cfg['window']}, {cfg['sinks']}, {cfg['block_size']}, {cfg['budget_mib']}, "
             f"{cfg['kv_dtype']!r}, {cfg['max_context']!r})\nNone")
        while True:
            p = s.py(f"import json\njson.dumps(await _chat.advance({SLICE_S}))")
            print(f"[{time.perf_counter() - t0:7.0f} s] {p}", file=sys.stderr, flush=True)
            r = s.py("import json\njson.dumps(_chat.result())")
            r["adapter"] = json.loads(s.dataset().get("adapter", "{}")).get("name")
            r["wall_s"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if p["done"]:
                s.py("_chat.engine.backend.destroy()\nNone")  # the page may go on to other benchmarks
                return r


def cpu_run(cfg: dict, tokens: list[int]) -> dict:
    """The same tokens, window, sinks and block size on the numpy CPU engine (f32 KV), all logits kept."""
    t0 = time.perf_counter()
    weights = ModelWeights.load(ROOT / "dist" / "models" / cfg["model"])
    r = KVRetention(window_tokens=cfg["window"], sink_tokens=cfg["sinks"])
    res = evaluate(weights, tokens, r, pool_blocks=r.max_blocks(cfg["block_size"]), block_size=cfg["block_size"])
    scored = slice(cfg["context"] - 1, cfg["context"] - 1 + cfg["continuation"])  # logp[i] predicts tokens[i + 1]
    logp = res["logp"][scored]
    return {"engine": "numpy CPU (f32 KV), scheduler + manager + retention, chunks of up to 256 tokens",
            "logprobs": [round(float(x), 5) for x in logp], "argmax_ids": [int(t) for t in res["greedy"][scored]],
            "ppl_continuation": round(ppl(logp), 3), "ppl_before_context": round(ppl(res["logp"][:scored.start]), 3),
            "max_blocks_held": res["max_blocks_held"], "wall_s": round(time.perf_counter() - t0, 1)}


def merge(doc: dict | None, cfg: dict, part: str, figures: dict) -> dict:
    """Add one run's figures to the earlier result `doc` (kept only when it was made with the same settings)
    and compare the browser run with the CPU reference once both are there."""
    doc = dict(doc or {})
    if doc.get("settings") != cfg:
        doc = {"benchmark": "long_chat", "corpus": CORPUS, "settings": cfg}
    doc["scored"] = (f"corpus tokens {cfg['context']}..{cfg['context'] + cfg['continuation'] - 1}, each predicted "
                     f"from all tokens before it under window {cfg['window']} + {cfg['sinks']} sinks")
    doc[part] = figures
    if "browser" in doc and "cpu_reference" in doc and doc["browser"]["complete"]:
        gpu, cpu = doc["browser"], doc["cpu_reference"]
        doc["comparison"] = {
            "ppl_browser": gpu["ppl_continuation"], "ppl_cpu_reference": cpu["ppl_continuation"],
            "greedy_agreement": round(float(np.mean(np.array(gpu["argmax_ids"]) == np.array(cpu["argmax_ids"]))), 4),
            "max_abs_logprob_diff": round(float(np.max(np.abs(np.array(gpu["logprobs"]) - cpu["logprobs"]))), 4)}
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="128-token context, window 64, 32 scored tokens")
    parser.add_argument("--cpu-reference", action="store_true", help="the numpy CPU run instead of the browser")
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--continuation", type=int, default=512, help="teacher-forced tokens past the context")
    parser.add_argument("--reply", type=int, default=48, help="greedy tokens at the end")
    args = parser.parse_args(argv)
    cfg = settings(args)
    tokens = the_tokens(cfg)
    if args.cpu_reference:
        doc = merge(previous_result(), cfg, "cpu_reference", cpu_run(cfg, tokens))
    else:
        doc = merge(previous_result(), cfg, "browser", browser_run(cfg, tokens))
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
