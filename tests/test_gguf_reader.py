"""The pure-Python GGUF reader against gguf.GGUFReader (the pinned SmolLM2 file, a made file) and bad files."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize as gguf_quantize
from model_fixtures import gguf_path  # noqa: F401  (pytest fixture)

from pagedkv.model import gguf_reader
from pagedkv.model.gguf_reader import TYPE_SIZES, GGMLType, GGUFError, GGUFFile

SCALARS = {
    "test.u8": ("add_uint8", 200), "test.i8": ("add_int8", -5), "test.u16": ("add_uint16", 60000),
    "test.i16": ("add_int16", -300), "test.u32": ("add_uint32", 4_000_000_000), "test.i32": ("add_int32", -7),
    "test.f32": ("add_float32", 0.1), "test.bool": ("add_bool", True), "test.str": ("add_string", "héllo ✓"),
    "test.u64": ("add_uint64", 2**63), "test.i64": ("add_int64", -(2**40)), "test.f64": ("add_float64", 0.1),
}  # fmt: skip
NESTED = {"test.nested": [[1, 2], [3]], "test.nested_str": [["a", "b"], ["c"]]}


def assert_same_as_gguf(path, nested=()) -> GGUFFile:
    """Every field (contents and types) and tensor (type, shape, offset, data) equal to gguf.GGUFReader's."""
    ours, theirs = GGUFFile.open(path), gguf.GGUFReader(str(path))
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        assert ours.fields[key].types == tuple(t.name for t in field.types), key
        if key not in nested:  # gguf flattens nested arrays (its own FIXME); ours keeps them nested
            assert ours.fields[key].contents() == field.contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, ref in zip(ours.tensors, theirs.tensors):
        assert (mine.tensor_type.name, mine.tensor_type.value) == (ref.tensor_type.name, int(ref.tensor_type))
        assert list(mine.shape) == ref.shape.tolist() and mine.data_offset == ref.data_offset
        assert (mine.n_elements, mine.n_bytes) == (ref.n_elements, ref.n_bytes)
        data = mine.data
        assert data.dtype == ref.data.dtype and data.shape == ref.data.shape, mine.name
        assert data.tobytes() == np.asarray(ref.data).tobytes(), mine.name
    return ours


def test_type_table_matches_gguf():
    for t in GGMLType:
        assert TYPE_SIZES[t.name] == gguf.GGML_QUANT_SIZES[Q(t.value)] and Q[t.name].value == t.value


def test_pinned_smollm2_reads_like_gguf(gguf_path):  # noqa: F811
    ours = assert_same_as_gguf(gguf_path)
    assert len(ours.tensors) == 272 and ours.version == 3 and ours.alignment == 32
    assert len(ours.fields["tokenizer.ggml.tokens"].contents()) == 49152
    assert {t.tensor_type.name for t in ours.tensors} == {"F32", "Q4_1", "Q8_0"}


def write_made_file(path, alignment=None) -> dict:
    """Every metadata type (nested arrays too) and tensors of several types; returns name -> stored data."""
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, (method, value) in SCALARS.items():
        getattr(w, method)(key, value)
    w.add_array("test.floats", [0.5, 1.5, -2.0])
    w.add_array("test.strings", ["x", "", "zé"])
    for key, value in NESTED.items():
        w.add_array(key, value)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    stored = {"f32": x, "f16": x.astype(np.float16), "q8_0": gguf_quantize(x, Q.Q8_0),
              "q4_1": gguf_quantize(x, Q.Q4_1), "bf16": gguf_quantize(x, Q.BF16),
              "q4_k": rng.integers(0, 256, (2, 144), dtype=np.uint8),  # gguf cannot quantize Q4_K: raw blocks
              "vec": rng.standard_normal(5).astype(np.float32)}
    types = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q4_1": Q.Q4_1, "bf16": Q.BF16, "q4_k": Q.Q4_K, "vec": Q.F32}
    for name, data in stored.items():
        w.add_tensor(name, data, raw_dtype=types[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


@pytest.mark.parametrize("alignment", [None, 64])
def test_made_file_reads_like_gguf(tmp_path, alignment):
    path = tmp_path / "made.gguf"
    stored = write_made_file(path, alignment)
    ours = assert_same_as_gguf(path, nested=tuple(NESTED))
    assert ours.alignment == (alignment or 32) and ours.data_start % ours.alignment == 0
    for key, (_, value) in SCALARS.items():
        expected = float(np.float32(value)) if key == "test.f32" else value
        assert ours.fields[key].contents() == expected and type(ours.fields[key].contents()) is type(expected)
    assert ours.fields["test.nested"].contents() == [[1, 2], [3]]
    assert ours.fields["test.nested"].types == ("ARRAY", "ARRAY", "INT32")
    assert ours.fields["test.nested_str"].contents() == [["a", "b"], ["c"]]
    assert ours.fields["test.strings"].contents() == ["x", "", "zé"]
    by_name = {t.name: t for t in ours.tensors}
    for name, data in stored.items():
        assert by_name[name].data.tobytes() == data.tobytes(), name
    assert by_name["q4_k"].shape == (256, 2) and by_name["q4_k"].data.shape == (2, 144)
    assert by_name["bf16"].data.dtype == np.uint8 and by_name["bf16"].data.shape == (3, 128)


def test_header_is_read_in_growing_slices_and_tensor_bytes_on_demand(tmp_path, monkeypatch):
    path = tmp_path / "made.gguf"
    write_made_file(path)
    raw = path.read_bytes()
    reads = []

    def read(offset, nbytes):
        reads.append((offset, nbytes))
        return raw[offset:offset + nbytes]

    monkeypatch.setattr(gguf_reader, "FIRST_READ_BYTES", 64)
    f = GGUFFile(read, len(raw), "made.gguf")
    # 64 bytes, then doubling, each read appending to the last: never a byte twice, never the tensor data
    assert reads[0] == (0, 64) and all(o == a + n for (a, n), (o, _) in zip(reads, reads[1:]))
    assert sum(n for _, n in reads) < f.data_start * 2 and sum(n for _, n in reads) < len(raw)
    reads.clear()
    q4 = next(t for t in f.tensors if t.name == "q4_1")
    assert q4.data.shape == (3, 40) and reads == [(q4.data_offset, 120)]


def header(version=3, n_tensors=0, n_fields=0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_fields)


def gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def read_bytes(data: bytes, name="bad.gguf") -> GGUFFile:
    return GGUFFile(lambda o, n: data[o:o + n], len(data), name)


def test_bad_magic_and_version_are_named():
    with pytest.raises(GGUFError, match=r"^bad.gguf is not a GGUF file: it starts with b'GGML', not b'GGUF'$"):
        read_bytes(b"GGML" + bytes(20))
    with pytest.raises(GGUFError, match=r"^bad.gguf is GGUF version 1; supported versions are 2, 3$"):
        read_bytes(header(version=1))
    with pytest.raises(GGUFError, match=r"^bad.gguf is truncated: the magic at offset 0 needs 4 bytes but the file "
                                        r"ends at 0$"):
        read_bytes(b"")


def test_truncated_files_say_where(tmp_path):
    path = tmp_path / "made.gguf"
    write_made_file(path)
    raw = path.read_bytes()
    full = read_bytes(raw)
    last = full.tensors[-1]
    cut = raw[:last.data_offset + 3]  # inside the last tensor's bytes
    with pytest.raises(GGUFError, match=rf"^bad.gguf is truncated: tensor 'vec' \(F32, shape \[5\]\) needs bytes "
                                        rf"{last.data_offset:,}..{last.data_offset + 20:,} but the file has "
                                        rf"{len(cut):,}$"):
        read_bytes(cut)
    with pytest.raises(GGUFError, match=r"^bad.gguf: the tensor count at offset 8 is 7, but the 86 bytes left in "
                                        r"the file hold at most 2$"):
        read_bytes(raw[:102])  # cut inside the metadata: 7 tensor infos cannot fit what is left
    cut_value = header(n_fields=1) + gguf_string("k") + struct.pack("<I", 10) + bytes(3)  # a UINT64 cut short
    with pytest.raises(GGUFError, match=r"^bad.gguf is truncated: the value of 'k' at offset 37 needs 8 bytes but "
                                        r"the file ends at 40$"):
        read_bytes(cut_value)
    with pytest.raises(GGUFError, match=r"^bad.gguf is truncated: the version at offset 4 needs 4 bytes but the file "
                                        r"ends at 6$"):
        read_bytes(raw[:6])


def test_absurd_counts_are_refused_before_anything_is_allocated():
    with pytest.raises(GGUFError, match=r"^bad.gguf: the tensor count at offset 8 is 1,099,511,627,776, but the 8 "
                                        r"bytes left in the file hold at most 0$"):
        read_bytes(header(n_tensors=2**40))
    array = gguf_string("k") + struct.pack("<IIQ", 9, 4, 2**50)  # an ARRAY of 2**50 UINT32
    with pytest.raises(GGUFError, match=r"^bad.gguf: the length of 'k' at offset 41 is 1,125,899,906,842,624, but "
                                        r"the 0 bytes left in the file hold at most 0$"):
        read_bytes(header(n_fields=1) + array)
    with pytest.raises(GGUFError, match=r"^bad.gguf: metadata 'k' has unknown value type 13 \(known: 0..12\)$"):
        read_bytes(header(n_fields=1) + gguf_string("k") + struct.pack("<II", 13, 0))


def tensor_file(dims: list[int], type_id: int, offset: int = 0, data_bytes: int = 64) -> bytes:
    info = gguf_string("w") + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)
    head = header(n_tensors=1) + info
    return head + bytes(-len(head) % 32) + bytes(data_bytes)


def test_bad_tensor_infos_are_named():
    assert read_bytes(tensor_file([16], 0)).tensors[0].data.tolist() == [0.0] * 16
    with pytest.raises(GGUFError, match=r"^bad.gguf: tensor 'w' has unknown GGML type 4$"):
        read_bytes(tensor_file([16], 4))
    with pytest.raises(GGUFError, match=r"^bad.gguf: tensor 'w' has 5 dimensions \(1..4 allowed\)$"):
        read_bytes(tensor_file([1, 1, 1, 1, 1], 0))
    with pytest.raises(GGUFError, match=r"^bad.gguf: tensor 'w' has shape \[48\], which Q8_0 \(blocks of 32\) "
                                        r"cannot hold in a 128-byte file$"):
        read_bytes(tensor_file([48], 8))
    with pytest.raises(GGUFError, match=r"^bad.gguf: tensor 'w' starts at data offset 8, not a multiple of the "
                                        r"alignment 32$"):
        read_bytes(tensor_file([2], 0, offset=8))
    with pytest.raises(GGUFError, match=r"bad.gguf: tensor 'w' has shape \[4294967296, 4294967296\]"):
        read_bytes(tensor_file([2**32, 2**32], 0))
