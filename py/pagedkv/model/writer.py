"""Write a model directory: model.json (the manifest) plus binary shards of at most 64 MiB, or of one tensor
larger than that (Gemma 3's tied 262,144-row embedding: 178 MB of Q8_0).

Used by the GGUF converter and the tiny random model alike, so both produce
exactly the format `weights.py` loads. Writes go to a sibling temp directory
that replaces the target only once complete, so a crash never leaves a
half-written model that looks valid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .config import ModelConfig
from .layout import DTYPE_PARTS, LAYOUT_DOC, PART_ALIGN

FORMAT_VERSION = 1
MANIFEST_NAME = "model.json"
MAX_SHARD_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class PackedTensor:
    """One tensor in web layout: its dtype, row-major shape and packed parts (see layout.py)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    parts: dict[str, bytes]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_PARTS:
            raise ValueError(f"tensor {self.name}: unsupported dtype {self.dtype!r}")
        if tuple(self.parts) != DTYPE_PARTS[self.dtype]:
            raise ValueError(f"tensor {self.name}: parts must be {DTYPE_PARTS[self.dtype]}, got {tuple(self.parts)}")


def _align(n: int) -> int:
    return n + (-n % PART_ALIGN)


def _plan_shards(tensors: list[PackedTensor]) -> list[list[tuple[PackedTensor, dict[str, int]]]]:
    """Assign tensors to shards in order; returns per shard [(tensor, {part: offset})]. A tensor larger than a
    shard gets a shard of its own."""
    shards: list[list[tuple[PackedTensor, dict[str, int]]]] = [[]]
    cursor = 0
    for t in tensors:
        size = 0
        for raw in t.parts.values():
            size = _align(size) + len(raw)
        if shards[-1] and _align(cursor) + size > MAX_SHARD_BYTES:
            shards.append([])
            cursor = 0
        offsets = {}
        for part, raw in t.parts.items():
            cursor = _align(cursor)
            offsets[part] = cursor
            cursor += len(raw)
        shards[-1].append((t, offsets))
    return shards


def write_model(
    out_dir: str | os.PathLike,
    config: ModelConfig,
    tensors: list[PackedTensor],
    tokenizer: dict,
    chat_template: str,
    source: dict,
) -> dict:
    """Write shards + model.json into out_dir (replacing it atomically); returns the manifest."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MANIFEST_NAME).is_file():
        raise ValueError(f"refusing to replace {out_dir}: it is not empty and holds no {MANIFEST_NAME}")
    tmp_dir = out_dir.with_name(f"{out_dir.name}.{os.getpid()}.tmp")  # this process's own
    if tmp_dir.exists():
        shutil.rmtree(tmp_dir)
    tmp_dir.mkdir(parents=True)
    manifest_tensors: dict[str, dict] = {}
    manifest_shards: list[dict] = []
    for index, shard in enumerate(_plan_shards(tensors)):
        file_name = f"shard-{index:03d}.bin"
        buf = bytearray()
        for t, offsets in shard:
            for part, raw in t.parts.items():
                buf.extend(b"\0" * (offsets[part] - len(buf)))
                buf.extend(raw)
            start = offsets[next(iter(t.parts))]
            end = len(buf)
            manifest_tensors[t.name] = {
                "dtype": t.dtype,
                "shape": list(t.shape),
                "file": file_name,
                "offset": start,
                "nbytes": end - start,
                "sha256": hashlib.sha256(buf[start:end]).hexdigest(),
                "parts": {p: {"offset": offsets[p], "nbytes": len(t.parts[p])} for p in t.parts},
            }
        (tmp_dir / file_name).write_bytes(buf)
        manifest_shards.append({"file": file_name, "nbytes": len(buf), "sha256": hashlib.sha256(buf).hexdigest()})
    manifest = {
        "format_version": FORMAT_VERSION,
        "source": source,
        "config": config.to_json(),
        "layout": LAYOUT_DOC,
        "shards": manifest_shards,
        "tensors": manifest_tensors,
        "tokenizer": tokenizer,
        "chat_template": chat_template,
    }
    (tmp_dir / MANIFEST_NAME).write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp_dir.rename(out_dir)
    return manifest
