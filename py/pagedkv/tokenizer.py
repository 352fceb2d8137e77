"""Tokenizers driven by the model's own vocabulary, as llama.cpp tokenizes with it.

Pure Python (no ``regex``/``tokenizers``), so it runs unchanged in Pyodide.
Two vocabulary kinds, named by the GGUF's ``tokenizer.ggml.model``:
``gpt2`` (byte-level BPE, ``pagedkv.bpe``) and ``llama`` (SentencePiece,
``pagedkv.spm``). Both share what this module does: special tokens are cut
out of the text first and kept atomic (longest token first, as llama.cpp's
``tokenizer_st_partition``), the text between them goes to the vocabulary's
model, and BOS/EOS are added when asked and the file says so.
"""

from __future__ import annotations

import codecs
import heapq
import operator
import re
from collections.abc import Iterable, Sequence

from pagedkv.bpe import BpeModel, bytes_to_unicode  # noqa: F401  (bytes_to_unicode: public helper)
from pagedkv.pretokenize import IGNORE_MERGES, resolve
from pagedkv.slices import SLICE_CHARS, Slices, run_slices
from pagedkv.spm import SpmModel

# GGUF tokenizer.ggml.token_type values.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6
_VALID_TOKEN_TYPES = frozenset(range(1, 7))
# Special-token candidates found, taken or turned into pieces between two pauses of a sliced partition
# (SpecialCutter.cuts_slices, Tokenizer.partition_slices), and the text's positions scanned for them: each ~5-10 ms
# of CPython here (a run of Gemma 3's whitespace tokens, where every position is a candidate, 2026-12-07).
CUT_STEP = 2048
CUT_WINDOW = 8192
# Matched in text (llama.cpp's special-token cache); without allow_special only user-defined ones.
_SPECIAL_TYPES = (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN)
MODELS = ("gpt2", "llama")

# llama.cpp decides some token kinds by their text, whatever the file says:
# end-of-generation, end-of-turn and fill-in-the-middle markers are control
# tokens, and the first two groups stop generation (its special_eog_ids).
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
)  # fmt: skip
_FIM_EOG_TEXTS = (
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
    "<REPO>", "<reponame>", "<|file_sep|>",
)  # fmt: skip
_FIM_TEXTS = (
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>", "<|code_middle|>",
    "<|middle|>",
)  # fmt: skip
_USER_DEFINED_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


class Tokenizer:
    """A GGUF vocabulary's tokenizer: byte-level BPE (``gpt2``) or SentencePiece (``llama``)."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str] = (),
        *,
        model: str = "gpt2",
        pre: str = "smollm",
        scores: Sequence[float] | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        unknown_token_id: int | None = None,
        padding_token_id: int | None = None,
        add_bos: bool | None = None,
        add_eos: bool = False,
        add_space_prefix: bool = True,
    ) -> None:
        """Build from parallel ``tokens``/``token_types`` lists plus ``"a b"`` merges (gpt2) or ``scores`` (llama).

        ``add_bos`` unset takes llama.cpp's default for the vocabulary: on for
        SentencePiece and for Llama 3's pre-tokenizer, off otherwise.
        """
        if model not in MODELS:
            raise ValueError(f"unsupported tokenizer model {model!r}; supported: {list(MODELS)}")
        if len(tokens) == 0:
            raise ValueError("tokenizer vocabulary is empty")
        if len(tokens) != len(token_types):
            raise ValueError(
                f"tokens ({len(tokens)}) and token_types ({len(token_types)}) differ in length"
            )
        self.model = model
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
        if model == "gpt2":
            self.pre = pre
            self._model: BpeModel | SpmModel = BpeModel(self._token_to_id, merges, pre)
            default_bos = resolve(pre) in IGNORE_MERGES  # llama.cpp: Llama 3 adds BOS
        else:
            if merges:
                raise ValueError(f"a 'llama' (SentencePiece) vocabulary takes scores, not {len(merges)} merges")
            if scores is None:
                raise ValueError("a 'llama' (SentencePiece) vocabulary needs scores")
            self.pre = "default"
            self._model = SpmModel(self._tokens, self._token_to_id, scores, add_space_prefix=add_space_prefix)
            default_bos = True
        self.add_bos = default_bos if add_bos is None else bool(add_bos)
        self.add_eos = bool(add_eos)
        for flag, name, value in (("add_bos", "bos_token_id", bos_token_id), ("add_eos", "eos_token_id", eos_token_id)):
            if getattr(self, flag) and value is None:
                raise ValueError(f"{flag} is set but {name} is not")
        self._id_bytes: dict[int, bytes] = {}  # filled on first use; most ids are never decoded
        self._kinds = self._kinds_as_llama_cpp_sees_them()
        self._special_ids = frozenset(i for i, k in enumerate(self._kinds) if k in _SPECIAL_TYPES)
        # What llama.cpp leaves out of text when not asked to render special tokens: user-defined ones are
        # text (Gemma's newline and space runs, HTML tags), so they stay.
        self._unrendered_ids = frozenset(i for i, k in enumerate(self._kinds) if k in (TOKEN_CONTROL, TOKEN_UNKNOWN))
        eog = {self._token_to_id.get(t) for t in _EOG_TEXTS + _FIM_EOG_TEXTS} | {eos_token_id}
        self.eog_ids = frozenset(eog - {None})
        # llama.cpp cuts special tokens longest UTF-8 text first; its sort is not stable, so equal lengths go by id
        # here (they can only disagree where two equal-length tokens overlap in the text).
        order = sorted(self._special_ids, key=lambda i: (-len(self._tokens[i].encode("utf-8")), i))
        rank = {i: r for r, i in enumerate(order)}
        self._cutters = {}
        for allow in (True, False):
            texts: dict[str, int] = {}
            for i in order:
                if allow or self._kinds[i] == TOKEN_USER_DEFINED:
                    texts.setdefault(self._tokens[i], i)  # a repeated text: the first id cuts every occurrence
            self._cutters[allow] = SpecialCutter(texts, rank)

    def _kinds_as_llama_cpp_sees_them(self) -> list[int]:
        kinds = list(self._types)
        forced = ((_EOG_TEXTS + _FIM_EOG_TEXTS + _FIM_TEXTS, TOKEN_CONTROL), (_USER_DEFINED_TEXTS, TOKEN_USER_DEFINED))
        for texts, kind in forced:
            for text in texts:
                token_id = self._token_to_id.get(text)
                if token_id is not None:
                    kinds[token_id] = kind
        return kinds

    @classmethod
    def from_manifest(cls, manifest: dict) -> Tokenizer:
        """Build from a model manifest's ``"tokenizer"`` section."""
        try:
            spec = manifest["tokenizer"]
        except (KeyError, TypeError):
            raise ValueError("model manifest has no 'tokenizer' section") from None
        model = spec.get("model") if isinstance(spec, dict) else None
        if model not in MODELS:
            raise ValueError(f"unsupported tokenizer model {model!r}; supported: {list(MODELS)}")
        needed = ("pre", "tokens", "token_types", "merges") if model == "gpt2" else ("tokens", "token_types", "scores")
        missing = [k for k in needed if k not in spec]
        if missing:
            raise ValueError(f"manifest tokenizer section lacks {missing}")
        return cls(
            spec["tokens"],
            spec["token_types"],
            spec.get("merges") or (),
            model=model,
            pre=spec.get("pre") or "default",
            scores=spec.get("scores"),
            bos_token_id=spec.get("bos_token_id"),
            eos_token_id=spec.get("eos_token_id"),
            unknown_token_id=spec.get("unknown_token_id"),
            padding_token_id=spec.get("padding_token_id"),
            add_bos=spec.get("add_bos_token"),
            add_eos=bool(spec.get("add_eos_token", False)),
            add_space_prefix=bool(spec.get("add_space_prefix", True)),
        )

    def _bytes_of(self, token_id: int) -> bytes:
        cached = self._id_bytes.get(token_id)
        if cached is None:
            cached = self._id_bytes[token_id] = self._token_bytes(token_id)
        return cached

    def _token_bytes(self, token_id: int) -> bytes:
        text, kind = self._tokens[token_id], self._kinds[token_id]
        if kind in _SPECIAL_TYPES:
            return text.encode("utf-8")
        if kind == TOKEN_BYTE and self.model == "llama":
            return bytes([int(text[3:5], 16)])  # <0xXX>
        if kind == TOKEN_UNUSED:
            return b""  # llama.cpp prints nothing for unused entries
        return self._model.normal_token_bytes(text)

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
        """True for control / user-defined / unknown tokens such as ``<|im_end|>`` (as llama.cpp kinds them)."""
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

    def encode(self, text: str, *, allow_special: bool = True, add_special: bool = False) -> list[int]:
        """Token ids of ``text``.

        With ``allow_special`` the text of control tokens (``<|im_start|>``...)
        becomes that single token; without it, such text is tokenized as plain
        characters. User-defined tokens are always atomic (llama.cpp's rule).
        ``add_special`` adds BOS / EOS where the vocabulary says to
        (``add_bos`` / ``add_eos``), as llama.cpp's ``add_special`` does.
        Bytes listed in ``unencodable_bytes`` are dropped (BPE); SentencePiece
        raises ValueError for text that needs one.
        """
        return run_slices(self.encode_slices(text, add_special=add_special, allow_special=allow_special))

    def encode_slices(self, text: str, *, add_special: bool = False, allow_special: bool = True) -> Slices[list[int]]:
        """encode, in slices (slices.py: as encode_after_slices)."""
        if not isinstance(text, str):
            raise ValueError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_token_id)
        fragments = yield from self.partition_slices(text, allow_special=allow_special)
        yield from self._fragments_slices(fragments, ids, True)
        if add_special and self.add_eos:
            ids.append(self.eos_token_id)
        return ids

    def partition(self, text: str, *, allow_special: bool = True) -> list[str | int]:
        """``text`` cut into plain-text pieces and special token ids, in order.

        Each special token in turn, longest first, is cut out of every piece
        still plain, as llama.cpp does (``SpecialCutter``). Without
        ``allow_special`` only user-defined tokens are cut out.
        """
        return run_slices(self.partition_slices(text, allow_special=allow_special))

    def partition_slices(self, text: str, *, allow_special: bool = True) -> Slices[list[str | int]]:
        """partition, in slices (SpecialCutter.cuts_slices; a pause every CUT_STEP pieces): a text that is mostly
        special tokens (Gemma 3's user-defined whitespace runs: 4 MiB of spaces are ~135,000 of them) pauses too."""
        cuts = yield from self._cutters[allow_special].cuts_slices(text)
        fragments: list[str | int] = []
        pos = 0
        for k, (start, token, token_id) in enumerate(cuts):
            if start > pos:
                fragments.append(text[pos:start])
            fragments.append(token_id)
            pos = start + len(token)
            if k % CUT_STEP == CUT_STEP - 1:
                yield
        if pos < len(text):
            fragments.append(text[pos:])
        return fragments

    def encode_after(self, text: str, previous_id: int | None) -> list[int]:
        """Ids of ``text`` as it continues ids ending with ``previous_id`` (None: it starts the input).

        Equals the tail of encoding the whole text where the join is a word
        boundary; SentencePiece's dummy space goes in only at the start or
        after a special token, as when llama.cpp tokenizes the whole prompt.
        """
        return run_slices(self.encode_after_slices(text, previous_id))

    def encode_after_slices(self, text: str, previous_id: int | None) -> Slices[list[int]]:
        """encode_after, in slices (slices.py): a pause after every SLICE_CHARS characters of the pieces between
        special tokens, and within a longer piece where the model allows (BPE: between two words; SentencePiece: at
        safe cuts, SpmModel.safe_cut)."""
        after_special = previous_id is None or self.check_id(previous_id) in self._special_ids
        ids: list[int] = []
        fragments = yield from self.partition_slices(text)
        yield from self._fragments_slices(fragments, ids, after_special)
        return ids

    def encode_fragments(self, fragments: Iterable[str | int], out: list[int], *, after_special: bool = True) -> None:
        """Append the ids of ``partition``'s pieces to ``out``.

        ``after_special`` says whether the first piece starts the text or
        follows a special token (SentencePiece puts its dummy space there).
        """
        run_slices(self._fragments_slices(fragments, out, after_special))

    def _fragments_slices(self, fragments: Iterable[str | int], out: list[int], after_special: bool) -> Slices[None]:
        done = 0  # characters tokenized since the last pause (a special token's id counts as one)
        slice_chars = self.slice_chars  # what one slice of this model's merges takes (slices.py)
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
                after_special = True
                done += 1
                if done >= slice_chars:
                    done = 0
                    yield
                continue
            if len(fragment) <= slice_chars:  # at once (BPE: the words split in one call of the regex engine)
                if done + len(fragment) > slice_chars:
                    done = 0
                    yield
                self._model.encode(fragment, out, after_special)
                done += len(fragment)
            else:  # pausing within it where the model allows (BPE: between two words; SentencePiece: safe cuts)
                for chars in self._model.encode_words(fragment, out, after_special):
                    done += chars
                    if done >= slice_chars:
                        done = 0
                        yield
            after_special = False

    @property
    def slice_chars(self) -> int:
        """Characters one slice of its merges takes (slices.py): SLICE_CHARS for BPE, SLICE_CHARS_SPM for
        SentencePiece, whose characters cost more."""
        return self._model.slice_chars

    @property
    def unencodable_bytes(self) -> bytes:
        """Byte values with no token: BPE drops them, as llama.cpp does; SentencePiece refuses text needing them."""
        return self._model.unencodable_bytes

    # ---------------------------------------------------------------- decoding

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (a piece of UTF-8, possibly incomplete)."""
        return self._bytes_of(self.check_id(token_id))

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = False) -> bytes:
        """Concatenated raw bytes of ``ids``; ``skip_special`` leaves out control and unknown tokens (not
        user-defined ones), as llama.cpp's ``token_to_piece`` does without ``special``."""
        parts = []
        for token_id in ids:
            token_id = self.check_id(token_id)
            if skip_special and token_id in self._unrendered_ids:
                continue
            parts.append(self._bytes_of(token_id))
        return b"".join(parts)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ``ids`` (``skip_special`` as in ``decode_bytes``); invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, *, skip_special: bool = False) -> StreamDecoder:
        """A fresh incremental decoder bound to this tokenizer."""
        return StreamDecoder(self, skip_special=skip_special)


class SpecialCutter:
    """Where llama.cpp's ``tokenizer_st_partition`` cuts a set of special tokens out of a text.

    llama.cpp takes the tokens one at a time in a fixed order (longest
    first) and cuts every occurrence of each, left to right, out of the
    pieces still plain. Trying each of thousands of tokens (Gemma 3 has
    6,414) against every piece costs tokens x pieces, seconds for a long
    chat; this finds the same cuts from the occurrences actually in the text.
    """

    def __init__(self, tokens: dict[str, int], rank: dict[int, int]) -> None:
        """``tokens``: text -> id of the tokens to cut; ``rank``: id -> place in llama.cpp's order (0 first)."""
        self._ids = tokens
        self._rank = {text: rank[i] for text, i in tokens.items()}
        # Every special token that begins at a position is a prefix of the longest one there, so one
        # lookahead per position (the trie tries longer continuations first) finds them all.
        self._longest_at = re.compile(f"(?=({_trie_pattern(tokens)}))") if tokens else None
        self._longest = max(map(len, tokens), default=1)
        self._shorter = {text: [text[:k] for k in range(len(text) - 1, 0, -1) if text[:k] in tokens] for text in tokens}

    def cuts(self, text: str) -> list[tuple[int, str, int]]:
        """``(start, token text, id)`` of each special token llama.cpp cuts out of ``text``, by position."""
        return run_slices(self.cuts_slices(text))

    def cuts_slices(self, text: str) -> Slices[list[tuple[int, str, int]]]:
        """cuts, in slices: a pause after each CUT_WINDOW positions scanned and each CUT_STEP candidates found
        or taken, the same cuts as at once."""
        if self._longest_at is None or not text:
            return []
        rank, longest = self._rank, self._longest
        # Candidates in llama.cpp's order: by token rank, then left to right. A candidate is cut unless
        # an earlier cut overlaps it, which is what cutting each token from the plain pieces amounts to.
        # Scanned CUT_WINDOW starts at a time, each window seeing the longest token's length past its end.
        heap = []
        for first in range(0, len(text), CUT_WINDOW):
            end = min(len(text), first + CUT_WINDOW)
            for m in self._longest_at.finditer(text, first, min(len(text), end + longest - 1)):
                if m.start() >= end:
                    break
                heap.append((rank[m.group(1)], m.start(), m.group(1)))
                if len(heap) % CUT_STEP == 0:
                    yield
            if end < len(text):  # a text within one window never pauses here
                yield
        heapq.heapify(heap)
        taken = bytearray(len(text))  # 1 where a cut token covers the character
        found = []
        pops = 0
        while heap:
            pops += 1
            if pops == CUT_STEP:
                pops = 0
                yield
            _, start, token = heapq.heappop(heap)
            if taken[start]:
                continue  # so would every shorter token starting here
            end = start + len(token)
            hit = taken.find(1, start, end)
            if hit == -1:
                taken[start:end] = b"\x01" * len(token)
                found.append((start, token, self._ids[token]))
                continue
            # The longest shorter token that stops before the cut still may be cut; it ranks after this
            # one, so the heap hands it over in its turn.
            for shorter in self._shorter[token]:
                if start + len(shorter) <= hit:
                    heapq.heappush(heap, (rank[shorter], start, shorter))
                    break
        found.sort()
        return found


def _trie_pattern(texts: Iterable[str]) -> str:
    """A regex matching the longest of ``texts`` that starts where it is tried: an alternation per trie
    node, so a position costs one test per distinct next character, not one per text."""
    trie: dict = {}
    for text in texts:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = None  # a text ends here

    def alternation(node: dict) -> str:
        branches = [re.escape(ch) + alternation(child) for ch, child in sorted(node.items()) if ch]
        if "" in node:
            branches.append("")  # last, so a longer text that also matches wins
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    return alternation(trie)


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
        return self._utf8.decode(self._tokenizer.decode_bytes((token_id,), skip_special=self._skip_special))

    def flush(self) -> str:
        """End of stream: return held-back bytes (an incomplete character becomes U+FFFD)."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
