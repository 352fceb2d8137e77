"""Every vocabulary kind we read tokenizes exactly as llama.cpp's server does (its /tokenize endpoint).

For each kind a synthetic vocabulary (tests/tokenizer_vocabs.py) is written into
a tiny GGUF that llama.cpp's server (the `xllamacpp` wheel) loads; the same
section, through ``Tokenizer.from_manifest``, must give the server's ids on the
pinned texts: the 56 corpus texts (ASCII, digit runs, contractions, CJK, emoji,
whitespace runs, newlines, ...), the 300 seeded mixes of the golden file, and
texts holding the vocabulary's own special tokens.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from llama_server import llama_server
from tokenizer_vocabs import BPE_FAMILIES, CORPUS, bpe_vocab, spm_vocab, write_vocab_gguf

from pagedkv.tokenizer import Tokenizer

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tokenizer_golden.json").read_text(encoding="utf-8"))
TEXTS = [e["text"] for e in CORPUS] + [e["text"] for e in GOLDEN["entries"][len(CORPUS) :]]
KINDS = [*BPE_FAMILIES, "spm", "spm-no-prefix"]


def _spec(kind: str) -> dict:
    if kind == "spm":
        return spm_vocab()
    if kind == "spm-no-prefix":
        return spm_vocab(add_space_prefix=False)
    return bpe_vocab(kind)


def _special_texts(spec: dict) -> list[str]:
    """Texts built from the vocabulary's own control and user-defined tokens, at edges, adjacent and spaced."""
    specials = [t for t, k in zip(spec["tokens"], spec["token_types"]) if k in (2, 3, 4)]
    a, b, c = specials[0], specials[1], specials[-1]
    return [
        f"{a}user\nHi there!{b}\n{a}assistant\n",
        f"{a}{b}{c}x{c} {a} spaced  {b}\n\n{b}",
        f" {a}  leading and trailing  {b} ",
        f"{a[:-1]} {b[1:]} {c.upper()} {a}{a}",
        f"x{c}y{a}1234567{b}中文😀",
        "<|eot_id|>x <|channel|>y<|fim_prefix|> z",
    ]


def _post(origin: str, body: dict) -> list[int]:
    req = urllib.request.Request(
        origin + "/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["tokens"]


@pytest.fixture(scope="module", params=KINDS)
def served(request, tmp_path_factory):
    """(kind, spec, our Tokenizer, server origin) for one vocabulary kind."""
    spec = _spec(request.param)
    gguf = write_vocab_gguf(tmp_path_factory.mktemp(request.param) / "vocab.gguf", spec)
    with llama_server(gguf) as origin:
        yield request.param, spec, Tokenizer.from_manifest({"tokenizer": spec}), origin


def test_ids_equal_llama_cpp_on_the_pinned_texts(served):
    kind, spec, tok, origin = served
    texts = TEXTS + _special_texts(spec)
    wrong = [t for t in texts if tok.encode(t) != _post(origin, {"content": t, "add_special": False})]
    assert wrong == []
    assert len(texts) == 362


def test_ids_equal_llama_cpp_with_special_parsing_off_and_bos_eos_on(served):
    kind, spec, tok, origin = served
    texts = [t for t in TEXTS if "<" in t] + _special_texts(spec)
    off = [
        t for t in texts if tok.encode(t, allow_special=False) != _post(origin, {"content": t, "parse_special": False})
    ]
    assert off == []
    sample = ["", "Hello world", *_special_texts(spec)]
    bos = [t for t in sample if tok.encode(t, add_special=True) != _post(origin, {"content": t, "add_special": True})]
    assert bos == []
    assert tok.add_bos == spec["add_bos_token"]
    assert tok.encode("", add_special=True) == ([spec["bos_token_id"]] if spec["add_bos_token"] else [])


def test_decode_round_trips_what_the_vocabulary_can_spell(served):
    kind, spec, tok, origin = served
    dropped = {chr(b) for b in tok.unencodable_bytes if b < 0x80}
    for text in TEXTS:
        ids = tok.encode(text, allow_special=False)
        expected = "".join(ch for ch in text if ch not in dropped)
        if kind == "spm":  # the dummy prefix is a real space in the ids
            expected = " " + expected if text else ""
        assert tok.decode(ids) == expected, text
