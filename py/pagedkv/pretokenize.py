"""Pre-tokenizers: split text into the words that BPE then merges independently.

Each ``tokenizer.ggml.pre`` value gets the split llama.cpp makes for it
(``src/llama-vocab.cpp`` lists the regexes, ``src/unicode.cpp`` runs them).
Those regexes need Unicode classes (``\\p{L}``, ``\\p{N}``, ``\\p{P}``) that
the standard ``re`` module lacks, and the ``regex`` module is not available in
Pyodide. So, as llama.cpp itself does before it runs ``std::regex``, each
non-ASCII character is replaced by an ASCII stand-in of its class (letter ->
``a``, number -> ``0``, whitespace -> ``\\v``, punctuation -> ``!``, anything
else -> ``\\x60``). The stand-in string has the same length as the original,
so an ASCII-only pattern run by ``re`` (in C, fast) yields spans that cut the
original text at exactly the places the Unicode pattern would.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

# Unicode White_Space (what Oniguruma's and llama.cpp's ``\s`` match). Not
# str.isspace(): that also accepts U+001C..U+001F, which the reference
# tokenizers treat as ordinary symbols.
_WHITE_SPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
    + list(range(0x2000, 0x200B))
)

# Stand-ins. A symbol (\p{S}) shares the backtick with marks, controls and
# unassigned code points: no supported pattern tells those apart, and the
# backtick is the one ASCII symbol outside llama.cpp's default punctuation set.
_STAND_IN = {"L": ord("a"), "N": ord("0"), "P": ord("!")}
_SPACE, _OTHER = 0x0B, 0x60


class _ClassTable(dict):
    """``str.translate`` table mapping a code point to its ASCII stand-in, filled lazily."""

    def __missing__(self, code_point: int) -> int:
        if code_point < 0x80:
            stand_in = code_point
        elif code_point in _WHITE_SPACE:
            stand_in = _SPACE
        else:
            stand_in = _STAND_IN.get(unicodedata.category(chr(code_point))[0], _OTHER)
        self[code_point] = stand_in
        return stand_in


_CLASS_TABLE = _ClassTable()

# GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# (llama.cpp's hand-written splitter for it behaves exactly like the regex.)
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


def _llama3_style(digits: str) -> re.Pattern:
    # (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|<digits>| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    return re.compile(
        r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\nA-Za-z0-9]?[A-Za-z]+|"
        + digits
        + r"| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        re.ASCII,
    )


_LLAMA3 = _llama3_style(r"[0-9]{1,3}")  # Llama 3.x ('llama-bpe')
_QWEN2 = _llama3_style(r"[0-9]")  # Qwen2 / Qwen2.5: one digit per word

# llama.cpp's 'default' (a BPE file without a pre-tokenizer name) runs four
# regexes in turn, each inside the words of the one before, and keeps the text
# between matches as words too:
#   [\p{P}\$\+<=>\^~\|]+ ; GPT-2 ; \p{N}+ ; [0-9][0-9][0-9]
# The last one sees only ASCII digits, so it runs on the original text.
_DEFAULT_PUNCT = re.compile(r"[!-#%-*,-/:-;?-@\[-\]_{}$+<=>^~|]+", re.ASCII)
_DIGIT_RUN = re.compile(r"[0-9]+", re.ASCII)
_ASCII_TRIPLE = re.compile(r"[0-9][0-9][0-9]", re.ASCII)

PATTERNS = {"gpt2": _GPT2, "smollm": _SMOLLM, "llama3": _LLAMA3, "qwen2": _QWEN2}

# tokenizer.ggml.pre names (llama.cpp's spelling) -> our pattern name.
PRE_TOKENIZERS = {
    "default": "default",
    "gpt-2": "gpt2",
    "gpt2": "gpt2",  # the name this project used before it followed llama.cpp's spelling
    "smollm": "smollm",
    "llama-bpe": "llama3",
    "llama3": "llama3",
    "llama-v3": "llama3",
    "qwen2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
}

# llama.cpp takes a whole word as one token, merges skipped, when the
# vocabulary has it ("ignore_merges") for these.
IGNORE_MERGES = frozenset({"llama3"})


def stand_in(text: str) -> str:
    """Return ``text`` with every non-ASCII character replaced by its class stand-in."""
    return text if text.isascii() else text.translate(_CLASS_TABLE)


def resolve(pre: str) -> str:
    """Our pattern name for a ``tokenizer.ggml.pre`` value; ValueError naming the supported ones."""
    try:
        return PRE_TOKENIZERS[pre]
    except (KeyError, TypeError):
        raise ValueError(
            f"unsupported pre-tokenizer {pre!r}; supported: {sorted(PRE_TOKENIZERS)}"
        ) from None


def split_words(text: str, pre: str) -> list[str]:
    """Split ``text`` into pre-tokenizer words for the pre-tokenizer named ``pre``.

    The words concatenate back to ``text`` exactly.
    """
    name = resolve(pre)
    if name == "default":
        return _split_default(text)
    pattern = PATTERNS[name]
    if text.isascii():
        return pattern.findall(text)
    return [text[m.start() : m.end()] for m in pattern.finditer(text.translate(_CLASS_TABLE))]


def iter_words(text: str, pre: str) -> Iterator[str]:
    """split_words(text, pre), word by word as the pattern finds them (a caller may pause between two words:
    slices.py). The "default" pre-tokenizer's passes each run over the whole text first."""
    name = resolve(pre)
    if name == "default":
        yield from _split_default(text)
        return
    pattern = PATTERNS[name]
    if text.isascii():
        for m in pattern.finditer(text):
            yield m.group()
        return
    for m in pattern.finditer(text.translate(_CLASS_TABLE)):
        yield text[m.start() : m.end()]


def _split_with_gaps(pattern: re.Pattern, subject: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for start, end in spans:
        pos = start
        for m in pattern.finditer(subject, start, end):
            if m.start() > pos:
                out.append((pos, m.start()))
            out.append((m.start(), m.end()))
            pos = m.end()
        if pos < end:
            out.append((pos, end))
    return out


def _split_default(text: str) -> list[str]:
    classes = stand_in(text)
    spans = [(0, len(text))] if text else []
    for pattern, subject in (
        (_DEFAULT_PUNCT, classes),
        (_GPT2, classes),
        (_DIGIT_RUN, classes),
        (_ASCII_TRIPLE, text),
    ):
        spans = _split_with_gaps(pattern, subject, spans)
    return [text[a:b] for a, b in spans]
