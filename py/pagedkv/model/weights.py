"""Load a model directory: manifest checks, sha256 verification of shards, dequantization to f32.

Runs in CPython and Pyodide (numpy + hashlib only). In the browser the JS side
fetches shard bytes and hands them to `ModelWeights.from_shards`; in CPython
`ModelWeights.load(model_dir)` reads them from disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import ModelConfig
from .layout import DTYPE_PARTS, dequantize
from .writer import FORMAT_VERSION, MANIFEST_NAME


class WeightsError(ValueError):
    """A model directory is missing, truncated, tampered with or not in a supported format."""


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> row-major shape that a model with `config` must have (its family's layer tensors)."""
    h = config.hidden
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (config.vocab, h), "output_norm.weight": (h,)}
    if not config.tied_embeddings:
        shapes["output.weight"] = (config.vocab, h)
    per_layer = config.family.layer_tensors(config)
    for i in range(config.n_layers):
        for name, shape in per_layer.items():
            shapes[f"blk.{i}.{name}.weight"] = shape
        if config.attention_bias:
            for name in ("attn_q", "attn_k", "attn_v"):
                shapes[f"blk.{i}.{name}.bias"] = (per_layer[name][0],)
    return shapes


def read_manifest(model_dir: str | os.PathLike) -> dict:
    """Parse model_dir/model.json; raises WeightsError naming the path if absent or malformed."""
    path = Path(model_dir) / MANIFEST_NAME
    if not path.is_file():
        raise WeightsError(f"no model manifest at {path}; build the model first (python3 build.py)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"model manifest {path} is not valid JSON: {exc}") from exc


def check_manifest(manifest: dict) -> ModelConfig:
    """Validate the manifest's version, config and tensor table; returns the ModelConfig."""
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise WeightsError(f"model format_version {version!r} is not supported (expected {FORMAT_VERSION})")
    try:
        config = ModelConfig.from_json(manifest["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WeightsError(f"model config invalid: {exc}") from exc
    tensors = manifest.get("tensors", {})
    shapes = expected_shapes(config)
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        raise WeightsError(f"model is missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    shard_files = {s["file"] for s in manifest.get("shards", [])}
    for name, shape in shapes.items():
        entry = tensors[name]
        if entry["dtype"] not in DTYPE_PARTS:
            raise WeightsError(f"tensor {name}: unsupported dtype {entry['dtype']!r}; supported: {sorted(DTYPE_PARTS)}")
        if tuple(entry["shape"]) != shape:
            raise WeightsError(f"tensor {name}: shape {entry['shape']} does not match config (expected {list(shape)})")
        if entry["file"] not in shard_files:
            raise WeightsError(f"tensor {name}: shard {entry['file']!r} is not listed in the manifest's shards")
    return config


def verify_shard(entry: dict, data: bytes | memoryview) -> None:
    """Check one shard's length and sha256 against its manifest entry."""
    if len(data) != entry["nbytes"]:
        raise WeightsError(f"shard {entry['file']} is truncated or padded: {len(data)} bytes, manifest says {entry['nbytes']}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise WeightsError(f"shard {entry['file']} sha256 mismatch: got {digest}, manifest says {entry['sha256']}")


def tensor_parts(entry: dict, shard: bytes | memoryview) -> dict[str, memoryview]:
    """Byte views of one tensor's parts inside its (already verified) shard."""
    view = memoryview(shard)
    return {p: view[loc["offset"] : loc["offset"] + loc["nbytes"]] for p, loc in entry["parts"].items()}


@dataclass(frozen=True)
class ModelWeights:
    """A verified model: its config, manifest and every tensor dequantized to f32."""

    config: ModelConfig
    manifest: dict
    tensors: dict[str, np.ndarray]

    @classmethod
    def from_shards(cls, manifest: dict, shards: dict[str, bytes | memoryview], convert=None) -> "ModelWeights":
        """Verify shard bytes (file name -> bytes) against the manifest and dequantize every tensor (or hand
        it to convert(name, dtype, shape, parts), which returns what to hold: backends/cpu_wasm.py)."""
        config = check_manifest(manifest)
        for entry in manifest["shards"]:
            if entry["file"] not in shards:
                raise WeightsError(f"shard {entry['file']} was not provided")
            verify_shard(entry, shards[entry["file"]])
        tensors = {}
        for name, shape in expected_shapes(config).items():
            entry = manifest["tensors"][name]
            parts = tensor_parts(entry, shards[entry["file"]])
            tensors[name] = (convert or (lambda _, *a: dequantize(*a)))(name, entry["dtype"], shape, parts)
        return cls(config=config, manifest=manifest, tensors=tensors)

    @classmethod
    def load(cls, model_dir: str | os.PathLike, convert=None) -> "ModelWeights":
        """Read, verify and dequantize (or convert: from_shards) the model in model_dir."""
        manifest = read_manifest(model_dir)
        check_manifest(manifest)
        shards = {}
        for entry in manifest["shards"]:
            path = Path(model_dir) / entry["file"]
            if not path.is_file():
                raise WeightsError(f"shard {path} is missing; rebuild the model (python3 build.py)")
            shards[entry["file"]] = path.read_bytes()
        return cls.from_shards(manifest, shards, convert)
