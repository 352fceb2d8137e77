"""Hostile GGUFs: each is refused fast, small, and with one message naming the file, the key (or tensor), the
value and what was expected; the conversion leaves nothing behind."""
from __future__ import annotations

import struct
import time
import tracemalloc

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf.quants import quantize as gguf_quantize
from gguf_files import write_small_gguf

from pagedkv.model.convert import convert_gguf
from pagedkv.model.gguf_reader import GGUFError, GGUFFile


def refusal(path, out_dir) -> tuple[str, float, int]:
    """convert_gguf's error on `path`, the seconds it took and the peak bytes Python allocated meanwhile."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ValueError) as info:
            convert_gguf(path, out_dir)
        return str(info.value), time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_million_layers_is_refused_at_once_without_building_them(tmp_path):
    path = tmp_path / "layers.gguf"
    write_small_gguf(path, {"llama.block_count": (1_000_000, V.UINT32)})
    message, seconds, peak = refusal(path, tmp_path / "out")
    assert message == ("layers.gguf: llama.block_count is 1,000,000 (an integer); expected the number of layers the "
                       "tensor table holds: 2 (blk.0..blk.1)")
    assert seconds < 1.0 and peak < 4 << 20  # was 22 s and 2 GB: nine million expected tensor names
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("patch,message", [
    (("GGUF", 1_000_000_000),  # the tensor count, the header's third field
     "bad.gguf: the tensor count at offset 8 is 1,000,000,000, but the {left} bytes left in the file hold at most "
     "{most}"),
    (("tokenizer.ggml.tokens", 10**12),  # the token list's length
     "bad.gguf: the length of 'tokenizer.ggml.tokens' at offset {at} is 1,000,000,000,000, but the {left} bytes "
     "left in the file hold at most {most}"),
])
def test_counts_beyond_the_file_are_refused_before_anything_is_allocated(tmp_path, patch, message):
    good = tmp_path / "good.gguf"
    write_small_gguf(good)
    raw = bytearray(good.read_bytes())
    key, value = patch
    if key == "GGUF":
        at = 8
    else:  # the key's string, then its type ARRAY (u32) and item type (u32), then the u64 length
        at = raw.index(key.encode()) + len(key) + 8
    raw[at:at + 8] = struct.pack("<Q", value)
    (tmp_path / "bad.gguf").write_bytes(bytes(raw))
    got, seconds, peak = refusal(tmp_path / "bad.gguf", tmp_path / "out")
    left = len(raw) - at - 8
    most = left // (32 if key == "GGUF" else 8)  # a tensor info takes 32 bytes at least, a string 8
    assert got == message.format(at=f"{at:,}", left=f"{left:,}", most=f"{most:,}")
    assert seconds < 1.0 and peak < 4 << 20
    with pytest.raises(GGUFError):  # the reader's own error type, a ValueError
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "out")


def test_a_ten_million_token_vocabulary_is_refused_before_its_array_is_read(tmp_path):
    """A file may hold the bytes for ten million tokens (90 MB of one-letter strings): the count alone refuses
    it. The source here claims 200 MB and serves the small file's bytes; the reader reads its first MiB only."""
    write_small_gguf(tmp_path / "good.gguf")
    raw = bytearray((tmp_path / "good.gguf").read_bytes())
    at = raw.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 8
    raw[at:at + 8] = struct.pack("<Q", 10_000_000)
    reads = []

    def read(offset: int, nbytes: int) -> bytes:
        reads.append((offset, nbytes))
        return bytes(raw[offset:offset + nbytes]).ljust(nbytes, b"\0")

    with pytest.raises(GGUFError) as info:
        GGUFFile(read, 200 << 20, "huge.gguf")
    assert str(info.value) == (f"huge.gguf: the length of 'tokenizer.ggml.tokens' at offset {at:,} is 10,000,000; "
                               "this reader takes at most 2,097,152 items in one array, far more than any real "
                               "model has")
    assert reads == [(0, 1 << 20)]  # the header's first MiB; not the 80 MB at least that the array would take


@pytest.mark.parametrize("metadata,message", [
    ({"llama.attention.head_count": (0, V.UINT32)},
     "x.gguf: llama.attention.head_count is 0 (an integer); expected a positive integer"),
    ({"llama.attention.head_count": ("four", V.STRING)},
     "x.gguf: llama.attention.head_count is 'four' (a string); expected a positive integer"),
    ({"llama.attention.head_count": (3, V.UINT32), "llama.rope.dimension_count": None},
     "x.gguf: llama.attention.head_count is 3 (an integer); expected a divisor of llama.embedding_length (64), the "
     "head size being unstated"),
    ({"tokenizer.ggml.tokens": (5, V.UINT32)},
     "x.gguf: tokenizer.ggml.tokens is 5 (an integer); expected an array of strings"),
    ({"tokenizer.ggml.token_type": ([1, 2], V.ARRAY, V.INT32)},
     "x.gguf: tokenizer.ggml.token_type is [1, 2] (an array of 2); expected an array of 512 integers"),
    ({"tokenizer.ggml.eos_token_id": (512, V.UINT32)},
     "x.gguf: tokenizer.ggml.eos_token_id is 512 (an integer); expected a token id below the vocabulary size 512"),
    ({"llama.attention.layer_norm_rms_epsilon": (float("nan"), V.FLOAT32)},
     "x.gguf: llama.attention.layer_norm_rms_epsilon is nan (a number); expected a positive finite number"),
    ({"llama.context_length": (2**40, V.UINT64)},
     "x.gguf: llama.context_length is 1,099,511,627,776 (an integer); expected a positive integer of at most "
     "2,097,152"),
    ({"llama.feed_forward_length": (10**12, V.UINT64)},
     "x.gguf: tensor blk.0.ffn_gate.weight has shape [128, 64], but the metadata gives [1000000000000, 64] "
     "(embedding_length 64, feed_forward_length 1,000,000,000,000, head_count_kv 2 x head size 16, vocabulary 512 "
     "tokens)"),
    ({"llama.attention.head_count_kv": (3, V.UINT32)},
     "x.gguf: n_heads (4) must be a multiple of n_kv_heads (3)"),
    ({"tokenizer.chat_template": None},
     "x.gguf: the metadata has no key 'tokenizer.chat_template' (a string expected)"),
])
def test_malformed_metadata_is_one_message_naming_key_value_and_expectation(tmp_path, metadata, message):
    write_small_gguf(tmp_path / "x.gguf", metadata)
    assert refusal(tmp_path / "x.gguf", tmp_path / "out")[0] == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("template,problem", [
    ("{{ raise_exception('Conversation roles must alternate user/assistant') }}",
     "Conversation roles must alternate user/assistant"),
    ("{% for i in range(10**9) %}x{% endfor %}",
     "it asked for range(1000000000) (1,000,000,000 items; at most 100,000 in one render)"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
     "its range() calls yield more than 100,000 items in one render"),
    ("{{ messages[0]['content'] * 10**9 }}",
     "it repeated a value of 19 items 1,000,000,000 times (at most 1,048,808 items)"),
    ("{{ messages[5]['content'] }}", "list object has no element 5"),
    ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
])
def test_a_template_that_fails_when_rendered_is_refused_at_conversion(tmp_path, template, problem):
    write_small_gguf(tmp_path / "t.gguf", {"tokenizer.chat_template": (template, V.STRING)})
    message, seconds, _ = refusal(tmp_path / "t.gguf", tmp_path / "out")
    assert message == f"t.gguf: tokenizer.chat_template is refused: chat template failed to render: {problem}"
    assert seconds < 1.0


def test_nan_or_inf_weights_are_refused_naming_the_tensor(tmp_path):
    norm = np.ones(64, np.float32)
    norm[[60, 62]] = np.nan, np.inf
    write_small_gguf(tmp_path / "f.gguf", data={"blk.1.attn_norm.weight": (norm, Q.F32)})
    assert refusal(tmp_path / "f.gguf", tmp_path / "out")[0] == (
        "f.gguf: tensor blk.1.attn_norm.weight (F32, shape [64]) holds 2 NaN or infinite weights (the first at "
        "index 60); the file is damaged")
    up = gguf_quantize(np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32), Q.Q8_0)
    up[5, 34:36] = 0x00, 0x7E  # row 5, block 1: its f16 scale d is a NaN
    write_small_gguf(tmp_path / "q.gguf", data={"blk.0.ffn_up.weight": (up, Q.Q8_0)})
    assert refusal(tmp_path / "q.gguf", tmp_path / "out")[0] == (
        "q.gguf: tensor blk.0.ffn_up.weight (Q8_0, shape [128, 64]) holds 1 NaN or infinite block scales (the first "
        "in row 5); the file is damaged")
    assert not (tmp_path / "out").exists()


def test_the_small_file_itself_converts(tmp_path):
    """The hostile files above differ from this one only where each test says."""
    write_small_gguf(tmp_path / "ok.gguf")
    manifest = convert_gguf(tmp_path / "ok.gguf", tmp_path / "out")
    assert manifest["config"]["n_layers"] == 2 and manifest["config"]["vocab"] == 512
