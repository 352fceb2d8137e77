"""Pre-tokenizers: split text into the words that BPE then merges independently.

The GPT-2 pattern needs Unicode classes (``\\p{L}``, ``\\p{N}``) that the
standard ``re`` module lacks, and the ``regex`` module is not available in
Pyodide. Instead each non-ASCII character is replaced by an ASCII stand-in of
the same class (letter -> ``a``, number -> ``0``, whitespace -> ``\\t``,
anything else -> ``!``). The stand-in string has the same length as the
original, so an ASCII-only pattern run by ``re`` (in C, fast) yields spans that
cut the original text at exactly the places the Unicode pattern would.
"""

from __future__ import annotations

import re
import unicodedata

# Unicode White_Space (what Oniguruma's and llama.cpp's ``\s`` match). Not
# str.isspace(): that also accepts U+001C..U+001F, which the reference
# tokenizers treat as ordinary symbols.
_WHITE_SPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
    + list(range(0x2000, 0x200B))
)

_LETTER, _NUMBER, _SPACE, _OTHER = ord("a"), ord("0"), ord("\t"), ord("!")


class _ClassTable(dict):
    """``str.translate`` table mapping a code point to its ASCII stand-in, filled lazily."""

    def __missing__(self, code_point: int) -> int:
        if code_point < 0x80:
            stand_in = code_point
        elif code_point in _WHITE_SPACE:
            stand_in = _SPACE
        else:
            category = unicodedata.category(chr(code_point))[0]
            stand_in = _LETTER if category == "L" else _NUMBER if category == "N" else _OTHER
        self[code_point] = stand_in
        return stand_in


_CLASS_TABLE = _ClassTable()

# GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
_GPT2 = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+",
    re.ASCII,
)

# SmolLM: every \p{N} character is isolated first, then GPT-2 runs on the
# pieces in between. Folded into one pattern: a digit is its own word, and a
# whitespace run that ends right before a digit ends at a piece boundary,
# hence the lookahead ``(?![^\s0-9])`` instead of ``(?!\S)``.
_SMOLLM = re.compile(
    r"[0-9]|'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[^\sA-Za-z0-9]+|\s+(?![^\s0-9])|\s+",
    re.ASCII,
)

PATTERNS = {"gpt2": _GPT2, "smollm": _SMOLLM}


def stand_in(text: str) -> str:
    """Return ``text`` with every non-ASCII character replaced by its class stand-in."""
    return text if text.isascii() else text.translate(_CLASS_TABLE)


def split_words(text: str, pre: str) -> list[str]:
    """Split ``text`` into pre-tokenizer words for the pre-tokenizer named ``pre``.

    The words concatenate back to ``text`` exactly.
    """
    try:
        pattern = PATTERNS[pre]
    except KeyError:
        raise ValueError(
            f"unsupported pre-tokenizer {pre!r}; supported: {sorted(PATTERNS)}"
        ) from None
    if text.isascii():
        return pattern.findall(text)
    return [text[m.start() : m.end()] for m in pattern.finditer(text.translate(_CLASS_TABLE))]
