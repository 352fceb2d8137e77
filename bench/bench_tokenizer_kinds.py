"""Tokenizer speed per vocabulary kind on a 4K-token prompt (CPython), one JSON line per kind.

Kinds: the synthetic vocabularies of the llama.cpp agreement tests
(tests/tokenizer_vocabs.py: byte-level BPE with each pre-tokenizer, and
SentencePiece) plus SmolLM2's real one. The text is the golden corpus
(prose, code, whitespace, 10+ scripts, emoji), cut to about 4,096 tokens of
that vocabulary; figures come from bench_tokenizer.run (cold and warm word
cache, decode).

    python3 bench/bench_tokenizer_kinds.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_TOKENS = 4096


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for path in ("py", "tests", "bench"):
        sys.path.insert(0, str(ROOT / path))
    from bench_tokenizer import bench_text, run
    from gguf_tokenizer import gguf_manifest_sections
    from tokenizer_vocabs import BPE_FAMILIES, bpe_vocab, spm_vocab

    from pagedkv.tokenizer import Tokenizer

    kinds = {f"gpt2/{pre}": {"tokenizer": bpe_vocab(pre)} for pre in BPE_FAMILIES}
    kinds["llama (SentencePiece)"] = {"tokenizer": spm_vocab()}
    kinds["SmolLM2-135M (real)"] = gguf_manifest_sections()
    text = bench_text()
    for name, sections in kinds.items():
        prompt = prompt_of(Tokenizer.from_manifest(sections), text)
        print(json.dumps({"kind": name, "vocab": len(sections["tokenizer"]["tokens"]), **run(sections, prompt, args.repeat)}))


if __name__ == "__main__":
    main()
