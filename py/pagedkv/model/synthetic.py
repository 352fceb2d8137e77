"""Synthetic llama GGUFs with random Q4_K weights: the seeds' regime (a model filling most of 1 GiB) measured
with real bytes in the ledger.

    python3 -m pagedkv.model.synthetic --out FILE [--preset 1.5b|tiny] [--seed N] [--models-cache DIR]

Preset "1.5b": SmolLM2-1.7B's widths (hidden 2048, 24 layers, 32 query heads of 64, ffn 8192, vocab 49,152
with SmolLM2's own tokenizer and chat template, tied embedding) with 8 KV heads instead of 32 (GQA, as
Qwen2.5 and Llama 3 use): 1.56 B weights, every matrix Q4_K (4.5 bits a weight): 837.4 MiB in the file.
In a 1 GiB budget the ledger (bench/model_ledger.py) holds weights 837.8 MiB + scratch 33.5 + staging 5.0 =
876.3 MiB, and the KV pool gets 147.0 MiB: 196 blocks of 16 tokens, 3,136 tokens at 49,152 B/token (f16),
the seeds' regime. SmolLM2-1.7B's own 32 KV heads would add 81 MiB of weights and make a token 196,608 B:
about 65 MiB, some 350 tokens, would be left, not one 2,048-token contiguous reservation. Preset "tiny":
the same generator at hidden 256 (2 layers, tiny.py's 512-token tokenizer) for tests.

The Q4_K blocks are written directly, never quantized from floats (1.5 B floats would take minutes and
6 GB): uniformly random 4-bit codes and 6-bit scale / min codes, and per block d = base x U[1, 1.5) and
dmin = 7.5 d (f16). A weight is d * sc * q - dmin * m; with uniform codes its mean is 0 (31.5 * 7.5 d -
7.5 d * 31.5) and its standard deviation ~257 d, so base = 1 / (257 sqrt(cols)) gives a row's dot product
with a unit-RMS input a standard deviation near 1 (the usual 1 / sqrt(fan-in) scale) and finite
activations through every layer. base is at least 2^-14 so that d is never an f16 subnormal (GPUs may flush
those to zero, and the numpy and WebGPU forwards must read the same weights). Norm weights are F32 near 1.
The same preset and seed give the same bytes.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .config import ModelConfig
from .quants import QK_K, WEIGHT_TYPES
from .tiny import TINY_CHAT_TEMPLATE, mixed_config, tiny_tokenizer
from .weights import expected_shapes

GENERATOR_VERSION = 1  # part of the cached file's name: bump when the bytes written change
Q4_K_BYTES = WEIGHT_TYPES["q4_K"].block_bytes  # d, dmin (f16), 12 bytes of 6-bit scales / mins, 128 of nibbles
F16_MIN_NORMAL = 2.0 ** -14
CODE_STD = 257.0  # std of sc * q - 7.5 * m over uniform 6-bit sc, m and 4-bit q, in units of d

PRESETS = {
    "1.5b": ModelConfig(
        architecture="llama", n_layers=24, hidden=2048, n_heads=32, n_kv_heads=8, head_dim=64, ffn=8192,
        vocab=49152, rope_base=130000.0, rope_convention="adjacent_pairs", rms_eps=1e-5, context_length=8192,
        tied_embeddings=True,
    ),  # fmt: skip
    "tiny": replace(mixed_config(), context_length=512),
}


def random_q4_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """(rows, cols / 256 * 144) u8: GGUF Q4_K blocks with random codes and d / dmin as the module docstring says."""
    if cols % QK_K:
        raise ValueError(f"Q4_K needs a row length that is a multiple of {QK_K}, got {cols}")
    blocks = rows * (cols // QK_K)
    raw = np.frombuffer(rng.bytes(blocks * Q4_K_BYTES), np.uint8).reshape(blocks, Q4_K_BYTES).copy()
    base = max(F16_MIN_NORMAL, 1.0 / (CODE_STD * np.sqrt(cols)))
    d = (base * rng.uniform(1.0, 1.5, blocks)).astype(np.float16)  # (blocks,)
    dmin = (7.5 * d.astype(np.float32)).astype(np.float16)  # (blocks,)
    raw[:, 0:2] = d.view(np.uint8).reshape(blocks, 2)
    raw[:, 2:4] = dmin.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(rows, -1)


def smollm2_tokenizer(models_cache: str | os.PathLike) -> tuple[dict, str]:
    """SmolLM2's tokenizer section and chat template, read from the pinned SmolLM2-135M GGUF (convert.py)."""
    from .convert import fetch_smollm2_gguf, metadata_field, open_gguf, tokenizer_from_gguf

    reader = open_gguf(fetch_smollm2_gguf(models_cache))
    return tokenizer_from_gguf(reader), metadata_field(reader, "tokenizer.chat_template")


def write_llama_metadata(writer, config: ModelConfig, tokenizer: dict, chat_template: str,
                         name: str | None = None) -> None:
    """The keys convert.py reads, to a gguf.GGUFWriter: general.name if given, the hyper-parameters under
    "llama.", then the tokenizer (a manifest's tokenizer section) and the chat template."""
    if name is not None:
        writer.add_name(name)
    for key, value in (("block_count", config.n_layers), ("context_length", config.context_length),
                       ("embedding_length", config.hidden), ("feed_forward_length", config.ffn),
                       ("attention.head_count", config.n_heads), ("attention.head_count_kv", config.n_kv_heads),
                       ("rope.dimension_count", config.head_dim)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.rope.freq_base", config.rope_base)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", config.rms_eps)
    writer.add_string("tokenizer.ggml.model", tokenizer["model"])
    writer.add_string("tokenizer.ggml.pre", tokenizer["pre"])
    writer.add_array("tokenizer.ggml.tokens", tokenizer["tokens"])
    writer.add_array("tokenizer.ggml.token_type", tokenizer["token_types"])
    writer.add_array("tokenizer.ggml.merges", tokenizer["merges"])
    for key in ("bos", "eos", "unknown", "padding"):
        if tokenizer.get(f"{key}_token_id") is not None:
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", tokenizer[f"{key}_token_id"])
    writer.add_string("tokenizer.chat_template", chat_template)


def write_synthetic_gguf(path: str | os.PathLike, preset: str = "1.5b", seed: int = 0,
                         models_cache: str | os.PathLike | None = None) -> ModelConfig:
    """Write the preset's GGUF to `path` (through path + ".tmp", renamed when complete); returns its config.
    models_cache: where the SmolLM2 GGUF (the "1.5b" preset's tokenizer) is kept or downloaded to."""
    import gguf  # the GGUF writer: a CPython build / test dependency, never used in the page

    if preset not in PRESETS:
        raise ValueError(f"unknown synthetic preset {preset!r}; presets: {sorted(PRESETS)}")
    config = PRESETS[preset]
    if preset == "tiny":
        tokenizer, template = tiny_tokenizer(), TINY_CHAT_TEMPLATE
    else:
        if models_cache is None:
            raise ValueError("the 1.5b preset needs models_cache: the folder holding (or to hold) SmolLM2's GGUF")
        tokenizer, template = smollm2_tokenizer(models_cache)
    if len(tokenizer["tokens"]) != config.vocab:
        raise ValueError(f"preset {preset} has vocab {config.vocab} but its tokenizer {len(tokenizer['tokens'])}")
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    write_llama_metadata(writer, config, tokenizer, template, f"synthetic-{preset}-seed{seed}")
    shapes = expected_shapes(config)
    for name, shape in shapes.items():
        if len(shape) == 1:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            row_bytes = shape[1] // QK_K * Q4_K_BYTES
            writer.add_tensor_info(name, (shape[0], row_bytes), np.dtype(np.uint8), shape[0] * row_bytes,
                                   raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for shape in shapes.values():  # one tensor in memory at a time, in the order of the infos
        if len(shape) == 1:
            writer.write_tensor_data((1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
        else:
            writer.write_tensor_data(random_q4_k(rng, *shape))
    writer.close()
    tmp.replace(path)
    return config


def cached_synthetic_gguf(cache_dir: str | os.PathLike, preset: str = "1.5b", seed: int = 0,
                          models_cache: str | os.PathLike | None = None) -> Path:
    """The preset's GGUF under cache_dir, written on first use (the name carries preset, seed and version)."""
    path = Path(cache_dir) / f"synthetic-{preset}-seed{seed}-v{GENERATOR_VERSION}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_gguf(path, preset, seed, models_cache)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the GGUF file to write")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="1.5b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models-cache", type=Path, default=Path(".cache/models"),
                    help="where SmolLM2's GGUF (the tokenizer of the 1.5b preset) is kept (default: %(default)s)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    write_synthetic_gguf(args.out, args.preset, args.seed, args.models_cache)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes) in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
