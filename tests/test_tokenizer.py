"""Tokenizer: exact agreement with the committed golden ids, decode, streaming, bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gguf_tokenizer import find_gguf, gguf_manifest_sections, smollm2_tokenizer, tokenizer_from_gguf
from slice_pauses import pauses_and_result
import pagedkv.bpe as tokenizer_module
from pagedkv.pretokenize import iter_words, split_words, stand_in
from pagedkv.slices import SLICE_CHARS
from pagedkv.tokenizer import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED, Tokenizer, bytes_to_unicode

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tokenizer_golden.json").read_text(encoding="utf-8"))
ENTRIES = GOLDEN["entries"]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return smollm2_tokenizer()


# ------------------------------------------------------------------ golden


def test_golden_file_covers_the_corpus_of_this_gguf():
    assert len(ENTRIES) == 356
    assert GOLDEN["num_tokens"] == sum(len(e["ids"]) for e in ENTRIES) == 8721
    assert GOLDEN["gguf_sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    digest = hashlib.sha256()
    with open(find_gguf(), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    assert digest.hexdigest() == GOLDEN["gguf_sha256"]
    # The HF-built reference and llama.cpp agreed on every text when the file was made.
    assert (GOLDEN["llama_cpp"], GOLDEN["llama_cpp_tokens_compared"], GOLDEN["llama_cpp_disagreements"]) == (
        "0.3.36",
        12978,
        [],
    )


def test_encode_matches_reference_on_every_golden_entry(tok):
    mismatches = [e["name"] for e in ENTRIES if tok.encode(e["text"]) != e["ids"]]
    assert mismatches == []


def test_pre_tokenizer_words_match_reference_on_every_golden_entry():
    mismatches = [e["name"] for e in ENTRIES if split_words(e["text"], "smollm") != e["words"]]
    assert mismatches == []


@pytest.mark.parametrize("heap_min_symbols", [2, 10**9])
def test_heap_and_scan_merges_each_match_reference(monkeypatch, heap_min_symbols):
    """Force every word through one merge strategy (the default picks by word length)."""
    monkeypatch.setattr(tokenizer_module, "_HEAP_MIN_SYMBOLS", heap_min_symbols)
    fresh = Tokenizer.from_manifest(gguf_manifest_sections())
    mismatches = [e["name"] for e in ENTRIES if fresh.encode(e["text"]) != e["ids"]]
    assert mismatches == []


def test_long_words_take_the_heap_path():
    longest = max(len(w.encode("utf-8")) for e in ENTRIES for w in split_words(e["text"], "smollm"))
    assert longest >= tokenizer_module._HEAP_MIN_SYMBOLS


def test_encode_without_special_matches_reference(tok):
    plain = [e for e in ENTRIES if "ids_plain" in e]
    assert len(plain) == 125
    mismatches = [e["name"] for e in plain if tok.encode(e["text"], allow_special=False) != e["ids_plain"]]
    assert mismatches == []
    assert all(i not in (0, 1, 2) for e in plain for i in e["ids_plain"])


def test_decode_round_trips_every_golden_entry(tok):
    dropped = {chr(b) for b in tok.unencodable_bytes if b < 0x80}
    lossy = [e["name"] for e in ENTRIES if set(e["text"]) & dropped]
    # Only this entry holds ASCII controls that have no token (both references drop them too).
    assert lossy == ["ascii_separators"]
    for e in ENTRIES:
        expected = "".join(c for c in e["text"] if c not in dropped)
        assert tok.decode(e["ids"]) == expected, e["name"]
        assert tok.decode(tok.encode(e["text"])) == expected, e["name"]


def test_unencodable_bytes_are_dropped_like_the_references(tok):
    assert tok.unencodable_bytes.hex() == "04061314161dc0c1f1f2f5f6f7f8f9fafbfcfdfeff"
    assert tok.encode("a\x1db") == [81, 82]


# --------------------------------------------------------------- specials


def test_special_token_ids(tok):
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.eos_token_id, tok.unknown_token_id, tok.padding_token_id) == (1, 2, 0, 2)
    assert (tok.im_start_id, tok.im_end_id) == (1, 2)
    assert tok.token_to_id("<|endoftext|>") == 0
    assert tok.token_to_id("Ġ") == 216
    assert tok.is_special(2) and not tok.is_special(216)


def test_numpy_ids_are_accepted(tok):
    import numpy as np

    ids = np.array([19556, 28, 905, 17], dtype=np.int64)  # (n,)
    assert tok.decode(ids) == "Hello, world!"
    assert tok.check_id(np.int32(2)) == 2 and type(tok.check_id(np.int32(2))) is int


def test_special_tokens_are_atomic(tok):
    assert tok.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]
    assert tok.encode("<|im_start|>user", allow_special=False) == [44, 108, 306, 79, 3738, 108, 46, 4093]
    assert tok.decode([1, 4093, 198, 26843, 2], skip_special=True) == "user\nHi"


# --------------------------------------------------------------- streaming


def test_stream_decode_holds_back_split_characters(tok):
    assert tok.encode("👍") == [10813, 235, 231]
    assert [tok.token_bytes(i) for i in [10813, 235, 231]] == [b"\xf0\x9f", b"\x91", b"\x8d"]
    stream = tok.stream_decoder()
    assert [stream.push(i) for i in [10813, 235, 231]] == ["", "", "👍"]
    assert stream.flush() == ""
    stream = tok.stream_decoder()
    assert [stream.push(i) for i in tok.encode("你好")] == ["", "你", "", "好"]


def test_stream_decode_equals_decode_for_every_golden_entry(tok):
    for e in ENTRIES:
        stream = tok.stream_decoder()
        pieces = [stream.push(i) for i in e["ids"]]
        assert "".join(pieces) + stream.flush() == tok.decode(e["ids"]), e["name"]
        # No piece ever shows a replacement character for a split character.
        assert all("\ufffd" not in p for p in pieces), e["name"]


def test_stream_decode_invalid_and_truncated_utf8(tok):
    lone_continuation = tok.token_to_id(bytes_to_unicode()[0x80])
    assert tok.token_bytes(lone_continuation) == b"\x80"
    stream = tok.stream_decoder()
    assert stream.push(lone_continuation) == "\ufffd"
    assert stream.push(10813) == ""  # b"\xf0\x9f": a 4-byte character cut short
    assert stream.flush() == "\ufffd"
    assert stream.push(tok.token_to_id("a")) == "a"  # usable again after flush


def test_stream_decoder_skip_special(tok):
    stream = tok.stream_decoder(skip_special=True)
    assert [stream.push(i) for i in [1, 4093, 2]] == ["", "user", ""]


# ----------------------------------------------------------- pre-tokenizer


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", []),
        ("a  b", ["a", " ", " b"]),
        ("   1", ["   ", "1"]),
        ("x   1", ["x", "   ", "1"]),
        ("12345", ["1", "2", "3", "4", "5"]),
        ("3.14", ["3", ".", "1", "4"]),
        ("a ½²", ["a", " ", "½", "²"]),
        ("I'm we'll 'S", ["I", "'m", " we", "'ll", " '", "S"]),
        ("end  \n\n", ["end", "  \n\n"]),
        ("end  \nx", ["end", "  ", "\n", "x"]),
        ("Привет, мир!", ["Привет", ",", " мир", "!"]),
        ("a\u00a0b", ["a", "\u00a0", "b"]),
        ("a\u00a0 b", ["a", "\u00a0", " b"]),
        ("a\x1cb", ["a", "\x1c", "b"]),
        ("a\x1f\x0b\x0c b", ["a", "\x1f", "\x0b\x0c", " b"]),
        ("x\x85 y", ["x", "\x85", " y"]),
        ("e\u0301!", ["e", "\u0301!"]),
        ("<|im", ["<|", "im"]),
    ],
)
def test_smollm_pre_tokenizer_words(text, words):
    assert split_words(text, "smollm") == words


def test_gpt2_pre_tokenizer_keeps_digit_runs():
    assert split_words("abc 123 4.5", "gpt2") == ["abc", " 123", " 4", ".", "5"]
    assert split_words("x   1", "gpt2") == ["x", "  ", " 1"]


def test_stand_in_preserves_length_and_classes():
    assert stand_in("aé中٣\u3000\u00a0€ «\u0301") == "aaa0\x0b\x0b` !`"
    assert stand_in("plain ascii") == "plain ascii"


def test_unknown_pre_tokenizer_rejected():
    with pytest.raises(ValueError, match="unsupported pre-tokenizer 'falcon'"):
        split_words("x", "falcon")


# ------------------------------------------------------------ BPE mechanics


def _tiny(merges, extra=()):
    alphabet = list(bytes_to_unicode().values())
    tokens = ["<|im_end|>", *alphabet, *extra]
    types = [TOKEN_CONTROL] + [TOKEN_NORMAL] * (len(tokens) - 1)
    return Tokenizer(tokens, types, merges, pre="gpt2", eos_token_id=0)


def test_bpe_applies_lowest_rank_merge_first():
    first = _tiny(["a b", "b c"], extra=["ab", "bc"])
    ab, bc = first.token_to_id("ab"), first.token_to_id("bc")
    assert first.encode("abc") == [ab, first.token_to_id("c")]
    second = _tiny(["b c", "a b"], extra=["ab", "bc"])
    assert second.encode("abc") == [second.token_to_id("a"), bc]
    # Equal pairs merge left to right without overlap.
    assert first.encode("aaa") == [first.token_to_id("a")] * 3
    repeat = _tiny(["a a"], extra=["aa"])
    assert repeat.encode("aaa") == [repeat.token_to_id("aa"), repeat.token_to_id("a")]


def test_user_defined_tokens_are_atomic_even_without_special():
    alphabet = list(bytes_to_unicode().values())
    tokens = ["<ctl>", "<usr>", *alphabet]
    types = [TOKEN_CONTROL, TOKEN_USER_DEFINED] + [TOKEN_NORMAL] * len(alphabet)
    t = Tokenizer(tokens, types, [], pre="gpt2")
    assert t.encode("<usr><ctl>") == [1, 0]
    assert t.encode("<usr><ctl>", allow_special=False)[0] == 1
    assert len(t.encode("<usr><ctl>", allow_special=False)) == 6


def test_from_manifest_matches_direct_construction(tok):
    assert tokenizer_from_gguf(find_gguf()).encode("Hello, 42 worlds!") == [19556, 28, 216, 36, 34, 10094, 17]
    spec = gguf_manifest_sections()["tokenizer"]
    assert spec["model"] == "gpt2" and spec["pre"] == "smollm"
    assert len(spec["merges"]) == 48900
    direct = Tokenizer(spec["tokens"], spec["token_types"], spec["merges"], pre=spec["pre"])
    assert direct.encode("Hello, 42 worlds!") == tok.encode("Hello, 42 worlds!") == [19556, 28, 216, 36, 34, 10094, 17]


# ---------------------------------------------------------------- bad input


def test_bad_construction_is_rejected():
    alphabet = list(bytes_to_unicode().values())
    normal = [TOKEN_NORMAL] * len(alphabet)
    with pytest.raises(ValueError, match="differ in length"):
        Tokenizer(alphabet, normal[:-1], [])
    with pytest.raises(ValueError, match="unknown token type 9"):
        Tokenizer(alphabet, [9] + normal[1:], [])
    with pytest.raises(ValueError, match="merge 0 is 'ab'"):
        Tokenizer(alphabet, normal, ["ab"])
    with pytest.raises(ValueError, match="merge 1 is 5"):
        Tokenizer(alphabet + ["ab"], normal + [TOKEN_NORMAL], ["a b", 5])
    with pytest.raises(ValueError, match="merge 0 is 'a  b'"):
        Tokenizer(alphabet, normal, ["a  b"])
    with pytest.raises(ValueError, match="produces 'ab', which is not in the vocabulary"):
        Tokenizer(alphabet, normal, ["a b"])
    with pytest.raises(ValueError, match="eos_token_id=999 is outside"):
        Tokenizer(alphabet, normal, [], eos_token_id=999)
    with pytest.raises(ValueError, match="unsupported pre-tokenizer"):
        Tokenizer(alphabet, normal, [], pre="bert")
    with pytest.raises(ValueError, match="vocabulary is empty"):
        Tokenizer([], [], [])


def test_bad_manifest_is_rejected():
    with pytest.raises(ValueError, match="no 'tokenizer' section"):
        Tokenizer.from_manifest({})
    with pytest.raises(ValueError, match=r"lacks \['merges'\]"):
        Tokenizer.from_manifest({"tokenizer": {"model": "gpt2", "pre": "smollm", "tokens": [], "token_types": []}})
    with pytest.raises(ValueError, match="unsupported tokenizer model 'bert'"):
        Tokenizer.from_manifest(
            {"tokenizer": {"model": "bert", "pre": "x", "tokens": [], "token_types": [], "merges": []}}
        )
    with pytest.raises(ValueError, match=r"lacks \['scores'\]"):
        Tokenizer.from_manifest({"tokenizer": {"model": "llama", "tokens": [], "token_types": []}})


def test_bad_ids_and_text_are_rejected(tok):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([49152])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.stream_decoder().push(-1)
    with pytest.raises(ValueError, match="is not an int"):
        tok.decode(["5"])
    with pytest.raises(ValueError, match="is not an int"):
        tok.decode([2.0])
    with pytest.raises(ValueError, match="is not an int"):
        tok.decode([True])
    with pytest.raises(ValueError, match="encode expects str"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.token_to_id("<|nope|>")
    with pytest.raises(ValueError):  # a lone surrogate has no UTF-8 form
        tok.encode("a\ud800")


@pytest.mark.parametrize("pre", ["default", "gpt2", "smollm", "llama3", "qwen2"])
def test_iter_words_are_split_words(pre):
    """iter_words (word by word, for a tokenizing that pauses: slices.py) cuts where split_words does."""
    for text in ("Hello world, it's 2024!\n\n  x", "naïve café 日本語 🙂 12345 über\t\tend", ""):
        assert list(iter_words(text * 3, pre)) == split_words(text * 3, pre)


def test_a_text_longer_than_a_slice_encodes_as_in_one_piece(tok):
    """A piece of text past SLICE_CHARS is tokenized word by word with pauses (encode_words); its ids are those of
    the whole text split at once, also across special tokens."""
    text = "The sea, naïve café 日本 🙂 42 times.\n" * (SLICE_CHARS // 10)
    assert len(text) > 2 * SLICE_CHARS
    whole: list[int] = []
    tok._model.encode(text, whole, True)
    assert tok.encode(text) == whole
    pauses, ids = pauses_and_result(tok.encode_after_slices(text + "<|im_end|>" + text, None))
    assert ids == whole + [tok.encode("<|im_end|>")[0]] + whole
    longest = max(map(len, split_words(text, tok.pre)))
    # a pause once SLICE_CHARS characters are done, the word that passes them the last of its slice, beside the
    # pauses of the scan for special tokens (Tokenizer.partition_slices)
    merged = pauses - pauses_and_result(tok.partition_slices(text + "<|im_end|>" + text))[0]
    assert 2 * len(text) // (SLICE_CHARS + longest) <= merged <= 2 * len(text) // SLICE_CHARS
