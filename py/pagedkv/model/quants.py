"""Every weight type of the web format: GGUF blocks <-> fields <-> u32-aligned parts, and dequantization.

A tensor moves through three forms:

  raw GGUF bytes (rows, row_bytes) u8  --from_gguf-->  fields  --pack-->  parts (bytes, model/layout.py)
                                       <--to_gguf---           <-unpack-

"Fields" are plain numpy arrays: the integer codes of every weight, one per weight and unsigned as GGUF
stores them (`q`, (rows, cols) u8; i8 for q8_0), and the block scales exactly as GGUF stores them (f16,
or the packed 6-bit K-quant scale bytes). Both directions are lossless, so `to_gguf(from_gguf(raw)) ==
raw`. `dequantize_fields` performs the same f32 operations in the same order as `gguf.quants.dequantize`,
so the result is bit-identical to gguf's on the raw bytes. Runs under Pyodide (numpy only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK = 32  # weights per block of the legacy quants (and per sub-block of the K-quants)
QK_K = 256  # weights per K-quant super-block


@dataclass(frozen=True)
class WeightType:
    """One weight type: its manifest name, GGUF type name, GGUF block geometry and web parts."""

    name: str
    gguf: str
    block: int  # weights per GGUF block (1 for the float types)
    block_bytes: int  # bytes per GGUF block
    parts: tuple[str, ...]

    @property
    def quantized(self) -> bool:
        return self.block > 1


WEIGHT_TYPES = {
    t.name: t
    for t in (
        WeightType("f32", "F32", 1, 4, ("data",)),
        WeightType("f16", "F16", 1, 2, ("data",)),
        WeightType("bf16", "BF16", 1, 2, ("data",)),
        WeightType("q8_0", "Q8_0", QK, 34, ("qs", "d")),
        WeightType("q4_0", "Q4_0", QK, 18, ("qs", "d")),
        WeightType("q4_1", "Q4_1", QK, 20, ("qs", "dm")),
        WeightType("q5_0", "Q5_0", QK, 22, ("qs", "dh")),
        WeightType("q5_1", "Q5_1", QK, 24, ("qs", "dh")),
        WeightType("q4_K", "Q4_K", QK_K, 144, ("qs", "sc")),
        WeightType("q5_K", "Q5_K", QK_K, 176, ("qs", "sc")),
        WeightType("q6_K", "Q6_K", QK_K, 210, ("qs", "sc")),
    )
}
BY_GGUF = {t.gguf: t for t in WEIGHT_TYPES.values()}
SC_WORDS = {"q4_K": 4, "q5_K": 12, "q6_K": 21}  # u32 words of the "sc" part per 256-weight super-block


def weight_type(name: str) -> WeightType:
    """The WeightType of a manifest dtype name; ValueError naming the supported ones otherwise."""
    if name not in WEIGHT_TYPES:
        raise ValueError(f"unsupported tensor dtype {name!r}; supported: {list(WEIGHT_TYPES)}")
    return WEIGHT_TYPES[name]


def check_shape(name: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of a quantized tensor: 2-D with cols a multiple of the type's block."""
    block = weight_type(name).block
    if len(shape) != 2 or shape[1] % block or shape[1] == 0:
        raise ValueError(f"{name} tensor must be 2-D with cols a multiple of {block}, got shape {list(shape)}")
    return int(shape[0]), int(shape[1])


# ---- small bit helpers -------------------------------------------------------


def _f16(raw: np.ndarray) -> np.ndarray:
    """(..., 2) u8 -> (...) f16."""
    return np.ascontiguousarray(raw).view("<f2")[..., 0]


def _u8(a: np.ndarray, dtype: str) -> np.ndarray:
    """(...) array -> (..., itemsize) u8 of its little-endian bytes."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return a.view(np.uint8).reshape(*a.shape, a.dtype.itemsize)


def _split_nibbles(b: np.ndarray, span: int) -> np.ndarray:
    """(n, k) bytes -> (n, 2k) codes: in each run of span/2 bytes, byte l holds weight l (low nibble) and
    weight l + span/2 (high nibble) of its span: GGUF's nibble order."""
    n = b.shape[0]
    b = b.reshape(n, -1, 1, span // 2)
    return np.concatenate([b & 0x0F, b >> 4], axis=2).reshape(n, -1)


def _join_nibbles(q: np.ndarray, span: int) -> np.ndarray:
    n = q.shape[0]
    q = q.reshape(n, -1, 2, span // 2).astype(np.uint8)
    return ((q[:, :, 0] & 0x0F) | (q[:, :, 1] << 4)).reshape(n, -1)


def _bits_to_words(bits: np.ndarray, width: int) -> np.ndarray:
    """(..., 32 / width * k) values of `width` bits -> (..., k) u32, value j at bits width * (j % per)."""
    per = 32 // width
    v = bits.astype(np.uint32).reshape(*bits.shape[:-1], -1, per)
    shifts = (np.arange(per, dtype=np.uint32) * width).reshape((1,) * (v.ndim - 1) + (per,))
    return np.bitwise_or.reduce(v << shifts, axis=-1).astype("<u4")


def _words_to_bits(words: np.ndarray, width: int) -> np.ndarray:
    per = 32 // width
    shifts = (np.arange(per, dtype=np.uint32) * width).reshape((1,) * words.ndim + (per,))
    v = (words.astype(np.uint32)[..., None] >> shifts) & ((1 << width) - 1)
    return v.reshape(*words.shape[:-1], -1).astype(np.uint8)


def _pad4(raw: bytes) -> bytes:
    return raw + b"\0" * (-len(raw) % 4)


# ---- GGUF bytes <-> fields ----------------------------------------------------


def from_gguf(name: str, raw: np.ndarray, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Split GGUF bytes of a (rows, cols) tensor of type `name` into its fields (see the module docstring)."""
    t = weight_type(name)
    rows, cols = check_shape(name, shape)
    nb = cols // t.block
    flat = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if flat.size != rows * nb * t.block_bytes:
        raise ValueError(f"{name} tensor of shape {[rows, cols]} needs {rows * nb * t.block_bytes} GGUF bytes, "
                         f"got {flat.size}")
    b = flat.reshape(rows * nb, t.block_bytes)
    if name == "q8_0":
        return {"q": b[:, 2:].copy().view(np.int8).reshape(rows, cols), "d": _f16(b[:, 0:2]).reshape(rows, nb)}
    if t.block == QK:
        has_m = name in ("q4_1", "q5_1")
        f = {"d": _f16(b[:, 0:2]).reshape(rows, nb)}
        if has_m:
            f["m"] = _f16(b[:, 2:4]).reshape(rows, nb)
        at = 4 if has_m else 2
        q = _split_nibbles(b[:, at + (4 if name.startswith("q5") else 0):], QK)
        if name.startswith("q5"):
            high = np.unpackbits(b[:, at : at + 4], axis=1, bitorder="little")  # (blocks, 32)
            q = q | (high << 4)
        f["q"] = q.reshape(rows, cols)
        return f
    if name == "q6_K":
        ql = _split_nibbles(b[:, :128], 128)  # (blocks, 256) low 4 bits
        qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        q = ql | ((qh & 3).reshape(-1, QK_K) << 4)
        return {"q": q.reshape(rows, cols), "sc": b[:, 192:208].view(np.int8).reshape(rows, nb, 16),
                "d": _f16(b[:, 208:210]).reshape(rows, nb)}
    f = {"d": _f16(b[:, 0:2]).reshape(rows, nb), "dmin": _f16(b[:, 2:4]).reshape(rows, nb),
         "scales": b[:, 4:16].reshape(rows, nb, 12).copy()}
    if name == "q4_K":
        f["q"] = _split_nibbles(b[:, 16:], 64).reshape(rows, cols)
    else:  # q5_K: bit s of qh[l] is bit 4 of weight 32 s + l
        high = np.unpackbits(b[:, 16:48, None], axis=2, bitorder="little")  # (blocks, l, s)
        f["q"] = (_split_nibbles(b[:, 48:], 64) | (high.transpose(0, 2, 1).reshape(-1, QK_K) << 4)).reshape(rows, cols)
    return f


def to_gguf(name: str, fields: dict[str, np.ndarray]) -> np.ndarray:
    """The GGUF bytes (rows, row_bytes) u8 of a tensor's fields: the inverse of from_gguf."""
    t = weight_type(name)
    rows, cols = fields["q"].shape
    nb = cols // t.block
    q = fields["q"].reshape(rows * nb, t.block)
    d = _u8(fields["d"].reshape(-1), "<f2")
    if name == "q8_0":
        out = [d, q.astype(np.int8).view(np.uint8)]
    elif t.block == QK:
        out = [d] + ([_u8(fields["m"].reshape(-1), "<f2")] if "m" in fields else [])
        if name.startswith("q5"):
            out.append(np.packbits((q >> 4) & 1, axis=1, bitorder="little"))
        out.append(_join_nibbles(q & 0x0F, QK))
    elif name == "q6_K":
        high = ((q >> 4) & 3).reshape(-1, 2, 4, 32) << np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        qh = np.bitwise_or.reduce(high, axis=2).reshape(-1, 64)
        out = [_join_nibbles(q & 0x0F, 128), qh, fields["sc"].reshape(-1, 16).view(np.uint8), d]
    else:
        out = [d, _u8(fields["dmin"].reshape(-1), "<f2"), fields["scales"].reshape(-1, 12)]
        if name == "q5_K":
            bits = ((q >> 4) & 1).reshape(-1, 8, 32).transpose(0, 2, 1)  # (blocks, l, s)
            out.append(np.packbits(bits, axis=2, bitorder="little").reshape(-1, 32))
        out.append(_join_nibbles(q & 0x0F, 64))
    return np.concatenate([np.asarray(a, np.uint8).reshape(rows * nb, -1) for a in out], axis=1).reshape(rows, -1)


# ---- fields <-> parts -----------------------------------------------------------


def _nibble_words(q: np.ndarray) -> np.ndarray:
    """(rows, cols) codes -> (rows, cols/8) u32 of their low 4 bits, weight k at bits 4 (k % 8)."""
    return _bits_to_words(q & 0x0F, 4)


def _f16_bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, "<f2").view("<u2").astype("<u4")


def pack(name: str, fields: dict[str, np.ndarray]) -> dict[str, bytes]:
    """A quantized tensor's fields -> its web parts (layout.py's LAYOUT_DOC describes each)."""
    t = weight_type(name)
    q = fields["q"]
    rows, cols = q.shape
    if name == "q8_0":
        return {"qs": q.astype(np.int8).tobytes(), "d": _pad4(np.asarray(fields["d"], "<f2").tobytes())}
    qs = _nibble_words(q).tobytes()
    nb = cols // t.block
    if name == "q4_0":
        return {"qs": qs, "d": _pad4(np.asarray(fields["d"], "<f2").tobytes())}
    if name == "q4_1":
        return {"qs": qs, "dm": (_f16_bits(fields["d"]) | (_f16_bits(fields["m"]) << 16)).tobytes()}
    if name in ("q5_0", "q5_1"):
        dm = _f16_bits(fields["d"]) | (_f16_bits(fields["m"]) << 16 if "m" in fields else 0)
        high = _bits_to_words((q >> 4) & 1, 1).reshape(rows, nb)
        return {"qs": qs, "dh": np.stack([dm, high], axis=2).astype("<u4").tobytes()}
    words = []
    if name == "q6_K":
        words.append(_bits_to_words(q >> 4, 2).reshape(rows, nb, 16))
        words.append(fields["sc"].astype(np.int8).reshape(rows, nb, 4, 4).copy().view("<u4").reshape(rows, nb, 4))
        words.append(_f16_bits(fields["d"]).reshape(rows, nb, 1))
    else:
        dm = _f16_bits(fields["d"]) | (_f16_bits(fields["dmin"]) << 16)
        words.append(dm.reshape(rows, nb, 1))
        words.append(np.ascontiguousarray(fields["scales"], np.uint8).view("<u4").reshape(rows, nb, 3))
        if name == "q5_K":
            words.append(_bits_to_words((q >> 4) & 1, 1).reshape(rows, nb, 8))
    return {"qs": qs, "sc": np.concatenate(words, axis=2).astype("<u4").tobytes()}


def _words(parts: dict, part: str, count: int, name: str) -> np.ndarray:
    raw = parts[part]
    if len(raw) < 4 * count:
        raise ValueError(f"{name} part {part!r} holds {len(raw)} bytes, needs {4 * count}")
    return np.frombuffer(raw, dtype="<u4", count=count)


def _halves_f16(words: np.ndarray, high: bool) -> np.ndarray:
    return ((words >> 16) if high else (words & 0xFFFF)).astype("<u2").view("<f2")


def unpack(name: str, shape: tuple[int, int], parts: dict) -> dict[str, np.ndarray]:
    """A quantized tensor's web parts -> its fields: the inverse of pack."""
    t = weight_type(name)
    rows, cols = check_shape(name, shape)
    nb = cols // t.block
    if name == "q8_0":
        if len(parts["qs"]) < rows * cols or len(parts["d"]) < 2 * rows * nb:
            raise ValueError(f"q8_0 parts too short for shape {[rows, cols]}")
        return {"q": np.frombuffer(parts["qs"], np.int8, count=rows * cols).reshape(rows, cols),
                "d": np.frombuffer(parts["d"], "<f2", count=rows * nb).reshape(rows, nb)}
    q = _words_to_bits(_words(parts, "qs", rows * cols // 8, name).reshape(rows, cols // 8), 4)
    if name == "q4_0":
        if len(parts["d"]) < 2 * rows * nb:
            raise ValueError(f"q4_0 part 'd' holds {len(parts['d'])} bytes, needs {2 * rows * nb}")
        return {"q": q, "d": np.frombuffer(parts["d"], "<f2", count=rows * nb).reshape(rows, nb)}
    if name == "q4_1":
        dm = _words(parts, "dm", rows * nb, name).reshape(rows, nb)
        return {"q": q, "d": _halves_f16(dm, False), "m": _halves_f16(dm, True)}
    if name in ("q5_0", "q5_1"):
        dh = _words(parts, "dh", rows * nb * 2, name).reshape(rows, nb, 2)
        f = {"q": q | (_words_to_bits(dh[:, :, 1], 1).reshape(rows, cols) << 4), "d": _halves_f16(dh[:, :, 0], False)}
        if name == "q5_1":
            f["m"] = _halves_f16(dh[:, :, 0], True)
        return f
    sc = _words(parts, "sc", rows * nb * SC_WORDS[name], name).reshape(rows, nb, SC_WORDS[name])
    if name == "q6_K":
        high = _words_to_bits(sc[:, :, :16], 2).reshape(rows, cols)
        return {"q": q | (high << 4), "sc": np.ascontiguousarray(sc[:, :, 16:20]).view(np.int8).reshape(rows, nb, 16),
                "d": _halves_f16(sc[:, :, 20], False)}
    f = {"d": _halves_f16(sc[:, :, 0], False), "dmin": _halves_f16(sc[:, :, 0], True),
         "scales": np.ascontiguousarray(sc[:, :, 1:4]).view(np.uint8).reshape(rows, nb, 12)}
    if name == "q5_K":
        q = q | (_words_to_bits(sc[:, :, 4:12], 1).reshape(rows, cols) << 4)
    f["q"] = q
    return f


# ---- fields -> f32 --------------------------------------------------------------


def k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit sub-block scales and mins (..., 8) u8 of K-quant scale bytes (..., 12) u8."""
    s = scales.reshape(*scales.shape[:-1], 3, 4)
    d, m, md = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def dequantize_fields(name: str, fields: dict[str, np.ndarray]) -> np.ndarray:
    """f32 weights (rows, cols) of a quantized tensor's fields, bit-identical to gguf.quants.dequantize."""
    t = weight_type(name)
    q = fields["q"]
    rows, cols = q.shape
    nb = cols // t.block
    d = fields["d"].astype(np.float32).reshape(rows, nb, 1)
    if name == "q8_0":
        return (q.astype(np.float32).reshape(rows, nb, QK) * d).reshape(rows, cols)
    if t.block == QK:
        offset = {"q4_0": 8, "q5_0": 16}.get(name, 0)
        codes = (q.astype(np.int8) - np.int8(offset)).astype(np.float32).reshape(rows, nb, QK)
        w = d * codes
        if "m" in fields:
            w = w + fields["m"].astype(np.float32).reshape(rows, nb, 1)
        return w.reshape(rows, cols)
    if name == "q6_K":
        scale = (d * fields["sc"].astype(np.float32)).reshape(rows, nb * 16, 1)
        codes = (q.astype(np.int8) - np.int8(32)).astype(np.float32).reshape(rows, nb * 16, 16)
        return (scale * codes).reshape(rows, cols)
    sc, mn = k_scale_min(fields["scales"])
    scale = (d * sc.astype(np.float32)).reshape(rows, nb * 8, 1)
    low = (fields["dmin"].astype(np.float32).reshape(rows, nb, 1) * mn.astype(np.float32)).reshape(rows, nb * 8, 1)
    return (scale * q.astype(np.float32).reshape(rows, nb * 8, QK) - low).reshape(rows, cols)


def dequantize_parts(name: str, shape: tuple[int, ...], parts: dict) -> np.ndarray:
    """f32 array of `shape` from a tensor's web parts (any type)."""
    t = weight_type(name)
    if set(parts) != set(t.parts):
        raise ValueError(f"{name} tensor needs parts {t.parts}, got {sorted(parts)}")
    if not t.quantized:
        count = int(np.prod(shape))
        if len(parts["data"]) < count * t.block_bytes:
            raise ValueError(f"{name} tensor of shape {list(shape)} needs {count * t.block_bytes} bytes, "
                             f"got {len(parts['data'])}")
        if name == "bf16":
            bits = np.frombuffer(parts["data"], "<u2", count=count).astype(np.uint32) << 16
            return bits.view(np.float32).reshape(shape)
        data = np.frombuffer(parts["data"], "<f4" if name == "f32" else "<f2", count=count)
        return data.astype(np.float32).reshape(shape)
    return dequantize_fields(name, unpack(name, tuple(shape), parts))


# Lossless promotions: a tensor of the key type holds exactly the weights of one of the value type (same scales,
# codes shifted or given a zero high bit), and dequantizes bit-identically. Members of one stacked projection
# (q|k|v) of different types meet in their common promotion (llama.cpp's Q4_K_M gives SmolLM2's attn_v q8_0
# beside q5_0 attn_q / attn_k).
PROMOTIONS = {"q4_0": ("q5_0", "q8_0"), "q5_0": ("q8_0",), "q4_1": ("q5_1",), "q4_K": ("q5_K",)}


def common_type(names: set[str]) -> str | None:
    """The one type every type in `names` is or promotes to losslessly (None when there is none)."""
    for target in sorted(names):
        if all(n == target or target in PROMOTIONS.get(n, ()) for n in names):
            return target
    return None


def promote(name: str, target: str, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The fields of type `target` holding exactly the weights of `fields` (type `name`; PROMOTIONS)."""
    if name == target:
        return fields
    if target not in PROMOTIONS.get(name, ()):
        raise ValueError(f"{name} weights cannot be held losslessly as {target}")
    if target == "q8_0":  # d * (q - offset) = d * code
        offset = 8 if name == "q4_0" else 16
        return {"q": (fields["q"].astype(np.int16) - offset).astype(np.int8), "d": fields["d"]}
    if target == "q5_0":  # d * (q - 8) = d * ((q + 8) - 16)
        return {**fields, "q": (fields["q"] + 8).astype(np.uint8)}
    return dict(fields)  # q5_1 / q5_K: the same codes with a zero high bit, the same scales


def part_nbytes(name: str, shape: tuple[int, ...]) -> dict[str, int]:
    """Exact bytes of each web part of a tensor (before the padding of a part to a multiple of 4 bytes); every
    part of a 2-D tensor is row-major, rows of equal size."""
    t = weight_type(name)
    count = int(np.prod(shape))
    if not t.quantized:
        return {"data": count * t.block_bytes}
    rows, cols = check_shape(name, tuple(shape))
    blocks = rows * cols // t.block
    if name == "q8_0":
        return {"qs": count, "d": 2 * blocks}
    second = {"q4_0": 2, "q4_1": 4, "q5_0": 8, "q5_1": 8}.get(name) or 4 * SC_WORDS[name]
    return {"qs": count // 2, t.parts[1]: second * blocks}


# Byte offsets of the f16 scales in one GGUF block of each quantized type (d, and m / dmin where it has one):
# the block's weights are finite exactly when these are, its codes being small integers.
F16_SCALES = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_1": (0, 2), "q5_1": (0, 2), "q4_K": (0, 2),
              "q5_K": (0, 2), "q6_K": (208,)}  # fmt: skip


def nonfinite(name: str, raw: np.ndarray) -> tuple[int, int] | None:
    """None when every weight of GGUF bytes `raw` (type `name`) is finite, else (how many weights, or blocks for
    a quantized type, are NaN or infinite; the flat index of the first such weight, or of its block's first).
    Quantized blocks are judged by their f16 scales' exponent bits alone, without dequantizing."""
    t = weight_type(name)
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)  # (bytes,)
    if t.quantized:
        blocks = b.reshape(-1, t.block_bytes)  # (blocks, block_bytes)
        bad = np.zeros(len(blocks), bool)
        for at in F16_SCALES[name]:
            bad |= (blocks[:, at + 1] & 0x7C) == 0x7C  # the high byte of an f16 holds its 5 exponent bits
    elif name == "bf16":
        bad = (b.view("<u2") & 0x7F80) == 0x7F80
    else:
        bad = ~np.isfinite(b.view("<f4" if name == "f32" else "<f2"))
    count = int(np.count_nonzero(bad))
    if not count:
        return None
    return count, int(np.argmax(bad)) * t.block


def pack_gguf(name: str, raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, bytes]:
    """Web parts of a tensor given as raw GGUF bytes of type `name` (any type, any shape for floats)."""
    t = weight_type(name)
    if not t.quantized:
        data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        if data.size != int(np.prod(shape)) * t.block_bytes:
            raise ValueError(f"{name} tensor of shape {list(shape)} needs {int(np.prod(shape)) * t.block_bytes} "
                             f"bytes, got {data.size}")
        return {"data": _pad4(data.tobytes())}
    return pack(name, from_gguf(name, raw, tuple(shape)))
