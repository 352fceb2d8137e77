"""Byte-level BPE (GPT-2 style, GGUF ``tokenizer.ggml.model = "gpt2"``) as llama.cpp runs it.

The text between special tokens is split into words by the file's
pre-tokenizer; each word's UTF-8 bytes are mapped to the GPT-2 byte alphabet
and merged pairwise by merge rank (lowest rank first, leftmost on ties).
Results are cached per word.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from pagedkv.pretokenize import IGNORE_MERGES, iter_words, resolve, split_words
from pagedkv.slices import SLICE_CHARS

_CACHE_LIMIT = 65536  # words; a cleared cache only costs time, never correctness
# Words at least this long (in bytes) merge through a heap. The scan is
# quadratic: a pasted CJK paragraph is one pre-tokenizer word of thousands of
# bytes, which took 0.3 s in CPython (seconds under Pyodide). Measured on the
# golden words: the scan wins below ~4 bytes, the heap from ~8 bytes on.
_HEAP_MIN_SYMBOLS = 8


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
# Maps raw bytes (decoded as latin-1, one char per byte) to the GPT-2 alphabet.
_BYTE_TRANSLATION = str.maketrans({chr(b): c for b, c in _BYTE_TO_CHAR.items()})


def merge_by_scan(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Apply BPE merges: repeatedly merge every occurrence of the lowest-rank pair, left to right."""
    while len(symbols) > 1:
        best_rank = None
        best_pair = None
        for pair in zip(symbols, symbols[1:]):
            rank = ranks.get(pair)
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_pair = rank, pair
        if best_pair is None:
            break
        left, right = best_pair
        merged: list[str] = []
        i = 0
        n = len(symbols)
        while i < n:
            if i < n - 1 and symbols[i] == left and symbols[i + 1] == right:
                merged.append(left + right)
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


def merge_by_heap(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Same result as ``merge_by_scan`` in O(n log n): pairs in a heap ordered by (rank, position).

    Symbols live in a linked list over their original positions; a heap entry
    is stale once either side has been merged away, which shows as the pair
    now at that position having a different rank (ranks are unique per pair).
    Equivalent to the scan because a merge's result only takes part in merges
    of higher rank, as BPE training creates them.
    """
    n = len(symbols)
    sym: list[str | None] = list(symbols)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = [(r, i) for i in range(n - 1) if (r := ranks.get((sym[i], sym[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        left = sym[i]
        j = nxt[i]
        if left is None or j == -1 or ranks.get((left, sym[j])) != rank:
            continue
        merged = left + sym[j]
        sym[i] = merged
        sym[j] = None
        k = nxt[j]
        nxt[i] = k
        if k != -1:
            prv[k] = i
            r = ranks.get((merged, sym[k]))
            if r is not None:
                heapq.heappush(heap, (r, i))
        p = prv[i]
        if p != -1:
            r = ranks.get((sym[p], merged))
            if r is not None:
                heapq.heappush(heap, (r, p))
    return [s for s in sym if s is not None]


class BpeModel:
    """Merges and pre-tokenizer of one byte-level BPE vocabulary; turns plain text into ids."""

    slice_chars = SLICE_CHARS  # characters a slice of its merges takes (Tokenizer._fragments_slices)

    def __init__(self, token_to_id: dict[str, int], merges: Sequence[str], pre: str) -> None:
        self.pre = pre
        self._pattern = resolve(pre)
        self._ignore_merges = self._pattern in IGNORE_MERGES
        self._token_to_id = token_to_id
        self._ranks = self._parse_merges(merges)
        self._cache: dict[str, tuple[int, ...]] = {}

    def _parse_merges(self, merges: Sequence[str]) -> dict[tuple[str, str], int]:
        vocab = self._token_to_id
        pairs = [m.split(" ") if isinstance(m, str) else () for m in merges]
        for rank, pair in enumerate(pairs):
            if len(pair) != 2 or not pair[0] or not pair[1]:
                raise ValueError(
                    f"merge {rank} is {merges[rank]!r}; expected two symbols separated by one space"
                )
            # Only merge results need ids: a final symbol is one byte or a merge result.
            if pair[0] + pair[1] not in vocab:
                raise ValueError(
                    f"merge {rank} ({merges[rank]!r}) produces {pair[0] + pair[1]!r}, "
                    "which is not in the vocabulary"
                )
        # Built backwards so that the first occurrence of a duplicate pair keeps its rank.
        return {(pairs[i][0], pairs[i][1]): i for i in range(len(pairs) - 1, -1, -1)}

    def encode(self, text: str, out: list[int], after_special: bool) -> None:
        """Append the ids of ``text`` (no special tokens in it) to ``out``."""
        del after_special  # only SentencePiece's dummy prefix depends on it
        for word in split_words(text, self._pattern):
            out.extend(self._word_ids(word))

    def encode_words(self, text: str, out: list[int], after_special: bool) -> Iterator[int]:
        """encode(), word by word: yields each word's characters once its ids are in ``out`` (a caller may pause
        between two words: words are merged independently)."""
        del after_special
        for word in iter_words(text, self._pattern):
            out.extend(self._word_ids(word))
            yield len(word)

    def _word_ids(self, word: str) -> tuple[int, ...]:
        cache = self._cache
        cached = cache.get(word)
        if cached is None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cached = cache[word] = self._bpe(word)
        return cached

    def _bpe(self, word: str) -> tuple[int, ...]:
        symbols = list(word.encode("utf-8").decode("latin-1").translate(_BYTE_TRANSLATION))
        token_to_id = self._token_to_id
        if self._ignore_merges:
            whole = token_to_id.get("".join(symbols))
            if whole is not None:
                return (whole,)
        if len(symbols) < _HEAP_MIN_SYMBOLS:
            symbols = merge_by_scan(symbols, self._ranks)
        else:
            symbols = merge_by_heap(symbols, self._ranks)
        # A symbol outside the vocabulary can only be a single byte (merges are
        # checked to produce vocabulary tokens). llama.cpp and HF tokenizers
        # (no unk token) both drop such bytes, so we do too; SmolLM2 lacks
        # 21 bytes: 6 rare ASCII controls and 15 that never occur in UTF-8.
        return tuple(token_to_id[s] for s in symbols if s in token_to_id)

    @property
    def unencodable_bytes(self) -> bytes:
        """Byte values with no vocabulary token; ``encode`` drops them, as the references do."""
        return bytes(sorted(b for b, c in _BYTE_TO_CHAR.items() if c not in self._token_to_id))

    @staticmethod
    def normal_token_bytes(text: str) -> bytes:
        """Raw bytes of a normal token spelled in the GPT-2 byte alphabet."""
        try:
            return bytes(_CHAR_TO_BYTE[c] for c in text)
        except KeyError:
            # Not from the byte alphabet: no byte sequence encodes to it, so decode its text as is.
            return text.encode("utf-8")
