"""A long SentencePiece text is merged in pieces cut at safe points (spm.SpmModel.safe_cut), so that tokenizing
it pauses between slices (slices.py, issue 49): the pieces' ids, joined, are the ids of the whole text merged at
once. Checked on seeded mixes of the corpus with whitespace runs, scripts and characters that fall back to bytes,
cut every few characters, on a vocabulary whose whitespace runs merge (no cut may fall inside them)."""
from __future__ import annotations

import random

import pytest
from tokenizer_vocabs import CORPUS_TEXT, spm_vocab
from slice_pauses import pauses_and_result

import pagedkv.spm as spm
from pagedkv.slices import SLICE_CHARS
from pagedkv.spm import SPACE
from pagedkv.tokenizer import TOKEN_NORMAL, Tokenizer

# Pieces the fixture vocabulary lacks (it has "\t\t"), scored above every merge: whitespace runs that merge, so a
# cut inside a run would change the ids (test_a_cut_inside_a_run_would_change_its_ids).
RUNS = {SPACE * 2: 1.0, SPACE * 4: 2.0, "\n\n": 1.0}
# Inserted between corpus pieces: runs, a lone ▁ written by the text itself, scripts, and characters with no
# piece (🦀, 𠀀, U+10FFFD, 本: written as their UTF-8 bytes).
ODD = ["   ", "      ", " ", "\t\t\t", "\n\n\n", "\n", " \n \t ", SPACE, SPACE + SPACE + "x", "日本語", "🦀🦀",
       "𠀀", "\U0010fffd", "naïve café", "١٢٣", "😀 ", "<|tool|>"]


@pytest.fixture(scope="module")
def spec() -> dict:
    base = spm_vocab()
    spec = {**base, "tokens": list(base["tokens"]), "token_types": list(base["token_types"]),
            "scores": list(base["scores"])}
    for piece, score in RUNS.items():
        spec["tokens"].append(piece), spec["token_types"].append(TOKEN_NORMAL), spec["scores"].append(score)
    return spec


def mixed_text(seed: int, chars: int) -> str:
    """Seeded pieces of the corpus with ODD's between them, about `chars` long."""
    rng = random.Random(seed)
    parts, size = [], 0
    while size < chars:
        start = rng.randrange(len(CORPUS_TEXT) - 80)
        part = CORPUS_TEXT[start:start + rng.randrange(1, 80)] + rng.choice(ODD)
        parts.append(part)
        size += len(part)
    return "".join(parts)


def whole_ids(tok: Tokenizer, text: str, after_special: bool = True) -> list[int]:
    ids: list[int] = []
    tok._model.encode(text, ids, after_special)
    return ids


@pytest.mark.parametrize("add_space_prefix", [True, False])
def test_pieces_cut_at_safe_points_join_to_the_ids_of_the_whole(spec, monkeypatch, add_space_prefix):
    tok = Tokenizer.from_manifest({"tokenizer": {**spec, "add_space_prefix": add_space_prefix}})
    model = tok._model
    scanned = sum(model._pairs_slices())  # the pairs are learnt once, then only text pieces are yielded
    assert scanned == sum(map(len, spec["tokens"]))
    monkeypatch.setattr(spm, "PIECE_CHARS", 3)  # a cut at the first safe point 3 characters into each piece
    for seed in range(6):
        text = mixed_text(seed, 4000)
        for after_special in (True, False):
            ids: list[int] = []
            pieces = list(model.encode_words(text, ids, after_special))
            assert ids == whole_ids(tok, text, after_special), seed
            spaced = (" " if add_space_prefix and after_special else "") + text
            assert sum(pieces) == len(spaced)
            assert len(pieces) >= len(spaced) // 12, (seed, len(pieces))  # cut every few characters indeed
            cuts = [sum(pieces[:k]) for k in range(1, len(pieces))]
            spaced = spaced.replace(" ", SPACE)
            # never inside a run that merges, and beside characters that have no piece
            assert not any(spaced[c - 1] == spaced[c] and spaced[c] in SPACE + "\n\t" for c in cuts)
            assert any(spaced[c - 1] in "🦀𠀀\U0010fffd本" for c in cuts)


def test_a_cut_inside_a_run_would_change_its_ids(spec):
    """Why safe points: a run of four spaces merges into one piece, which two halves of it do not give."""
    tok = Tokenizer.from_manifest({"tokenizer": spec})
    text = "the" + " " * 4 + "sea"
    # past the run: "▁s" and "se" are in pieces, "ea" in none
    assert tok._model.safe_cut(text.replace(" ", SPACE), 4) == 9
    run = tok.token_to_id(SPACE * 4)
    assert run in whole_ids(tok, text)
    halves = whole_ids(tok, "the  ") + whole_ids(tok, "  sea", False)
    assert run not in halves and halves != whole_ids(tok, text)


def test_a_long_text_is_tokenized_in_slices_with_the_ids_of_the_whole(spec):
    """Through the tokenizer: a text past SLICE_CHARS (special tokens in it) pauses after about every
    SLICE_CHARS characters, and its ids are its pieces between special tokens each merged whole."""
    tok = Tokenizer.from_manifest({"tokenizer": spec})
    text = mixed_text(7, 3 * SLICE_CHARS) + "</s>" + mixed_text(8, SLICE_CHARS + 5)
    expected = [tok.bos_token_id]
    after_special = True
    for fragment in tok.partition(text):
        if isinstance(fragment, int):
            expected.append(fragment)
            after_special = True
        else:
            expected += whole_ids(tok, fragment, after_special)
            after_special = False
    pauses, ids = pauses_and_result(tok.encode_slices(text, add_special=True))
    assert ids == expected
    vocab_chars = sum(map(len, spec["tokens"]))  # learnt on the first long piece, in the same slices
    cutting, fragments = pauses_and_result(tok.partition_slices(text))  # the special tokens' scan pauses too
    merged = pauses - cutting  # SentencePiece's slices are SLICE_CHARS_SPM characters, a piece between two
    # special tokens (fragments) at once where it fits in one, so a slice may end early at each
    plain = sum(isinstance(f, str) for f in fragments)
    assert len(text) // (spm.SLICE_CHARS_SPM + spm.PIECE_CHARS) <= merged - vocab_chars // spm.SLICE_CHARS_SPM \
        <= (len(text) + vocab_chars) // spm.SLICE_CHARS_SPM + plain
    assert tok.encode(text, add_special=True) == expected


def test_a_run_with_no_safe_cut_pauses_while_it_is_scanned_and_merged(spec):
    """A run of spaces that all merge (RUNS) has no safe cut, so it is one piece however long: the scan for its
    end and its merge pause every MERGE_STEP characters or heap pops (before, 4 MiB of such a run merged in
    one go, seconds of CPython), with the ids of the run merged at once."""
    tok = Tokenizer.from_manifest({"tokenizer": spec})
    model = tok._model
    list(model._pairs_slices())
    text = " " * (4 * spm.MERGE_STEP)
    ids: list[int] = []
    work = list(model.encode_words(text, ids, True))
    assert ids == whole_ids(tok, text) and len(ids) < len(text) // 3  # merged into runs of four
    # one piece: scanned past PIECE_CHARS in windows (3 pauses), its pairs pushed (4) and popped (at least 4)
    assert len(work) >= 3 + 4 + 4 and work[-1] == len(text) + 1, work
    pauses, got = pauses_and_result(tok.encode_slices(text))
    assert got == ids and pauses >= len(text) // spm.MERGE_STEP, pauses
