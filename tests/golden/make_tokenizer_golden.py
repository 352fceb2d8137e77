"""Produce tests/golden/tokenizer_golden.json from independent tokenizer implementations.

Reference 1 (always): Hugging Face ``tokenizers`` built from the GGUF's own
vocab + merges with SmolLM2's tokenizer.json configuration:
  pre_tokenizer = Sequence[Digits(individual_digits=True),
                           ByteLevel(add_prefix_space=False, use_regex=True)]
  model = BPE (no dropout, no byte fallback), all control tokens added as
  special tokens (normalized=False), no normalizer, no post-processor.
Reference 2 (when ``import llama_cpp`` works): llama.cpp's own tokenizer on
the GGUF file, ``tokenize(text, add_bos=False, special=True)``.

Corpus: tokenizer_corpus.json (hand-written cases) plus 300 seeded random
concatenations of FUZZ_PIECES. The golden ids are the reference-1 ids; if llama.cpp is available its ids
are recorded too and every disagreement is listed. Nothing from
``pagedkv`` is used to produce the ids.

Usage: python3 tests/golden/make_tokenizer_golden.py [--gguf PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gguf_tokenizer import find_gguf, gguf_manifest_sections  # noqa: E402


def hf_tokenizer(spec: dict):
    """An HF ``tokenizers.Tokenizer`` equivalent to SmolLM2's tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {}
    for i, token in enumerate(spec["tokens"]):
        vocab.setdefault(token, i)
    merges = [tuple(m.split(" ")) for m in spec["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, kind in zip(spec["tokens"], spec["token_types"]) if kind in (3, 4)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for t in specials:
        assert tok.token_to_id(t) == spec["tokens"].index(t), t
    return tok


# Pieces the fuzz strings are drawn from: every class boundary the
# pre-tokenizer cares about (letters/digits/spaces/punctuation/contractions,
# non-ASCII classes, special-token text and near misses).
FUZZ_PIECES = [
    "a", "Z", "the", " the", "xyz", "0", "7", "42", "3.5", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n",
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'", "\"", "!", "?", ".", ",", "-", "_", "(", ")", "{", "}",
    "==", "->", "#", "@", "$", "%", "&", "*", "/", "\\", "|", "<", ">", "~", "`", "^",
    "é", "ñ", "ß", "Ł", "привет", "Ж", "中", "文字", "カナ", "ひら", "한", "ب", "مرحبا", "ש", "न", "ि", "ก",
    "²", "½", "Ⅻ", "٣", "３", "\u00a0", "\u3000", "\u2003", "\u0085", "\u200d", "\u0301", "\ufe0f",
    "😀", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧", "∑", "→", "€", "©", "…", "\u00ad",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "|>", "<file_sep>",
]


def fuzz_texts(count: int, seed: int) -> list[str]:
    """Deterministic random concatenations of FUZZ_PIECES."""
    rng = random.Random(seed)
    return ["".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(1, 24))) for _ in range(count)]


def llama_cpp_tokenize(gguf_path: Path):
    """A ``text -> ids`` function backed by llama.cpp, or None if llama_cpp is not importable."""
    try:
        import llama_cpp
    except ImportError:
        return None, None
    model = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
    version = getattr(llama_cpp, "__version__", "unknown")
    return (lambda text: model.tokenize(text.encode("utf-8"), add_bos=False, special=True)), version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None)
    args = parser.parse_args()

    import tokenizers

    gguf_path = args.gguf or find_gguf()
    spec = gguf_manifest_sections(str(gguf_path))["tokenizer"]
    corpus = json.loads((HERE / "tokenizer_corpus.json").read_text(encoding="utf-8"))
    corpus += [{"name": f"fuzz_{i:03d}", "text": t} for i, t in enumerate(fuzz_texts(300, seed=20261129))]
    hf = hf_tokenizer(spec)
    llama, llama_version = llama_cpp_tokenize(gguf_path)

    special_texts = [t for t, kind in zip(spec["tokens"], spec["token_types"]) if kind == 3]
    entries = []
    disagreements = []
    for item in corpus:
        ids = hf.encode(item["text"], add_special_tokens=False).ids
        entry = {"name": item["name"], "text": item["text"], "ids": ids}
        if any(t in item["text"] for t in special_texts):
            # Control-token text treated as plain characters (encode(..., allow_special=False)).
            hf.encode_special_tokens = True
            entry["ids_plain"] = hf.encode(item["text"], add_special_tokens=False).ids
            hf.encode_special_tokens = False
        if llama is not None:
            llama_ids = list(llama(item["text"]))
            entry["llama_cpp_ids"] = llama_ids
            if llama_ids != ids:
                disagreements.append(item["name"])
        entries.append(entry)

    golden = {
        "gguf_sha256": hashlib.sha256(gguf_path.read_bytes()).hexdigest(),
        "reference": f"tokenizers {tokenizers.__version__} (HF), SmolLM2 tokenizer.json configuration",
        "llama_cpp": llama_version,
        "llama_cpp_disagreements": disagreements if llama is not None else None,
        "num_tokens": sum(len(e["ids"]) for e in entries),
        "entries": entries,
    }
    out = HERE / "tokenizer_golden.json"
    # One entry per line keeps the file small and its diffs readable.
    head = json.dumps({k: v for k, v in golden.items() if k != "entries"}, ensure_ascii=True, indent=1)
    body = ",\n".join("  " + json.dumps(e, ensure_ascii=True) for e in entries)
    out.write_text(head[:-2] + ',\n "entries": [\n' + body + "\n ]\n}\n", encoding="utf-8")
    print(f"wrote {out}: {len(entries)} entries, {golden['num_tokens']} tokens; llama.cpp: {llama_version}")
    if disagreements:
        print(f"llama.cpp disagrees with HF on: {disagreements}")


if __name__ == "__main__":
    main()
