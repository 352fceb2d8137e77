"""llama.cpp itself, native (the server the `xllamacpp` wheel embeds, requirements-dev), on the GGUF that
bench.wllama gives wllama and the tab: the row the tab's CPU path is measured against (issue 51). The same
prompt ids as our engine, greedy, on the same thread count; llama.cpp's own prompt and generation timings.

    python3 -m bench.native_llama [--prompt 512] [--new 128] [--threads N] [--gguf q4_1|q4_k_m|gemma3]

bench.wllama runs it as its `native` row (the same run as the tab's and wllama's rows); alone, it prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from importlib.metadata import version
from pathlib import Path

from bench import ROOT, emit

WARM_TOKENS = 8  # a first short request: the server's first-call allocations stay out of the timed one


def complete(origin: str, prompt: list[int], new_tokens: int) -> dict:
    """One greedy completion of `prompt` (ids, no template), `new_tokens` long whatever the ids (EOS ignored)."""
    body = {"prompt": prompt, "n_predict": new_tokens, "temperature": 0, "cache_prompt": False, "ignore_eos": True,
            "return_tokens": True}
    req = urllib.request.Request(origin + "/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as resp:
        answer = json.loads(resp.read())
    if answer["tokens_evaluated"] != len(prompt) or len(answer["tokens"]) != new_tokens:
        raise RuntimeError(f"llama.cpp evaluated {answer['tokens_evaluated']} prompt tokens (sent {len(prompt)}) "
                           f"and returned {len(answer['tokens'])} ids (asked {new_tokens})")
    return answer


def native_row(gguf: Path, prompt: list[int], new_tokens: int, threads: int) -> dict:
    """Prefill / decode tok/s (llama.cpp's timings of the timed request) and the greedy ids of the native server
    on `gguf` at `threads` threads, after a warm-up request."""
    sys.path.insert(0, str(ROOT / "tests"))
    from llama_server import llama_server

    n_ctx = 1024 if len(prompt) + new_tokens <= 1024 else -(-(len(prompt) + new_tokens) // 1024) * 1024
    with llama_server(gguf, n_ctx, threads) as origin:
        complete(origin, prompt[:WARM_TOKENS], 2)
        answer = complete(origin, prompt, new_tokens)
    t = answer["timings"]
    return {"backend": f"llama.cpp native, {threads} thread{'s' if threads > 1 else ''}", "threads": threads,
            "xllamacpp_version": version("xllamacpp"), "prefill_tok_s": t["prompt_per_second"],
            "decode_tok_s": t["predicted_per_second"], "timings": t, "output_ids": answer["tokens"]}


def main(argv: list[str] | None = None) -> int:
    from bench.wllama import GEMMA3_MODEL, GGUFS, gguf_path, prompt_text

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--gguf", choices=GGUFS, default="q4_1")
    args = parser.parse_args(argv)
    model_dir = ROOT / "dist" / "models" / (GEMMA3_MODEL if args.gguf == "gemma3" else "smollm2-135m-instruct")
    _, prompt = prompt_text(args.prompt, model_dir)
    emit({"benchmark": "native_llama", "gguf": gguf_path(args.gguf).name, "prompt_tokens": args.prompt,
          "new_tokens": args.new, **native_row(gguf_path(args.gguf), prompt, args.new, args.threads)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
