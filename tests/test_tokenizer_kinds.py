"""Vocabulary kinds without a server: pre-tokenizer words, SentencePiece mechanics, flags, conversion."""

from __future__ import annotations

import random

import pytest
from tokenizer_vocabs import LLAMA3_STYLE_TEMPLATE, ZEPHYR_STYLE_TEMPLATE, bpe_vocab, spm_vocab, write_vocab_gguf

from pagedkv.model.convert import convert_gguf
from pagedkv.pretokenize import split_words
from pagedkv.tokenizer import (
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    Tokenizer,
)

TEXT = "It's 1234567 I'LL \u00a0 x  \n\n y!!\n中文, 3.14 $5"


@pytest.mark.parametrize(
    ("pre", "words"),
    [
        ("llama-bpe", ["It", "'s", " ", "123", "456", "7", " I", "'LL", " \u00a0", " x", "  \n\n", " y", "!!\n",
                       "中文", ",", " ", "3", ".", "14", " $", "5"]),
        ("qwen2", ["It", "'s", " ", "1", "2", "3", "4", "5", "6", "7", " I", "'LL", " \u00a0", " x", "  \n\n", " y",
                   "!!\n", "中文", ",", " ", "3", ".", "1", "4", " $", "5"]),
        ("gpt-2", ["It", "'s", " 1234567", " I", "'", "LL", " \u00a0", " x", "  \n\n", " y", "!!", "\n", "中文", ",",
                   " 3", ".", "14", " $", "5"]),
        ("default", ["It", "'", "s", " ", "123", "456", "7", " I", "'", "LL", " \u00a0", " x", "  \n\n", " y",
                     "!!", "\n", "中文", ",", " ", "3", ".", "14", " ", "$", "5"]),
    ],
)  # fmt: skip
def test_pre_tokenizer_words(pre, words):
    assert split_words(TEXT, pre) == words


def test_default_pre_tokenizer_groups_only_ascii_digits_in_threes():
    arabic = "\u0661\u0662\u0663\u0664"
    assert split_words(f"12345 {arabic} a+b", "default") == ["123", "45", " ", arabic, " a", "+", "b"]


def _spm(pieces: dict[str, float], *, add_space_prefix: bool = True, byte_fallback: bool = True) -> Tokenizer:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256) if byte_fallback]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * (len(tokens) - 3)
    scores = [0.0] * len(tokens)
    for piece, score in pieces.items():
        tokens.append(piece), types.append(TOKEN_NORMAL), scores.append(score)
    return Tokenizer(tokens, types, model="llama", scores=scores, bos_token_id=1, eos_token_id=2,
                     unknown_token_id=0, add_space_prefix=add_space_prefix)  # fmt: skip


def test_spm_merges_highest_score_first_then_leftmost():
    pieces = {"\u2581": -9, "a": -9, "b": -9, "ab": -1, "\u2581a": -2, "bb": -1}
    tok = _spm(pieces)
    names = lambda ids: [tok.id_to_token(i) for i in ids]  # noqa: E731
    # "▁abb": ab(-1) and bb(-1) tie, the left one wins; then ▁ + ab has no entry.
    assert names(tok.encode("abb")) == ["\u2581", "ab", "b"]
    assert names(tok.encode("bbb")) == ["\u2581", "bb", "b"]
    assert tok.encode("ab", add_special=True)[0] == 1 and tok.add_bos and not tok.add_eos
    assert tok.decode(tok.encode("ab ab")) == " ab ab"


def test_spm_dummy_prefix_starts_text_and_follows_special_tokens():
    tok = _spm({"\u2581": -9, "a": -9, "\u2581a": -1})
    space_a = tok.token_to_id("\u2581a")
    assert tok.encode("a</s>a a") == [space_a, 2, space_a, space_a]
    plain = _spm({"\u2581": -9, "a": -9, "\u2581a": -1}, add_space_prefix=False)
    assert plain.encode("a</s>a a") == [plain.token_to_id("a"), 2, plain.token_to_id("a"), space_a]


def test_spm_byte_fallback_and_missing_byte_token():
    tok = _spm({"\u2581": -9})
    assert [tok.id_to_token(i) for i in tok.encode("é")] == ["\u2581", "<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("é")) == " é"
    bare = _spm({"\u2581": -9}, byte_fallback=False)
    assert len(bare.unencodable_bytes) == 256
    with pytest.raises(ValueError, match=r"character 'é' is not in the vocabulary and byte 0xC3 has no <0xC3>"):
        bare.encode("é")


def test_special_tokens_are_cut_longest_first_as_llama_cpp_does():
    alphabet = [chr(c) for c in range(0x21, 0x7F)]
    tokens = ["ab", "bcd", *alphabet]
    types = [TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_NORMAL] * len(alphabet)
    tok = Tokenizer(tokens, types, [], pre="gpt-2")
    # A leftmost-first scan would take "ab"; llama.cpp cuts the longer "bcd" everywhere first.
    assert tok.encode("abcd") == [tok.token_to_id("a"), 1]
    assert tok.partition("xabx", allow_special=False) == ["xabx"]


def _cut_as_llama_cpp(text: str, order: list[tuple[str, int]]) -> list[str | int]:
    """llama.cpp's tokenizer_st_partition, literally: each token in turn cut out of every plain piece, left to right."""
    fragments: list[str | int] = [text] if text else []
    for token, token_id in order:
        cut: list[str | int] = []
        for fragment in fragments:
            if isinstance(fragment, int):
                cut.append(fragment)
                continue
            pos = fragment.find(token)
            while pos != -1:
                cut.extend([fragment[:pos], token_id] if pos else [token_id])
                fragment = fragment[pos + len(token) :]
                pos = fragment.find(token)
            if fragment:
                cut.append(fragment)
        fragments = cut
    return fragments


def test_special_token_cuts_equal_llama_cpp_order_on_overlapping_tokens():
    # Tokens that overlap one another in every way, one of two UTF-8 bytes ("é"): llama.cpp's order is by byte
    # length, so "éa" (3 bytes) is cut before "ab" though both are two characters and "ab" has the lower id.
    specials = ["abc", "cab", "bca", "ab", "bc", "ca", "a", "aé", "éa", "éé", "é", "aaaa", "aa"]
    alphabet = ["b", "c", "x", "\u2581"]
    tokens = ["<unk>", *specials, *alphabet]
    types = [TOKEN_UNKNOWN] + [TOKEN_USER_DEFINED] * len(specials) + [TOKEN_NORMAL] * len(alphabet)
    tok = Tokenizer(tokens, types, model="llama", scores=[0.0] * len(tokens), unknown_token_id=0, add_bos=False)
    ids = range(1, len(specials) + 1)
    order = [(tokens[i], i) for i in sorted(ids, key=lambda i: (-len(tokens[i].encode()), i))]
    assert tok.partition("éab") == [tokens.index("éa"), "b"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice("abcé x") for _ in range(rng.randrange(40)))
        assert tok.partition(text) == _cut_as_llama_cpp(text, order), text


def test_skip_special_leaves_out_control_tokens_but_renders_user_defined_ones():
    # llama.cpp's token_to_piece without `special`: Gemma's newline runs and HTML tags are user-defined text.
    tokens = ["<unk>", "<s>", "</s>", "\n\n", "<b>", "a"]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_USER_DEFINED, TOKEN_NORMAL]
    tok = Tokenizer(tokens, types, model="llama", scores=[0.0] * 6, bos_token_id=1, unknown_token_id=0)
    ids = [1, 5, 3, 4, 5, 2, 0]
    assert tok.decode(ids) == "<s>a\n\n<b>a</s><unk>"
    assert tok.decode(ids, skip_special=True) == "a\n\n<b>a"
    stream = tok.stream_decoder(skip_special=True)
    assert [stream.push(i) for i in ids] == ["", "a", "\n\n", "<b>", "a", "", ""]


def test_add_bos_defaults_follow_llama_cpp_and_flags_need_ids():
    llama3 = Tokenizer.from_manifest({"tokenizer": {**bpe_vocab("llama-bpe"), "add_bos_token": None}})
    qwen = Tokenizer.from_manifest({"tokenizer": {**bpe_vocab("qwen2"), "add_bos_token": None}})
    assert (llama3.add_bos, qwen.add_bos) == (True, False)
    spec = spm_vocab()
    with_eos = Tokenizer.from_manifest({"tokenizer": {**spec, "add_eos_token": True}})
    assert with_eos.encode("", add_special=True) == [1, 2]
    with pytest.raises(ValueError, match="add_eos is set but eos_token_id is not"):
        Tokenizer.from_manifest({"tokenizer": {**spec, "add_eos_token": True, "eos_token_id": None}})
    with pytest.raises(ValueError, match="takes scores, not 3 merges"):
        Tokenizer(spec["tokens"], spec["token_types"], ["a b"] * 3, model="llama", scores=spec["scores"])
    with pytest.raises(ValueError, match="needs scores"):
        Tokenizer(spec["tokens"], spec["token_types"], model="llama")
    with pytest.raises(ValueError, match=r"scores \(2\) and tokens \(\d+\) differ"):
        Tokenizer(spec["tokens"], spec["token_types"], model="llama", scores=[0.0, 0.0])


@pytest.mark.parametrize("kind", ["llama-bpe", "spm"])
def test_converted_manifest_keeps_the_vocabulary(tmp_path, kind):
    spec = spm_vocab() if kind == "spm" else bpe_vocab(kind)
    template = ZEPHYR_STYLE_TEMPLATE if kind == "spm" else LLAMA3_STYLE_TEMPLATE
    manifest = convert_gguf(write_vocab_gguf(tmp_path / "v.gguf", spec, chat_template=template), tmp_path / "out")
    assert manifest["chat_template"] == template
    expected = {"pre": "default", **spec, "merges": spec.get("merges", []), "padding_token_id": None}
    expected.setdefault("unknown_token_id", None)
    assert manifest["tokenizer"] == expected
    text = "It's 1234567 中文 😀 <|tool|></s>"
    assert Tokenizer.from_manifest(manifest).encode(text) == Tokenizer.from_manifest({"tokenizer": spec}).encode(text)


def test_kinds_and_end_of_generation_ids_follow_llama_cpp_text_rules():
    spec = spm_vocab()
    tok = Tokenizer.from_manifest({"tokenizer": spec})
    eot, fim, channel = (spec["tokens"].index(t) for t in ("<|eot_id|>", "<|fim_prefix|>", "<|channel|>"))
    assert spec["token_types"][eot] == spec["token_types"][fim] == TOKEN_NORMAL
    assert tok.is_special(eot) and tok.is_special(fim) and tok.is_special(channel)
    assert tok.encode("<|eot_id|>", allow_special=False) != [eot]
    assert tok.encode("<|channel|>", allow_special=False) == [channel]  # now user-defined: always atomic
    assert tok.eog_ids == {2, eot}
    qwen = bpe_vocab("qwen2")
    qwen_eog = {qwen["tokens"].index(t) for t in ("<|endoftext|>", "<|im_end|>")}
    assert Tokenizer.from_manifest({"tokenizer": qwen}).eog_ids == qwen_eog
    llama3 = bpe_vocab("llama-bpe")
    assert Tokenizer.from_manifest({"tokenizer": llama3}).eog_ids == {llama3["tokens"].index("<|eot_id|>")}
