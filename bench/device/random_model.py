"""Write a model directory with the tokenizer and chat template of MODEL_JSON and random weights:

    python3 bench/device/random_model.py MODEL_JSON OUT_DIR [--preset smollm2|1.5b|small] [--seed N]

For a machine the real weights cannot travel to (the device tool carries 64 MiB; SmolLM2's shards are 94 MiB,
the synthetic 1.5B model's 837 MiB): `generate --backend wgpu` on it times the very kernels, buffers and plan
such a model uses; its text is noise. Presets:
  smollm2  MODEL_JSON's own shapes (SmolLM2-135M: Q8_0 embedding, Q4_1 matrices, f32 norms);
  1.5b     pagedkv.model.synthetic's "1.5b" preset (hidden 2048, 24 layers, 8 KV heads, every matrix Q4_K,
           SmolLM2's vocabulary, so MODEL_JSON's tokenizer serves it), its bytes made as synthetic.py makes
           them but written as a model directory directly (no gguf package, no SmolLM2 GGUF download);
  small    2 layers at hidden 256, Q4_1 / Q8_0, MODEL_JSON's vocabulary: the quick check on a software adapter.
Every row of every matrix is drawn on its own (no repeated block): with the LM head tied to the embedding,
a repeated block made the logits repeat every 64 ids and greedy decoding reach <|im_end|> within a few tokens.
The same preset and seed give the same bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "py")]

from pagedkv.model.config import ModelConfig  # noqa: E402
from pagedkv.model.layout import pack_float, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0  # noqa: E402
from pagedkv.model.quants import pack_gguf  # noqa: E402
from pagedkv.model.synthetic import PRESETS, random_q4_k  # noqa: E402
from pagedkv.model.weights import expected_shapes  # noqa: E402
from pagedkv.model.writer import PackedTensor, write_model  # noqa: E402

CHUNK_ROWS = 4096  # rows quantized at a time (bounds the float copy of the 49,152-row embedding)


def untiled(dtype: str, rows: int, cols: int, rng: np.random.Generator) -> dict[str, bytes]:
    """Parts of a random (rows, cols) Q4_1 / Q8_0 matrix, N(0, 1 / cols) (unit-RMS inputs give unit-size
    outputs), every row drawn on its own."""
    quantize = quantize_q4_1 if dtype == "q4_1" else quantize_q8_0
    chunks = [quantize(rng.standard_normal((min(CHUNK_ROWS, rows - r), cols), dtype=np.float32)
                       / np.float32(np.sqrt(cols))) for r in range(0, rows, CHUNK_ROWS)]
    codes = [np.concatenate(part) for part in zip(*chunks)]
    return pack_q4_1(*codes) if dtype == "q4_1" else pack_q8_0(*codes)


def random_tensors(config: ModelConfig, k_quants: bool, seed: int) -> list[PackedTensor]:
    """Every tensor of `config`: f32 norms near 1, matrices Q4_K (k_quants) or Q8_0 embedding and Q4_1 rest."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape in expected_shapes(config).items():
        if len(shape) == 1:
            norm = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            out.append(PackedTensor(name, "f32", shape, pack_float(norm, "f32")))
        elif k_quants:
            out.append(PackedTensor(name, "q4_K", shape, pack_gguf("q4_K", random_q4_k(rng, *shape), shape)))
        else:
            dtype = "q8_0" if name == "token_embd.weight" else "q4_1"
            out.append(PackedTensor(name, dtype, shape, untiled(dtype, *shape, rng)))
    return out


def preset_config(preset: str, own: ModelConfig) -> ModelConfig:
    if preset == "smollm2":
        return own
    if preset == "1.5b":
        return PRESETS["1.5b"]
    return replace(own, n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512)  # small


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_json", type=Path, help="a model.json whose tokenizer and chat template to use")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--preset", choices=("smollm2", "1.5b", "small"), default="smollm2")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    manifest = json.loads(args.model_json.read_text(encoding="utf-8"))
    config = preset_config(args.preset, ModelConfig.from_json(manifest["config"]))
    vocab = len(manifest["tokenizer"]["tokens"])
    if vocab != config.vocab:
        sys.exit(f"preset {args.preset} has vocab {config.vocab}; {args.model_json}'s tokenizer {vocab}")
    source = {"file": f"random weights (preset {args.preset}, seed {args.seed}), the tokenizer of "
                      f"{manifest['source'].get('file')}", "sha256": None}
    tensors = random_tensors(config, args.preset == "1.5b", args.seed)
    write_model(args.out_dir, config, tensors, manifest["tokenizer"], manifest["chat_template"], source)
    size = sum(f.stat().st_size for f in args.out_dir.iterdir())
    print(json.dumps({"model": str(args.out_dir), "preset": args.preset, "seed": args.seed, "bytes": size,
                      "n_layers": config.n_layers, "hidden": config.hidden, "vocab": config.vocab,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
