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
from collections.abc import Iterator, Sequence

SPACE = "\u2581"  # ▁, SentencePiece's visible space


class SpmModel:
    """Scores and byte tokens of one SentencePiece vocabulary; turns plain text into ids."""

    def __init__(
        self, tokens: Sequence[str], token_to_id: dict[str, int], scores: Sequence[float], *, add_space_prefix: bool
    ) -> None:
        if len(scores) != len(tokens):
            raise ValueError(f"scores ({len(scores)}) and tokens ({len(tokens)}) differ in length")
        self._token_to_id = token_to_id
        self._scores = [float(s) for s in scores]
        self.add_space_prefix = bool(add_space_prefix)
        # llama.cpp's byte_to_token: <0xXX>, else the byte itself as a one-character token.
        self._byte_ids: list[int | None] = [
            token_to_id.get(f"<0x{b:02X}>", token_to_id.get(chr(b)) if b < 0x80 else None) for b in range(256)
        ]

    def encode_words(self, text: str, out: list[int], after_special: bool) -> Iterator[int]:
        """encode(), as one piece (yields its characters once): SentencePiece merges over the whole text, so no
        cut keeps its ids, and a caller cannot pause within it."""
        self.encode(text, out, after_special)
        yield len(text)

    def encode(self, text: str, out: list[int], after_special: bool) -> None:
        """Append the ids of ``text`` (no special tokens in it) to ``out``.

        ``after_special``: the text starts the input or follows a special
        token, which is where llama.cpp puts the dummy-prefix space.
        """
        if self.add_space_prefix and after_special:
            text = " " + text
        symbols: list[str | None] = list(text.replace(" ", SPACE))
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
        while heap:
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
