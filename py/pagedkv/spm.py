"""SentencePiece vocabularies (GGUF ``tokenizer.ggml.model = "llama"``) as llama.cpp's SPM tokenizer runs them.

Llama 2 / TinyLlama style: no pre-tokenizer. A text fragment gets one space in
front when it starts the text or follows a special token (the "dummy prefix",
``tokenizer.ggml.add_space_prefix``, on by default), every space becomes
``▁`` (U+2581), and the fragment's characters are merged pairwise: the
adjacent pair whose concatenation is the vocabulary entry of highest score
merges first (leftmost on ties), until no adjacent pair forms an entry. A
character left without an entry is written as its UTF-8 bytes, one
``<0xXX>`` byte token each (byte fallback).
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Generator, Iterator, Sequence

from pagedkv.slices import SLICE_CHARS, Slices, run_slices

SPACE = "\u2581"  # ▁, SentencePiece's visible space
# Characters of a long text merged as one piece: pieces end at the first safe cut past this (SpmModel.safe_cut), so
# that a caller pauses soon after SLICE_CHARS_SPM (slices.py); a heap of 1,024 symbols merges in ~3 ms of CPython.
PIECE_CHARS = 1024
# Heap pops of one piece's merge between two pauses, and characters scanned for a safe cut between two. A text
# with no safe cut for a long way (a run of characters that all merge: "▁▁▁…", "===…") is one piece however long;
# its merge and the scan for its end pause too. A pop of such a run costs 3-15 us of CPython here (2026-12-07,
# beside a CPU hog; "=" and "a" runs, whose merges leave many stale pairs in the heap), so a step is ~10-60 ms.
MERGE_STEP = 4096
# Characters of a slice (slices.py's SLICE_CHARS is BPE's): a SentencePiece character costs ~3-8x a BPE one
# (Gemma 3's vocabulary in CPython here, 2026-12-07: 3.9 us a character of English, 3.6-8.2 in runs that merge,
# against 1.2 us of SmolLM2's BPE), so its slices are an eighth as long.
SLICE_CHARS_SPM = SLICE_CHARS // 8


class SpmModel:
    """Scores and byte tokens of one SentencePiece vocabulary; turns plain text into ids."""

    slice_chars = SLICE_CHARS_SPM  # characters a slice of its merges takes (Tokenizer._fragments_slices)

    def __init__(
        self, tokens: Sequence[str], token_to_id: dict[str, int], scores: Sequence[float], *, add_space_prefix: bool
    ) -> None:
        if len(scores) != len(tokens):
            raise ValueError(f"scores ({len(scores)}) and tokens ({len(tokens)}) differ in length")
        self._token_to_id = token_to_id
        self._scores = [float(s) for s in scores]
        self.add_space_prefix = bool(add_space_prefix)
        self._pairs: set[str] | None = None  # learnt on the first long text (_pairs_slices)
        # llama.cpp's byte_to_token: <0xXX>, else the byte itself as a one-character token.
        self._byte_ids: list[int | None] = [
            token_to_id.get(f"<0x{b:02X}>", token_to_id.get(chr(b)) if b < 0x80 else None) for b in range(256)
        ]

    def encode_words(self, text: str, out: list[int], after_special: bool) -> Iterator[int]:
        """encode(), in pieces cut at safe points (``safe_cut``) about every PIECE_CHARS characters: yields the
        work done since its last yield, in characters, so that a caller may pause there: a piece's characters
        once its ids are in ``out``, the vocabulary's while it first learns its pairs (``_pairs_slices``), and,
        where no safe cut comes for a long way, every MERGE_STEP characters scanned for one and every
        MERGE_STEP heap pops of the long piece's merge (then the yields add up to more than the text)."""
        if self._pairs is None:
            yield from self._pairs_slices()
        text = self._spaced(text, after_special)
        start = 0
        while start < len(text):
            end = yield from self._cut_slices(text, start + PIECE_CHARS)
            yield from self._merge_slices(text[start:end], out)
            yield end - start
            start = end

    def safe_cut(self, text: str, at: int) -> int:
        """The first place at or after ``at`` (``len(text)`` if none) where ``text`` (spaces already ``▁``) may
        be cut: the two characters around it appear side by side in no vocabulary entry.

        Why the ids of the two parts, joined, are the ids of the whole: every symbol a merge makes is a
        vocabulary entry spelled by consecutive characters of the text, so none can span the cut (it would
        hold those two characters side by side), and no pair across it ever enters the heap. Each side's merges
        then only read and write that side's symbols, and the heap pops them in the same relative order
        (score, then position) as a heap holding that side alone. A character with no entry (byte fallback)
        stays a symbol of its own, as in the whole. The pairs come from every entry of the vocabulary, the
        special and byte tokens too, as ``_merge`` looks every pair up among all of them."""
        return run_slices(self._cut_slices(text, at))

    def _cut_slices(self, text: str, at: int) -> Generator[int, None, int]:
        """``safe_cut``, yielding MERGE_STEP after each MERGE_STEP characters scanned without a cut."""
        pairs = self._pairs
        if pairs is None:
            pairs = yield from self._pairs_slices()
        cut = max(at, 1)
        while cut < len(text):
            window = min(len(text), cut + MERGE_STEP)
            for cut in range(cut, window):
                if text[cut - 1:cut + 1] not in pairs:
                    return cut
            if window == len(text):
                break
            cut = window
            yield MERGE_STEP
        return len(text)

    def _pairs_slices(self) -> Slices[set[str]]:
        """Learn ``_pairs``, every two characters side by side in a vocabulary entry (Gemma 3: 34,012 pairs from
        262,144 entries, ~0.2 s of CPython), yielding the characters scanned every 4,096 entries."""
        pairs: set[str] = set()
        tokens = list(self._token_to_id)
        for first in range(0, len(tokens), 4096):
            batch = tokens[first:first + 4096]
            for token in batch:
                pairs.update(map(operator.add, token, token[1:]))
            yield sum(map(len, batch))
        self._pairs = pairs
        return pairs

    def encode(self, text: str, out: list[int], after_special: bool) -> None:
        """Append the ids of ``text`` (no special tokens in it) to ``out``.

        ``after_special``: the text starts the input or follows a special
        token, which is where llama.cpp puts the dummy-prefix space.
        """
        self._merge(self._spaced(text, after_special), out)

    def _spaced(self, text: str, after_special: bool) -> str:
        """``text`` as SentencePiece merges it: its dummy-prefix space, every space a ``▁``."""
        if self.add_space_prefix and after_special:
            text = " " + text
        return text.replace(" ", SPACE)

    def _merge(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (spaces already ``▁``): its characters merged by score, then byte fallback."""
        run_slices(self._merge_slices(text, out))

    def _merge_slices(self, text: str, out: list[int]) -> Iterator[int]:
        """``_merge``, yielding MERGE_STEP after each MERGE_STEP heap pops (a piece past a few thousand
        characters: one without a safe cut)."""
        symbols: list[str | None] = list(text)
        if not symbols:
            return
        n = len(symbols)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, length of the pair)
        vocab, scores = self._token_to_id, self._scores

        def push(left: int, right: int) -> None:
            pair = symbols[left] + symbols[right]
            token_id = vocab.get(pair)
            if token_id is not None:
                heapq.heappush(heap, (-scores[token_id], left, right, len(pair)))

        for i in range(n - 1):
            push(i, i + 1)
            if i % MERGE_STEP == MERGE_STEP - 1:
                yield MERGE_STEP
        pops = 0
        while heap:
            pops += 1
            if pops == MERGE_STEP:
                pops = 0
                yield MERGE_STEP
            _, left, right, size = heapq.heappop(heap)
            a, b = symbols[left], symbols[right]
            # Stale once either side was merged away or has grown since the push.
            if a is None or b is None or len(a) + len(b) != size:
                continue
            symbols[left] = a + b
            symbols[right] = None
            follow = nxt[right]
            nxt[left] = follow
            if follow != -1:
                prv[follow] = left
                push(left, follow)
            if prv[left] != -1:
                push(prv[left], left)
        for symbol in symbols:
            if symbol is None:
                continue
            token_id = vocab.get(symbol)
            if token_id is not None:
                out.append(token_id)
                continue
            # Only a single character can lack an entry: merges always form entries.
            for byte in symbol.encode("utf-8"):
                byte_id = self._byte_ids[byte]
                if byte_id is None:
                    raise ValueError(
                        f"character {symbol!r} is not in the vocabulary and byte 0x{byte:02X} has no "
                        f"<0x{byte:02X}> token to fall back on"
                    )
                out.append(byte_id)

    @property
    def unencodable_bytes(self) -> bytes:
        """Byte values without a byte token (llama.cpp fails on text that needs one)."""
        return bytes(b for b in range(256) if self._byte_ids[b] is None)

    @staticmethod
    def normal_token_bytes(text: str) -> bytes:
        """Raw bytes of a normal piece: ``▁`` is a space."""
        return text.replace(SPACE, " ").encode("utf-8")
