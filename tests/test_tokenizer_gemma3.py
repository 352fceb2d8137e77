"""Gemma 3's real vocabulary tokenizes exactly as llama.cpp's server does (its /tokenize endpoint).

The pinned Gemma 3 270M GGUF is a SentencePiece (``llama``) vocabulary of
262,144 pieces with 6,249 control tokens (``<start_of_turn>``, ``<unusedN>``...),
165 user-defined ones that are always atomic (newline, space and tab runs, HTML
tags, ``<s>``; ``</s>`` llama.cpp turns into a control token by its text), byte
fallback, no dummy space prefix, and BOS added. llama.cpp's server loads the file
once for the module; our ids must equal its ids on the golden corpus (56 pinned
texts + 300 seeded mixes) and on Gemma-specific texts, with special-token parsing
on and off and with BOS added, and our text of the ids must equal its.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from llama_server import llama_server
from model_fixtures import gemma3_gguf  # noqa: F401  (session fixture)
from slice_pauses import pauses_and_result
from tokenizer_vocabs import CORPUS

import pagedkv.spm as spm
import pagedkv.tokenizer as tokenizer
from pagedkv.model.convert import open_gguf, tokenizer_from_gguf
from pagedkv.slices import SLICE_CHARS
from pagedkv.tokenizer import Tokenizer

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tokenizer_golden.json").read_text(encoding="utf-8"))
GEMMA_TEXTS = [
    # Chat turns as Gemma's template writes them, and its control tokens misplaced, adjacent, spaced, cut short.
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n",
    "<start_of_turn>system\nBe brief.<end_of_turn>\n<start_of_turn>user\n  two spaces\t tab<end_of_turn>",
    "<end_of_turn><start_of_turn><end_of_turn>",
    " <start_of_turn> model <end_of_turn> ",
    "<start_of_turn",
    "start_of_turn>",
    "<START_OF_TURN>user",
    "<<bos>>",
    "<bos<eos>>",
    "<bos>",
    "x<bos>y<eos>z<pad>w<unk>v<mask>",
    "<unused0><unused99> <unused6241><unused6242>",
    "<unused1<unused2>>",
    "</s>end of sentence <s>start",
    "[multimodal]<start_of_image><end_of_image>",
    # User-defined HTML tags: whole tags only; attributes or unknown tags are plain text.
    "<table><caption>T</caption><thead><tr><th>a</th></tr></thead><tbody><tr><td>1</td></tr></tbody></table>",
    "<h1>Title</h1>\n<h2>Sub</h2>\n<p>para</p>\n<blockquote>q</blockquote>",
    "<strong>bold</strong> <em>it</em> <b>b</b><i>i</i><u>u</u> x<sub>2</sub> e<sup>x</sup>",
    '<a href="https://example.com">link</a> <a>bare</a> <img src="x.png"> <img></img>',
    "<html><body><div><span>s</span><ul><li>one</li><li>two</li></ul></div><footer>f</footer></body></html>",
    "<code>x = 1</code> <iframe></iframe> <bbox>1,2,3,4</bbox>",
    # Whitespace runs around the 31-long newline / space / tab tokens.
    "\n" * 31,
    "\n" * 32,
    "a" + "\n" * 70 + "b",
    " " * 31 + "x",
    " " * 33 + "x" + " " * 2,
    "\t" * 40 + "tabs",
    "\t \t  \n \n\n  \r\n\r\n \u00a0\u3000\u2009end",
    "a \n b  \n\n  c   \t\t\td",
    " leading one",
    "  leading two",
    "trailing  ",
    "\n",
    "\t",
    # Code.
    "def f(x):\n    if x:\n        return x ** 2\n    return None\n\n\nclass A:\n\tpass\n",
    "all:\n\tgcc -O2 -o app main.c\n\n.PHONY: all\n",
    '{\n  "name": "gemma",\n  "layers": 18,\n  "tied": true,\n  "eps": 1e-06\n}',
    "#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "for i in $(seq 1 10); do echo \"$i\" | awk '{print $1*2}'; done",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC LIMIT 10;",
    # Numbers.
    "1234567890 3.14159e-10 -0.5 1,000,000 0x1F 1e100 ٣٤٥ १२३ ๑๒๓",
    "2025-01-31T23:59:59Z 192.168.0.1 +1 (555) 010-9999",
    # Scripts and symbols, some by byte fallback.
    "ქართული ენა Հայերեն தமிழ் አማርኛ བོད་ཡིག ᠮᠣᠩᠭᠣᠯ සිංහල ខ្មែរ ລາວ မြန်မာ",
    "Ελληνικά, Русский, Українська, עברית, العربية, فارسی, हिन्दी, বাংলা, 日本語, 中文, 한국어",
    "👍🏽👨\u200d👩\u200d👧\u200d👦🇫🇷🤖 robots 🦀🐍",
    "𠀀𠀁𠀂 rare CJK, \U0010fffd private use, \u200b zero\u200cwidth\u200d",
    "∀x∈ℝ: x²≥0 ⇒ √(x²)=|x| ∑∫∂ ≠ ≈ ∞",
    "Ġhello ĊnewlineĠ <0x41> <0xFF>",
    "\u2581literal\u2581\u2581lower eighth blocks\u2581",
    "naïve café résumé Ångström Zürich e\u0301 n\u0303",
    # Prose.
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of"
    " foolishness...\n\nChapter 2\n\n\"Quoted,\" she said — and left.",
]
# U+2581 is SentencePiece's space: the ids are right, but they decode to " ".
TEXTS = [e["text"] for e in CORPUS] + [e["text"] for e in GOLDEN["entries"][len(CORPUS) :]] + GEMMA_TEXTS
ROUND_TRIP = [t for t in TEXTS if "\u2581" not in t]


def _post(origin: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        origin + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def spec(gemma3_gguf):  # noqa: F811  (the imported fixture)
    """The GGUF's tokenizer section, as the model converter writes it into the manifest."""
    return tokenizer_from_gguf(open_gguf(gemma3_gguf))


@pytest.fixture(scope="module")
def tok(spec) -> Tokenizer:
    return Tokenizer.from_manifest({"tokenizer": spec})


@pytest.fixture(scope="module")
def origin(gemma3_gguf):  # noqa: F811  (the imported fixture)
    """llama.cpp's server on the Gemma 3 GGUF."""
    with llama_server(gemma3_gguf) as served:
        yield served


def test_the_file_is_the_vocabulary_described(spec, tok):
    counts = {kind: spec["token_types"].count(kind) for kind in (1, 3, 4, 6)}
    assert (spec["model"], spec["pre"], len(spec["tokens"])) == ("llama", "default", 262_144)
    assert counts == {1: 255_474, 3: 6_249, 4: 165, 6: 256}
    assert (spec["bos_token_id"], spec["eos_token_id"], spec["unknown_token_id"], spec["padding_token_id"]) == (
        2, 1, 3, 0,
    )  # fmt: skip
    assert (tok.add_bos, tok.add_eos, spec["add_space_prefix"]) == (True, False, False)
    assert tok.eog_ids == {1, 106, 212}  # <eos>, <end_of_turn>, and </s> by its text
    assert (len(TEXTS), len(GEMMA_TEXTS), len(ROUND_TRIP)) == (408, 52, 407)


def test_ids_equal_llama_cpp_with_special_parsing(tok, origin):
    wrong = [t for t in TEXTS if tok.encode(t) != _post(origin, "/tokenize", {"content": t})["tokens"]]
    assert wrong == []
    assert tok.encode("<start_of_turn>user\n\n\n  x") == [105, 2364, 109, 138, 236781]


def test_ids_equal_llama_cpp_with_special_parsing_off(tok, origin):
    body = {"parse_special": False}
    wrong = [
        t
        for t in TEXTS
        if tok.encode(t, allow_special=False) != _post(origin, "/tokenize", {**body, "content": t})["tokens"]
    ]
    assert wrong == []
    # Control tokens become plain text; user-defined ones (newline runs, HTML tags) stay atomic.
    assert 105 not in tok.encode("<start_of_turn>\n<b>", allow_special=False)
    assert tok.encode("<start_of_turn>\n<b>", allow_special=False)[-2:] == [107, 200]


def test_ids_equal_llama_cpp_with_bos_added(tok, origin):
    body = {"add_special": True}
    wrong = [
        t
        for t in TEXTS
        if tok.encode(t, add_special=True) != _post(origin, "/tokenize", {**body, "content": t})["tokens"]
    ]
    assert wrong == []
    assert tok.encode("", add_special=True) == [2]
    assert tok.encode("<bos>Hi", add_special=True)[:2] == [2, 2]  # as llama.cpp: it only warns of the double BOS


def test_text_of_the_ids_round_trips_and_equals_llama_cpp(tok, origin):
    for text in ROUND_TRIP:
        for ids in (tok.encode(text), tok.encode(text, allow_special=False)):
            assert tok.decode(ids) == text
    assert tok.decode(tok.encode("a\u2581b")) == "a b"
    for text in TEXTS:
        ids = tok.encode(text, add_special=True)
        assert tok.decode(ids) == _post(origin, "/detokenize", {"tokens": ids})["content"]


def test_skipping_special_tokens_keeps_user_defined_ones(tok):
    # Newline and space runs and HTML tags are user-defined tokens: text, which llama.cpp's token_to_piece renders
    # without `special` too; only control tokens are left out.
    ids = tok.encode("<start_of_turn>user\nHi  there<end_of_turn>\n<b>x</b>")
    assert tok.decode(ids, skip_special=True) == "user\nHi  there\n<b>x</b>"
    stream = tok.stream_decoder(skip_special=True)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "user\nHi  there\n<b>x</b>"


def test_special_tokens_cost_what_their_occurrences_cost(spec, tok):
    # Every <...> special once, spaced: cutting each of the 6,414 specials out of every piece in turn took 2.4 s
    # for this 12,641-token text; by their occurrences 0.02 s. The bound leaves a wide margin for a busy machine.
    specials = [t for t, k in zip(spec["tokens"], spec["token_types"]) if k in (3, 4) and t.startswith("<")]
    start = time.perf_counter()
    ids = tok.encode(" ".join(specials))
    assert time.perf_counter() - start < 0.5
    assert ids[::2] == [tok.token_to_id(t) for t in specials]


def test_a_long_text_merged_in_pieces_has_the_ids_of_the_whole(tok, monkeypatch):
    """Every text here, joined into one long one (whitespace runs, scripts, byte fallback, control tokens' text),
    merged in pieces cut at safe points (spm.SpmModel.safe_cut) about every 64 characters: the pieces' ids joined
    are those of the text merged at once, and so are the sliced tokenizer's (slices.py: it pauses between
    slices). Gemma's vocabulary puts "▁" only before a word or in a run of spaces, so most spaces are safe points."""
    model = tok._model
    text = "\n".join(TEXTS)
    whole: list[int] = []
    model.encode(text, whole, True)
    list(model._pairs_slices())
    assert sorted(p for p in model._pairs if p[1] == "\u2581" and p[0] != "\u2581") == [">\u2581"]
    monkeypatch.setattr(spm, "PIECE_CHARS", 64)
    ids: list[int] = []
    pieces = list(model.encode_words(text, ids, True))
    assert ids == whole
    assert len(pieces) >= len(text) // 80, (len(text), len(pieces))
    # Through the tokenizer: a text with no user-defined token in it (Gemma's newline and space runs are) is one
    # piece past SLICE_CHARS, tokenized in slices with the ids of the whole.
    plain = " ".join(t for t in TEXTS if t == t.strip() and tok.partition(t, allow_special=False) == [t])
    long = " ".join([plain] * (2 * SLICE_CHARS // len(plain) + 1))
    assert tok.partition(long, allow_special=False) == [long] and len(long) > 2 * SLICE_CHARS
    whole = [tok.bos_token_id]
    model.encode(long, whole, True)
    pauses, ids = pauses_and_result(tok.encode_slices(long, add_special=True, allow_special=False))
    assert ids == whole
    merged = pauses - pauses_and_result(tok.partition_slices(long, allow_special=False))[0]  # less the cutting's
    assert len(long) // (spm.SLICE_CHARS_SPM + spm.PIECE_CHARS) <= merged <= len(long) // spm.SLICE_CHARS_SPM, \
        (len(long), pauses)


def test_a_text_of_whitespace_runs_is_cut_in_slices(tok, monkeypatch):
    """Gemma's runs of spaces and newlines are user-defined tokens, cut out before SentencePiece merges: a text of
    them is ~1 special token a 31 characters, found and taken in slices (SpecialCutter.cuts_slices: a pause each
    CUT_WINDOW positions scanned and each CUT_STEP candidates). The scan's windows see past their end, so the
    cuts are those of one scan of the whole text, here with windows of 7 positions across every text."""
    text = " " * 100_000 + "\n" * 50_000 + "x"
    pauses, fragments = pauses_and_result(tok.partition_slices(text))
    assert pauses >= len(text) // tokenizer.CUT_WINDOW + len(text) // 31 // tokenizer.CUT_STEP, pauses
    assert fragments[-1] == "x" and all(isinstance(f, int) for f in fragments[:-1])
    assert len(fragments) < len(text) // 15
    mixed = "\n".join(TEXTS) + text[:200] + "<start_of_turn>user\n<end_of_turn>"
    whole = {m: tok.partition(m) for m in (mixed, text)}
    monkeypatch.setattr(tokenizer, "CUT_WINDOW", 7)
    assert {m: tok.partition(m) for m in whole} == whole
    assert "".join(tok.decode([f]) if isinstance(f, int) else f for f in whole[mixed]) == mixed
