"""A GGUF reader over `read(offset, nbytes) -> bytes`: pure Python + numpy, so it runs in Pyodide too.

`gguf.GGUFReader` maps the whole file (np.memmap), which a browser cannot do with a File the user picked.
This reader parses the header (metadata and tensor infos) from a prefix of the file, growing the prefix
until the header fits, and reads each tensor's bytes only when its `data` is asked for. It exposes what
the converter reads from `gguf.GGUFReader`: `fields[key].contents()` and `tensors` with name,
tensor_type.name, shape (GGUF order), data (numpy, shaped as gguf shapes it).

Malformed files raise GGUFError with the file's name, the offset and the numbers involved.
"""

from __future__ import annotations

import enum
import os
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # version 1 used 32-bit counts and lengths; llama.cpp dropped it too
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
FIRST_READ_BYTES = 1 << 20  # the header is read in a prefix that doubles until it fits
# Bounds far above any real model's, checked when a count is read, before its items are: a file may hold the
# bytes for ten million tokens, but parsing them costs seconds and a gigabyte of Python strings before the
# converter could say the vocabulary does not match the embedding (the largest vocabularies have ~262k tokens;
# the largest headers ~50k tensors, with each MoE expert a tensor of its own).
MAX_ARRAY_ITEMS = 1 << 21
MAX_TENSORS = 1 << 20
MAX_FIELDS = 1 << 16
MAX_STRING_BYTES = 1 << 24  # a chat template, the longest string real files hold, is a few tens of KiB


class GGUFError(ValueError):
    """The file is not a GGUF this reader can parse (bad magic, version, truncated, absurd sizes)."""


class GGMLType(enum.IntEnum):
    """GGML tensor types by their id in the file (ggml.h); names as gguf.GGMLQuantizationType spells them."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


# (elements per block, bytes per block), as gguf.GGML_QUANT_SIZES
TYPE_SIZES = {
    "F32": (1, 4), "F16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q8_0": (32, 34), "Q8_1": (32, 40), "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144),
    "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_K": (256, 292), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74),
    "IQ3_XXS": (256, 98), "IQ1_S": (256, 50), "IQ4_NL": (32, 18), "IQ3_S": (256, 110), "IQ2_S": (256, 82),
    "IQ4_XS": (256, 136), "I8": (1, 1), "I16": (1, 2), "I32": (1, 4), "I64": (1, 8), "F64": (1, 8),
    "IQ1_M": (256, 56), "BF16": (1, 2), "TQ1_0": (256, 54), "TQ2_0": (256, 66), "MXFP4": (32, 17),
}  # fmt: skip
# Types whose `data` is an array of numbers (gguf's reader); every other type is raw bytes per row.
ELEMENT_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                  "I32": np.int32, "I64": np.int64}

# Metadata value types (gguf.GGUFValueType): id -> (name, struct format or None for string / array)
VALUE_TYPES = {
    0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"), 4: ("UINT32", "<I"),
    5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<?"), 8: ("STRING", None), 9: ("ARRAY", None),
    10: ("UINT64", "<Q"), 11: ("INT64", "<q"), 12: ("FLOAT64", "<d"),
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_MIN_VALUE_BYTES = {t: (8 if t == _STRING else 12 if t == _ARRAY else struct.calcsize(f)) for t, (_, f) in
                    VALUE_TYPES.items()}


class _NeedMore(Exception):
    """The header parser ran past the bytes read so far (not an error while the file has more)."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class _Cursor:
    """Reads little-endian values from the header prefix `buf`; knows the whole file's size for sanity checks."""

    def __init__(self, buf: bytes, file_size: int, name: str) -> None:
        self.buf, self.pos, self.file_size, self.name = buf, 0, file_size, name

    def need(self, n: int, what: str) -> None:
        end = self.pos + n
        if end > self.file_size:
            raise GGUFError(f"{self.name} is truncated: {what} at offset {self.pos:,} needs {n:,} bytes but the "
                            f"file ends at {self.file_size:,}")
        if end > len(self.buf):
            raise _NeedMore(end)

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def count(self, what: str, min_item_bytes: int, most: int, unit: str) -> int:
        """A uint64 count of items that must each take at least min_item_bytes of what is left of the file, and
        be at most `most` (`unit`: what the bound counts, for the message)."""
        at = self.pos
        n = self.unpack("<Q", what)
        room = (self.file_size - self.pos) // max(min_item_bytes, 1)
        if n > room:
            raise GGUFError(f"{self.name}: {what} at offset {at:,} is {n:,}, but the {self.file_size - self.pos:,} "
                            f"bytes left in the file hold at most {room:,}")
        if n > most:
            raise GGUFError(f"{self.name}: {what} at offset {at:,} is {n:,}; this reader takes at most {most:,} "
                            f"{unit}, far more than any real model has")
        return n

    def string(self, what: str) -> str:
        n = self.count(f"length of {what}", 1, MAX_STRING_BYTES, "bytes in one string")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{self.name}: {what} at offset {self.pos:,} is not UTF-8 ({exc})") from None
        self.pos += n
        return text

    def strings(self, n: int, what: str) -> list[str]:
        """n strings: the tight loop of a vocabulary (100k+ entries), checked as one() would check each."""
        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        unpack = struct.Struct("<Q").unpack_from
        for i in range(n):
            if pos + 8 > end or pos + 8 + unpack(buf, pos)[0] > end:
                self.pos = pos  # let string() raise the precise error, or ask for more bytes
                self.string(f"item {i} of {what}")
            length = unpack(buf, pos)[0]
            try:
                out.append(buf[pos + 8:pos + 8 + length].decode("utf-8"))
            except UnicodeDecodeError:
                self.pos = pos
                self.string(f"item {i} of {what}")
            pos += 8 + length
        self.pos = pos
        return out

    def array(self, fmt: str, n: int, what: str) -> list:
        size = struct.calcsize(fmt) * n
        self.need(size, what)
        values = np.frombuffer(self.buf, np.dtype(fmt), n, self.pos).tolist()
        self.pos += size
        return values


@dataclass(frozen=True)
class GGUFField:
    """One metadata key: its value types (outermost first, like gguf's ReaderField.types) and its value."""

    name: str
    types: tuple[str, ...]
    value: object

    def contents(self):
        """The value as Python data: str, int, float, bool, or (nested) lists of them (gguf's `contents()`)."""
        return self.value


@dataclass(frozen=True)
class GGUFTensorType:
    name: str
    value: int


class GGUFTensor:
    """One tensor's info; `data` reads its bytes from the file on each access (never cached here)."""

    def __init__(self, file: "GGUFFile", name: str, type_name: str, type_id: int, shape: tuple[int, ...],
                 data_offset: int) -> None:
        self.name, self.shape, self.data_offset, self._file = name, shape, data_offset, file
        self.tensor_type = GGUFTensorType(type_name, type_id)
        block, block_bytes = TYPE_SIZES[type_name]
        self.n_elements = int(np.prod(shape, dtype=np.int64)) if shape else 1
        self.n_bytes = self.n_elements // block * block_bytes

    @property
    def np_shape(self) -> tuple[int, ...]:
        """Row-major shape of `data` (gguf's: dims reversed; quantized rows as bytes)."""
        dims = tuple(reversed(self.shape))
        if self.tensor_type.name in ELEMENT_DTYPES:
            return dims
        block, block_bytes = TYPE_SIZES[self.tensor_type.name]
        return (*dims[:-1], dims[-1] // block * block_bytes)

    @property
    def data(self) -> np.ndarray:
        raw = self._file.read_exact(self.data_offset, self.n_bytes, f"tensor {self.name}")
        dtype = ELEMENT_DTYPES.get(self.tensor_type.name, np.uint8)
        return np.frombuffer(raw, dtype).reshape(self.np_shape)


class GGUFFile:
    """A parsed GGUF header over a `read(offset, nbytes) -> bytes` source of `size` bytes."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, name: str = "GGUF file") -> None:
        self._read, self.size, self.name = read, int(size), name
        buf = self.read_exact(0, min(self.size, FIRST_READ_BYTES), "the header")
        while True:
            try:
                self._parse(buf)
                return
            except _NeedMore as more:
                grow = min(self.size, max(more.end, 2 * len(buf))) - len(buf)
                buf += self.read_exact(len(buf), grow, "the header")

    @classmethod
    def open(cls, path: str | os.PathLike) -> "GGUFFile":
        """A GGUF on disk (CPython); the file is opened for each read, so nothing stays open."""
        path = os.fspath(path)

        def read(offset: int, nbytes: int) -> bytes:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(nbytes)

        return cls(read, os.path.getsize(path), os.path.basename(path))

    def read_exact(self, offset: int, nbytes: int, what: str) -> bytes:
        if offset + nbytes > self.size:
            raise GGUFError(f"{self.name} is truncated: {what} needs bytes {offset:,}..{offset + nbytes:,} but the "
                            f"file has {self.size:,}")
        data = bytes(self._read(offset, nbytes))
        if len(data) != nbytes:
            raise GGUFError(f"{self.name}: reading {what} returned {len(data):,} of {nbytes:,} bytes at {offset:,}")
        return data

    def _parse(self, buf: bytes) -> None:
        c = _Cursor(buf, self.size, self.name)
        c.need(4, "the magic")
        magic = buf[:4]
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.name} is not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r}")
        c.pos = 4
        self.version = c.unpack("<I", "the version")
        if self.version not in SUPPORTED_VERSIONS:
            raise GGUFError(f"{self.name} is GGUF version {self.version}; supported versions are "
                            f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
        # a tensor info: name, n_dims, one dim, type, offset; a metadata entry: key length, value type
        n_tensors = c.count("the tensor count", 8 + 4 + 8 + 4 + 8, MAX_TENSORS, "tensors")
        n_fields = c.count("the metadata count", 8 + 4, MAX_FIELDS, "metadata keys")
        # gguf's reader lists the header's counts as fields too
        self.fields: dict[str, GGUFField] = {
            "GGUF.version": GGUFField("GGUF.version", ("UINT32",), self.version),
            "GGUF.tensor_count": GGUFField("GGUF.tensor_count", ("UINT64",), n_tensors),
            "GGUF.kv_count": GGUFField("GGUF.kv_count", ("UINT64",), n_fields),
        }
        for _ in range(n_fields):
            key = c.string("a metadata key")
            if key in self.fields:
                raise GGUFError(f"{self.name}: metadata key {key!r} appears twice")
            types, value = self._value(c, c.unpack("<I", f"the type of {key!r}"), key)
            self.fields[key] = GGUFField(key, types, value)
        self.alignment = self._alignment()
        infos = [self._tensor_info(c) for _ in range(n_tensors)]
        self.data_start = c.pos + (-c.pos % self.alignment)
        self.tensors: list[GGUFTensor] = []
        seen: set[str] = set()
        for name, type_name, type_id, shape, offset in infos:
            if name in seen:
                raise GGUFError(f"{self.name}: tensor {name!r} appears twice")
            seen.add(name)
            if offset % self.alignment:
                raise GGUFError(f"{self.name}: tensor {name!r} starts at data offset {offset:,}, not a multiple of "
                                f"the alignment {self.alignment}")
            tensor = GGUFTensor(self, name, type_name, type_id, shape, self.data_start + offset)
            if tensor.data_offset + tensor.n_bytes > self.size:
                raise GGUFError(f"{self.name} is truncated: tensor {name!r} ({type_name}, shape {list(shape)}) needs "
                                f"bytes {tensor.data_offset:,}..{tensor.data_offset + tensor.n_bytes:,} but the file "
                                f"has {self.size:,}")
            self.tensors.append(tensor)

    def _value(self, c: _Cursor, type_id: int, key: str, depth: int = 0) -> tuple[tuple[str, ...], object]:
        if type_id not in VALUE_TYPES:
            raise GGUFError(f"{self.name}: metadata {key!r} has unknown value type {type_id} (known: 0..12)")
        type_name, fmt = VALUE_TYPES[type_id]
        if fmt is not None:
            return (type_name,), c.unpack(fmt, f"the value of {key!r}")
        if type_id == _STRING:
            return (type_name,), c.string(f"the value of {key!r}")
        if depth >= 8:
            raise GGUFError(f"{self.name}: metadata {key!r} nests arrays more than 8 deep")
        item_type = c.unpack("<I", f"the item type of {key!r}")
        if item_type not in VALUE_TYPES:
            raise GGUFError(f"{self.name}: metadata {key!r} is an array of unknown value type {item_type}")
        n = c.count(f"the length of {key!r}", _MIN_VALUE_BYTES[item_type], MAX_ARRAY_ITEMS, "items in one array")
        item_name, item_fmt = VALUE_TYPES[item_type]
        if item_fmt is not None:
            return (type_name, item_name), c.array(item_fmt, n, f"the items of {key!r}")
        if item_type == _STRING:
            return (type_name, item_name), c.strings(n, repr(key))
        items, inner = [], (item_name,)
        for _ in range(n):
            inner, value = self._value(c, item_type, key, depth + 1)
            items.append(value)
        return (type_name, *inner), items

    def _alignment(self) -> int:
        field = self.fields.get("general.alignment")
        if field is None:
            return DEFAULT_ALIGNMENT
        value = field.contents()
        if field.types != ("UINT32",) or value <= 0 or value & (value - 1):
            raise GGUFError(f"{self.name}: general.alignment must be a power-of-two uint32, got {value!r} "
                            f"({'/'.join(field.types)})")
        return value

    def _tensor_info(self, c: _Cursor) -> tuple[str, str, int, tuple[int, ...], int]:
        name = c.string("a tensor name")
        n_dims = c.unpack("<I", f"the dimension count of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{self.name}: tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        shape = tuple(c.array("<Q", n_dims, f"the dimensions of tensor {name!r}"))
        type_id = c.unpack("<I", f"the type of tensor {name!r}")
        try:
            type_name = GGMLType(type_id).name
        except ValueError:
            raise GGUFError(f"{self.name}: tensor {name!r} has unknown GGML type {type_id}") from None
        block, _ = TYPE_SIZES[type_name]
        if min(shape) < 1 or shape[0] % block or int(np.prod([float(d) for d in shape])) > self.size * 256:
            raise GGUFError(f"{self.name}: tensor {name!r} has shape {list(shape)}, which {type_name} "
                            f"(blocks of {block}) cannot hold in a {self.size:,}-byte file")
        offset = c.unpack("<Q", f"the data offset of tensor {name!r}")
        return name, type_name, type_id, shape, offset
