"""Tokenizer speed: build time, encode tokens/s (cold and warm word cache), decode tokens/s.

Prints one JSON object. Runs under CPython and under Pyodide (it only needs
the engine's ``pagedkv.tokenizer`` and a JSON file with the manifest's
``tokenizer`` section), so the same figures can be taken in both.

CPython:  python3 bench/bench_tokenizer.py [--sections FILE] [--repeat N] [--write-sections FILE]
  Without --sections, the sections are read from the SmolLM2 GGUF via the
  test helper (tests/gguf_tokenizer.py).
Pyodide:  python3 bench/bench_tokenizer.py --write-sections .cache/tokenizer_sections.json
          node bench/page/pyodide_bench_tokenizer.mjs .cache/tokenizer_sections.json
Per vocabulary kind: python3 bench/bench_tokenizer.py --kinds [--repeat N]
  One JSON line per kind, on a 4K-token prompt (CPython). Kinds: the synthetic vocabularies of the llama.cpp
  agreement tests (tests/tokenizer_vocabs.py: byte-level BPE with each pre-tokenizer, and SentencePiece) plus
  SmolLM2's real one. The text is the golden corpus (prose, code, whitespace, 10+ scripts, emoji), cut to about
  4,096 tokens of that vocabulary; the same figures as run() (cold and warm word cache, decode).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_TOKENS = 4096  # --kinds


def bench_text() -> str:
    """Every golden text (prose, code, whitespace, 10+ scripts, emoji, fuzz), one per line."""
    golden = json.loads((ROOT / "tests" / "golden" / "tokenizer_golden.json").read_text(encoding="utf-8"))
    return "\n".join(e["text"] for e in golden["entries"])


def run(sections: dict, text: str, repeat: int) -> dict:
    from pagedkv.tokenizer import Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer.from_manifest(sections)
    build_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    ids = tok.encode(text)
    cold_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    for _ in range(repeat):
        tok.encode(text)
    warm_s = (time.perf_counter() - t0) / repeat

    t0 = time.perf_counter()
    for _ in range(repeat):
        tok.decode(ids)
    decode_s = (time.perf_counter() - t0) / repeat

    t0 = time.perf_counter()
    stream = tok.stream_decoder()
    for token_id in ids:
        stream.push(token_id)
    stream.flush()
    stream_s = time.perf_counter() - t0

    return {
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.platform})",
        "text_chars": len(text),
        "tokens": len(ids),
        "build_s": round(build_s, 4),
        "encode_cold_tokens_per_s": round(len(ids) / cold_s),
        "encode_warm_tokens_per_s": round(len(ids) / warm_s),
        "decode_tokens_per_s": round(len(ids) / decode_s),
        "stream_decode_tokens_per_s": round(len(ids) / stream_s),
    }


def prompt_of(tokenizer, text: str) -> str:
    """The longest prefix of ``text`` (cut at a line end) holding at most TARGET_TOKENS tokens."""
    lines = text.split("\n")
    lo, hi = 1, len(lines)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode("\n".join(lines[:mid]))) <= TARGET_TOKENS:
            lo = mid
        else:
            hi = mid - 1
    return "\n".join(lines[:lo])


def kinds(repeat: int) -> None:
    """Print one JSON line of run()'s figures per vocabulary kind (module docstring)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_tokenizer import gguf_manifest_sections
    from tokenizer_vocabs import BPE_FAMILIES, bpe_vocab, spm_vocab

    from pagedkv.tokenizer import Tokenizer

    vocabs = {f"gpt2/{pre}": {"tokenizer": bpe_vocab(pre)} for pre in BPE_FAMILIES}
    vocabs["llama (SentencePiece)"] = {"tokenizer": spm_vocab()}
    vocabs["SmolLM2-135M (real)"] = gguf_manifest_sections()
    text = bench_text()
    for name, sections in vocabs.items():
        prompt = prompt_of(Tokenizer.from_manifest(sections), text)
        print(json.dumps({"kind": name, "vocab": len(sections["tokenizer"]["tokens"]), **run(sections, prompt, repeat)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", type=Path, help="JSON file holding {'tokenizer': {...}}")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write-sections", type=Path, help="also save the GGUF's sections here (for the Pyodide run)")
    parser.add_argument("--quick", action="store_true", help="--repeat 2")
    parser.add_argument("--kinds", action="store_true", help="one JSON line per vocabulary kind instead")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 2
    sys.path.insert(0, str(ROOT / "py"))
    if args.kinds:
        kinds(args.repeat)
        return
    if args.sections:
        sections = json.loads(args.sections.read_text(encoding="utf-8"))
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from gguf_tokenizer import gguf_manifest_sections

        sections = gguf_manifest_sections()
    if args.write_sections:
        args.write_sections.write_text(json.dumps({"tokenizer": sections["tokenizer"]}), encoding="utf-8")
    print(json.dumps(run(sections, bench_text(), args.repeat)))


if __name__ == "__main__":
    main()
