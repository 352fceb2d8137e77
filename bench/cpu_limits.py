"""How far the tab's CPU path is from what this machine's cores can do (issue 31's limit fractions).

    python3 -m bench.cpu_limits [--wllama bench/results/wllama.json] [--gemma bench/results/wllama_gemma3.json]

The cores' limits, measured in WebAssembly SIMD under Node on 1 and every core at once (bench/page/cpu_limits.wat:
a streaming read of 512 MiB, and f32x4 multiplies and adds on 12 independent chains), against what the page's
default row of the last `python3 -m bench --only wllama` (the tab's CPU path, SmolLM2-135M, 512-token prompt,
128 new) achieved, and under "gemma3" the same of `--only wllama_gemma3` (Gemma 3 270M): decode as bytes a step
reads (the kernel's weight blocks once, the tied head included, plus the f32 K and V of the mean context, a window
layer's only within its window) times tok/s over the stream rate; prefill as flops a token (two a weight of every
projection, q . k and p @ v over the mean causal context, a window layer's within its window; the head only once
a prompt) times tok/s over the multiply-add rate. Prints JSON (`python3 -m bench` files it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from bench import RESULTS, ROOT, emit
from pagedkv.backends.cpu_wasm import HELD_AS, d_pad
from pagedkv.model.config import ModelConfig

MODEL = ROOT / "dist" / "models" / "smollm2-135m-instruct" / "model.json"
GEMMA3 = ROOT / "dist" / "models" / "gemma-3-270m" / "model.json"
# bytes a 32-weight block of each GGUF type takes in the kernel's layout (backends/cpu_wasm.py, HELD_AS): 4-bit
# codes (q4_1's layout) or 8-bit ones, plus f32 (d, m) or (d0, d1)
BLOCK_BYTES = {dtype: (16 if layout == "q4_1" else 32) + 8 for dtype, layout in HELD_AS.items()}
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def core_limits(threads: list[int]) -> dict:
    """cpu_limits.wat under Node on each thread count: {threads: {stream_gb_s, muladd_gflop_s}}."""
    import build  # wabt's wat2wasm, as the page's kernels are built

    text = (ROOT / "bench" / "page" / "cpu_limits.wat").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        wasm = Path(tmp) / "cpu_limits.wasm"
        wasm.write_bytes(build.wat2wasm(build.with_shared_memory(text), "cpu_limits.wat", ("threads",)))
        out = subprocess.run(["node", str(ROOT / "bench" / "page" / "cpu_limits.mjs"), str(wasm),
                              *map(str, threads)], check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout)


def head_bytes(tensor: dict) -> int:
    """An output head's (and tied embedding's) bytes in the kernel's layout with the tab's default integer
    activations: a q8_0 one as q8_d (cpu_wasm.head_blocks), d without the zero m, each row its nb f32 d padded to
    16 bytes then its codes (cpu_wasm.d_rows); any other type as BLOCK_BYTES."""
    rows, cols = tensor["shape"]
    if tensor["dtype"] == "q8_0":
        return rows * (d_pad(cols // 32) + cols)
    return rows * cols // 32 * BLOCK_BYTES[tensor["dtype"]]


def model_costs(manifest: dict, prompt: int, new: int) -> dict:
    """Bytes a decode step reads and flops a prefill token costs on the tab's CPU path (see the docstring)."""
    cfg, tensors = manifest["config"], manifest["tensors"]
    windows = [layer.attention.window for layer in ModelConfig.from_json(cfg).layers]  # None: every key
    held = ["token_embd.weight"] + [f"blk.{i}.{p}.weight" for i in range(cfg["n_layers"]) for p in PROJECTIONS]
    if not cfg["tied_embeddings"]:
        held.append("output.weight")
    weight_bytes = sum(head_bytes(tensors[n]) if n in ("token_embd.weight", "output.weight")
                       else tensors[n]["shape"][0] * tensors[n]["shape"][1] // 32 * BLOCK_BYTES[tensors[n]["dtype"]]
                       for n in held)
    layer_macs = sum(tensors[f"blk.0.{p}.weight"]["shape"][0] * tensors[f"blk.0.{p}.weight"]["shape"][1]
                     for p in PROJECTIONS)
    head_macs = cfg["vocab"] * cfg["hidden"]
    q_width, kv_width = cfg["n_heads"] * cfg["head_dim"], cfg["n_kv_heads"] * cfg["head_dim"]
    decode_ctx = prompt + new / 2  # the mean context of the decode steps
    # the keys a decode step's layer reads, and a prompt token's layer sees on average (i + 1 for token i; a
    # window layer's at most its window)
    decode_keys = sum(decode_ctx if w is None else min(decode_ctx, w) for w in windows)
    prefill_keys = sum(sum(min(i, w or i) for i in range(1, prompt + 1)) / prompt for w in windows)
    return {"weight_bytes": weight_bytes,
            "decode_bytes_per_step": weight_bytes + 2 * kv_width * 4 * decode_keys,
            "prefill_flop_per_token": 2 * cfg["n_layers"] * layer_macs + 2 * 2 * q_width * prefill_keys
            + 2 * head_macs / prompt}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wllama", type=Path, default=RESULTS / "wllama.json",
                        help="the bench.wllama result whose default row is measured against the limits")
    parser.add_argument("--gemma", type=Path, default=RESULTS / "wllama_gemma3.json",
                        help="the bench.wllama --gguf gemma3 result, the same for Gemma 3 270M")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    limits = core_limits(sorted({1, cores}))
    best = limits["threads"][str(cores)]
    emit({"benchmark": "cpu_limits", "cores": cores, "limits": limits,
          **fractions(json.loads(args.wllama.read_text()), json.loads(MODEL.read_text()), best),
          "gemma3": fractions(json.loads(args.gemma.read_text()), json.loads(GEMMA3.read_text()), best)})
    return 0


def fractions(run: dict, manifest: dict, best: dict) -> dict:
    """A bench.wllama run's default row (its file's own model: the first ?backend=auto row) against the cores'
    limits on every core: costs, the row, decode's GB/s over the stream rate, prefill's GFLOP/s over the
    multiply-add rate."""
    row = next(r for r in run["ours"] if r.get("asked") == "auto")
    costs = model_costs(manifest, run["prompt_tokens"], run["new_tokens"])
    decode_gb_s = costs["decode_bytes_per_step"] * row["decode_tok_s"] / 1e9
    prefill_gflop_s = costs["prefill_flop_per_token"] * row["prefill_tok_s"] / 1e9
    return {"costs": costs,
            "tab_row": {"backend": row["backend"], "cpu_linear": row.get("cpu_linear"), "when": run.get("when"),
                        "prefill_tok_s": row["prefill_tok_s"], "decode_tok_s": row["decode_tok_s"]},
            "decode": {"achieved_gb_s": round(decode_gb_s, 2), "stream_gb_s": best["stream_gb_s"],
                       "fraction": round(decode_gb_s / best["stream_gb_s"], 3)},
            "prefill": {"achieved_gflop_s": round(prefill_gflop_s, 2), "muladd_gflop_s": best["muladd_gflop_s"],
                        "fraction": round(prefill_gflop_s / best["muladd_gflop_s"], 3)}}


if __name__ == "__main__":
    raise SystemExit(main())
