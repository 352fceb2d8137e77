"""Byte-level BPE (GPT-2 style) driven by the model's own vocab and merges.

Pure Python (no ``regex``/``tokenizers``), so it runs unchanged in Pyodide.
Encoding: special tokens are cut out first and kept atomic; the text between
them is split into words by the pre-tokenizer; each word's UTF-8 bytes are
mapped to the GPT-2 byte alphabet and merged pairwise by merge rank (lowest
rank first, leftmost on ties). Results are cached per word.
"""

from __future__ import annotations

import codecs
import heapq
import operator
import re
from collections.abc import Iterable, Sequence

from pagedkv.pretokenize import PATTERNS, split_words

# GGUF tokenizer.ggml.token_type values.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6
_VALID_TOKEN_TYPES = frozenset(range(1, 7))

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


class Tokenizer:
    """GPT-2 style byte-level BPE tokenizer."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        *,
        pre: str = "smollm",
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        unknown_token_id: int | None = None,
        padding_token_id: int | None = None,
    ) -> None:
        """Build from parallel ``tokens``/``token_types`` lists and ``"a b"`` merge strings."""
        if len(tokens) == 0:
            raise ValueError("tokenizer vocabulary is empty")
        if len(tokens) != len(token_types):
            raise ValueError(
                f"tokens ({len(tokens)}) and token_types ({len(token_types)}) differ in length"
            )
        if pre not in PATTERNS:
            raise ValueError(f"unsupported pre-tokenizer {pre!r}; supported: {sorted(PATTERNS)}")
        self.pre = pre
        self._tokens = list(tokens)
        self._types = [int(t) for t in token_types]
        self._token_to_id: dict[str, int] = {}
        for i, (text, kind) in enumerate(zip(self._tokens, self._types)):
            if not isinstance(text, str) or text == "":
                raise ValueError(f"token {i} is {text!r}; every token must be a non-empty string")
            if kind not in _VALID_TOKEN_TYPES:
                raise ValueError(f"token {i} ({text!r}) has unknown token type {kind}")
            # First occurrence wins, as in the reference implementations.
            self._token_to_id.setdefault(text, i)
        for name, value in (
            ("bos_token_id", bos_token_id),
            ("eos_token_id", eos_token_id),
            ("unknown_token_id", unknown_token_id),
            ("padding_token_id", padding_token_id),
        ):
            if value is not None and not 0 <= value < len(self._tokens):
                raise ValueError(f"{name}={value} is outside the vocabulary (size {len(self._tokens)})")
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.unknown_token_id = unknown_token_id
        self.padding_token_id = padding_token_id
        self._ranks = self._parse_merges(merges)
        self._id_bytes: dict[int, bytes] = {}  # filled on first use; most ids are never decoded
        self._special_ids = frozenset(
            i for i, k in enumerate(self._types) if k in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
        )
        self._special_re = self._special_pattern((TOKEN_CONTROL, TOKEN_USER_DEFINED))
        self._user_defined_re = self._special_pattern((TOKEN_USER_DEFINED,))
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_manifest(cls, manifest: dict) -> Tokenizer:
        """Build from a model manifest's ``"tokenizer"`` section."""
        try:
            spec = manifest["tokenizer"]
        except (KeyError, TypeError):
            raise ValueError("model manifest has no 'tokenizer' section") from None
        missing = [k for k in ("model", "pre", "tokens", "token_types", "merges") if k not in spec]
        if missing:
            raise ValueError(f"manifest tokenizer section lacks {missing}")
        if spec["model"] != "gpt2":
            raise ValueError(
                f"unsupported tokenizer model {spec['model']!r}; only byte-level BPE 'gpt2' is supported"
            )
        return cls(
            spec["tokens"],
            spec["token_types"],
            spec["merges"],
            pre=spec["pre"],
            bos_token_id=spec.get("bos_token_id"),
            eos_token_id=spec.get("eos_token_id"),
            unknown_token_id=spec.get("unknown_token_id"),
            padding_token_id=spec.get("padding_token_id"),
        )

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

    def _bytes_of(self, token_id: int) -> bytes:
        cached = self._id_bytes.get(token_id)
        if cached is None:
            cached = self._id_bytes[token_id] = self._token_bytes(token_id)
        return cached

    def _token_bytes(self, token_id: int) -> bytes:
        text = self._tokens[token_id]
        if self._types[token_id] in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            return text.encode("utf-8")
        try:
            return bytes(_CHAR_TO_BYTE[c] for c in text)
        except KeyError:
            # Not from the byte alphabet: no byte sequence encodes to it, so decode its text as is.
            return text.encode("utf-8")

    def _special_pattern(self, kinds: tuple[int, ...]) -> re.Pattern | None:
        texts = sorted(
            {self._tokens[i] for i, k in enumerate(self._types) if k in kinds},
            key=lambda t: (-len(t), t),  # longest first, so a token never shadows a longer one
        )
        return re.compile("|".join(re.escape(t) for t in texts)) if texts else None

    # ----------------------------------------------------------------- queries

    @property
    def vocab_size(self) -> int:
        """Number of token ids (the model's embedding rows)."""
        return len(self._tokens)

    def token_to_id(self, token: str) -> int:
        """Id of the vocabulary entry spelled ``token`` (GPT-2 alphabet for normal tokens)."""
        token_id = self.find_token(token)
        if token_id is None:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return token_id

    def find_token(self, token: str) -> int | None:
        """Id of the vocabulary entry spelled ``token``, or None when the vocabulary has none."""
        return self._token_to_id.get(token)

    def id_to_token(self, token_id: int) -> str:
        """Vocabulary spelling of ``token_id``."""
        return self._tokens[self.check_id(token_id)]

    def is_special(self, token_id: int) -> bool:
        """True for control / user-defined tokens such as ``<|im_end|>``."""
        return self.check_id(token_id) in self._special_ids

    @property
    def im_start_id(self) -> int:
        """Id of ``<|im_start|>`` (ChatML turn opener)."""
        return self.token_to_id("<|im_start|>")

    @property
    def im_end_id(self) -> int:
        """Id of ``<|im_end|>`` (ChatML turn closer; the chat stop token)."""
        return self.token_to_id("<|im_end|>")

    def check_id(self, token_id: int) -> int:
        """Return ``token_id`` as an int, or raise ValueError if it is not an id of this vocabulary."""
        # operator.index accepts numpy integers (what a sampler returns) but not floats or strings.
        try:
            if isinstance(token_id, bool):
                raise TypeError
            index = operator.index(token_id)
        except TypeError:
            raise ValueError(f"token id {token_id!r} is not an int") from None
        if not 0 <= index < len(self._tokens):
            raise ValueError(f"token id {index} is outside the vocabulary (size {len(self._tokens)})")
        return index

    # ---------------------------------------------------------------- encoding

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Token ids of ``text``; no BOS is added.

        With ``allow_special`` the text of control tokens (``<|im_start|>``...)
        becomes that single token; without it, such text is tokenized as plain
        characters. User-defined tokens are always atomic (llama.cpp's rule).
        Bytes listed in ``unencodable_bytes`` are dropped.
        """
        if not isinstance(text, str):
            raise ValueError(f"encode expects str, got {type(text).__name__}")
        special_re = self._special_re if allow_special else self._user_defined_re
        ids: list[int] = []
        start = 0
        if special_re is not None:
            for match in special_re.finditer(text):
                self._encode_ordinary(text[start : match.start()], ids)
                ids.append(self._token_to_id[match.group()])
                start = match.end()
        self._encode_ordinary(text[start:], ids)
        return ids

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        if not text:
            return
        cache = self._cache
        for word in split_words(text, self.pre):
            cached = cache.get(word)
            if cached is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cached = cache[word] = self._bpe(word)
            out.extend(cached)

    def _bpe(self, word: str) -> tuple[int, ...]:
        symbols = list(word.encode("utf-8").decode("latin-1").translate(_BYTE_TRANSLATION))
        if len(symbols) < _HEAP_MIN_SYMBOLS:
            symbols = merge_by_scan(symbols, self._ranks)
        else:
            symbols = merge_by_heap(symbols, self._ranks)
        # A symbol outside the vocabulary can only be a single byte (merges are
        # checked to produce vocabulary tokens). llama.cpp and HF tokenizers
        # (no unk token) both drop such bytes, so we do too; SmolLM2 lacks
        # 21 bytes: 6 rare ASCII controls and 15 that never occur in UTF-8.
        token_to_id = self._token_to_id
        return tuple(token_to_id[s] for s in symbols if s in token_to_id)

    @property
    def unencodable_bytes(self) -> bytes:
        """Byte values with no vocabulary token; ``encode`` drops them, as the references do."""
        return bytes(sorted(b for b, c in _BYTE_TO_CHAR.items() if c not in self._token_to_id))

    # ---------------------------------------------------------------- decoding

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (a piece of UTF-8, possibly incomplete)."""
        return self._bytes_of(self.check_id(token_id))

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = False) -> bytes:
        """Concatenated raw bytes of ``ids``."""
        parts = []
        for token_id in ids:
            token_id = self.check_id(token_id)
            if skip_special and token_id in self._special_ids:
                continue
            parts.append(self._bytes_of(token_id))
        return b"".join(parts)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, *, skip_special: bool = False) -> StreamDecoder:
        """A fresh incremental decoder bound to this tokenizer."""
        return StreamDecoder(self, skip_special=skip_special)


class StreamDecoder:
    """Turns token ids into text one at a time, emitting only complete UTF-8 characters.

    A character split across tokens is held back until its last byte arrives.
    The concatenation of every ``push`` result plus ``flush()`` equals
    ``Tokenizer.decode`` of the same ids.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Feed one id; return the text that became complete (possibly ``""``)."""
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """End of stream: return held-back bytes (an incomplete character becomes U+FFFD)."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
