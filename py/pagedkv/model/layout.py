"""Byte layout of the web weight format: how each dtype is packed, packing and dequantization.

GGUF stores Q4_1 as 20-byte blocks and Q8_0 as 34-byte blocks, so a row of
blocks is not u32-aligned and a WGSL kernel would need byte-level loads. The
converter therefore REPACKS each quantized matrix losslessly (the same 4-bit /
8-bit codes and the same f16 scales) into separate, u32-aligned parts:

  q4_1  part "qs": u32 words, (rows, cols/8); weight k of row r is the nibble
                   (word[r, k // 8] >> (4 * (k % 8))) & 0xF
        part "dm": u32 words, (rows, cols/32); low 16 bits = f16 scale d,
                   high 16 bits = f16 min m of block k // 32 (unpack2x16float)
                   w = d * q + m
  q8_0  part "qs": int8, (rows, cols); 4 consecutive codes per little-endian u32
        part "d":  f16, (rows, cols/32) flat, zero-padded to a multiple of 4 bytes
                   w = d * q
  q4_0  part "qs": as q4_1;  part "d": f16 (rows, cols/32) flat, zero-padded        w = d * (q - 8)
  q5_0  part "qs": the low 4 bits of every code, as q4_1
        part "dh": u32 (rows, cols/32, 2): [f16 d, bit j = bit 4 of weight j]    w = d * (q - 16)
  q5_1  part "qs": as q5_0;  part "dh": u32 (rows, cols/32, 2): [d | m << 16, high bits]  w = d * q + m
  q4_K  part "qs": as q4_1 (4-bit codes)
        part "sc": u32 (rows, cols/256, 4): GGUF's first 16 bytes of the super-block verbatim: f16 d,
                   f16 dmin, 12 bytes of packed 6-bit scales sc_j and mins m_j of its 8 sub-blocks of 32
                   w = (d * sc_j) * q - dmin * m_j
  q5_K  part "qs": the low 4 bits, as q4_1
        part "sc": u32 (rows, cols/256, 12): the 4 words of q4_K, then 8 words: bit l of word j = bit 4 of
                   weight 32 j + l                           w = (d * sc_j) * q - dmin * m_j
  q6_K  part "qs": the low 4 bits, as q4_1
        part "sc": u32 (rows, cols/256, 21): 16 words of the high 2 bits (weight k at bits 2 (k % 16) of
                   word k / 16), 4 words = the 16 int8 scales s_g of the groups of 16, one word = f16 d
                   w = (d * s_g) * (q - 32)
  f32   part "data": little-endian f32, row-major
  f16   part "data": little-endian f16, row-major, zero-padded to a multiple of 4 bytes
  bf16  part "data": little-endian bf16 (the high half of an f32), row-major, zero-padded likewise

Matrices are [out_features, in_features] (row r = one output), so y = W @ x.
This module runs under Pyodide (numpy only) and is the single definition of
the layout: the converter, the tiny-model writer and the loader all use it. The per-type code for
every type (GGUF blocks <-> parts, dequantization bit-identical to gguf's) lives in quants.py.
"""

from __future__ import annotations

import numpy as np

from .quants import WEIGHT_TYPES, dequantize_parts

QK = 32  # weights per quantization block (Q4_1 and Q8_0)
PART_ALIGN = 256  # byte alignment of every part inside a shard (WebGPU minStorageBufferOffsetAlignment)
GGUF_Q4_1_BLOCK_BYTES = 20
GGUF_Q8_0_BLOCK_BYTES = 34

DTYPE_PARTS = {name: t.parts for name, t in WEIGHT_TYPES.items()}

LAYOUT_DOC = {
    "alignment": f"every part starts at a multiple of {PART_ALIGN} bytes inside its shard; all integers little-endian",
    "matrix_orientation": "shape is [rows, cols] row-major; weight matrices are [out_features, in_features], y = W @ x",
    "q4_1": {
        "source": "GGUF Q4_1: blocks of 32 weights = f16 d, f16 m, 16 bytes of nibbles (20 bytes/block), "
        "byte j holds weight j (low nibble) and weight j+16 (high nibble); repacked losslessly as below",
        "qs": "u32 [rows, cols/8]; weight k of row r = (qs[r, k/8] >> (4*(k%8))) & 0xF",
        "dm": "u32 [rows, cols/32]; bits 0-15 = f16 d, bits 16-31 = f16 m of block k/32",
        "dequant": "w = d * q + m (computed in f32)",
    },
    "q8_0": {
        "source": "GGUF Q8_0: blocks of 32 weights = f16 d + 32 int8 (34 bytes/block); repacked losslessly as below",
        "qs": "i8 [rows, cols]; 4 consecutive codes per u32",
        "d": "f16 [rows, cols/32] flat, zero-padded to a multiple of 4 bytes",
        "dequant": "w = d * q (computed in f32)",
    },
    "q4_0": {"source": "GGUF Q4_0 (18 bytes/32 weights)", "qs": "as q4_1", "d": "as q8_0",
             "dequant": "w = d * (q - 8)"},
    "q5_0": {"source": "GGUF Q5_0 (22 bytes/32 weights)", "qs": "as q4_1: the low 4 bits of each code",
             "dh": "u32 [rows, cols/32, 2]: f16 d (bits 0-15), then the block's 32 high bits (bit j = weight j)",
             "dequant": "w = d * (q - 16)"},
    "q5_1": {"source": "GGUF Q5_1 (24 bytes/32 weights)", "qs": "as q5_0",
             "dh": "u32 [rows, cols/32, 2]: f16 d | f16 m << 16, then the 32 high bits", "dequant": "w = d * q + m"},
    "q4_K": {"source": "GGUF Q4_K (144 bytes/256 weights)", "qs": "as q4_1",
             "sc": "u32 [rows, cols/256, 4]: the super-block's f16 d, f16 dmin and 12 bytes of 6-bit scales/mins, "
                   "verbatim", "dequant": "w = (d * sc_j) * q - dmin * m_j, j = sub-block of 32"},
    "q5_K": {"source": "GGUF Q5_K (176 bytes/256 weights)", "qs": "as q5_0",
             "sc": "u32 [rows, cols/256, 12]: q4_K's 4 words, then word j's bit l = bit 4 of weight 32j+l",
             "dequant": "as q4_K"},
    "q6_K": {"source": "GGUF Q6_K (210 bytes/256 weights)", "qs": "as q5_0",
             "sc": "u32 [rows, cols/256, 21]: 16 words of high 2-bit pairs (weight k at bits 2*(k%16) of word "
                   "k/16), 4 words of 16 int8 scales (one per 16 weights), f16 d",
             "dequant": "w = (d * s_g) * (q - 32)"},
    "f32": {"data": "f32 row-major"},
    "f16": {"data": "f16 row-major, zero-padded to a multiple of 4 bytes"},
    "bf16": {"data": "bf16 row-major, zero-padded to a multiple of 4 bytes"},
}


def _check_blocks(shape: tuple[int, ...], dtype: str) -> tuple[int, int]:
    if len(shape) != 2 or shape[1] % QK != 0:
        raise ValueError(f"{dtype} tensor must be 2-D with cols a multiple of {QK}, got shape {list(shape)}")
    return shape[0], shape[1]


def _pad4(raw: bytes) -> bytes:
    return raw + b"\0" * (-len(raw) % 4)


# ---- GGUF blocks -> codes -------------------------------------------------


def q4_1_codes_from_gguf(blocks: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split GGUF Q4_1 bytes (rows, nb * 20) into codes (rows, cols) u8, d and m (rows, nb) f16."""
    rows, cols = _check_blocks(shape, "q4_1")
    nb = cols // QK
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(rows, nb, GGUF_Q4_1_BLOCK_BYTES)
    d = b[:, :, 0:2].copy().view(np.float16).reshape(rows, nb)
    m = b[:, :, 2:4].copy().view(np.float16).reshape(rows, nb)
    qs = b[:, :, 4:]  # (rows, nb, 16)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(rows, cols)  # (rows, cols)
    return codes, d, m


def q8_0_codes_from_gguf(blocks: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Split GGUF Q8_0 bytes (rows, nb * 34) into codes (rows, cols) i8 and d (rows, nb) f16."""
    rows, cols = _check_blocks(shape, "q8_0")
    nb = cols // QK
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(rows, nb, GGUF_Q8_0_BLOCK_BYTES)
    d = b[:, :, 0:2].copy().view(np.float16).reshape(rows, nb)
    codes = b[:, :, 2:].copy().view(np.int8).reshape(rows, cols)
    return codes, d


# ---- quantization (tiny random model) --------------------------------------


def quantize_q4_1(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest Q4_1 of a (rows, cols) f32 matrix -> codes u8, d f16, m f16."""
    rows, cols = _check_blocks(w.shape, "q4_1")
    blocks = w.astype(np.float32).reshape(rows, cols // QK, QK)
    lo = blocks.min(axis=2)
    hi = blocks.max(axis=2)
    d = ((hi - lo) / 15.0).astype(np.float16)
    m = lo.astype(np.float16)
    d32 = d.astype(np.float32)[:, :, None]
    inv = np.divide(1.0, d32, out=np.zeros_like(d32), where=d32 != 0)
    codes = np.clip(np.rint((blocks - m.astype(np.float32)[:, :, None]) * inv), 0, 15).astype(np.uint8)
    return codes.reshape(rows, cols), d, m


def quantize_q8_0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest Q8_0 of a (rows, cols) f32 matrix -> codes i8, d f16."""
    rows, cols = _check_blocks(w.shape, "q8_0")
    blocks = w.astype(np.float32).reshape(rows, cols // QK, QK)
    d = (np.abs(blocks).max(axis=2) / 127.0).astype(np.float16)
    d32 = d.astype(np.float32)[:, :, None]
    inv = np.divide(1.0, d32, out=np.zeros_like(d32), where=d32 != 0)
    codes = np.clip(np.rint(blocks * inv), -127, 127).astype(np.int8)
    return codes.reshape(rows, cols), d


# ---- codes -> parts (bytes) ------------------------------------------------


def pack_q4_1(codes: np.ndarray, d: np.ndarray, m: np.ndarray) -> dict[str, bytes]:
    """Pack Q4_1 codes (rows, cols) and f16 d/m (rows, cols/32) into the "qs" and "dm" parts."""
    rows, cols = codes.shape
    nib = codes.astype(np.uint32).reshape(rows, cols // 8, 8)
    shifts = (np.arange(8, dtype=np.uint32) * 4)[None, None, :]
    qs = np.bitwise_or.reduce(nib << shifts, axis=2).astype("<u4")  # (rows, cols/8)
    dm = d.astype("<f2").view("<u2").astype("<u4") | (m.astype("<f2").view("<u2").astype("<u4") << 16)
    return {"qs": qs.tobytes(), "dm": dm.astype("<u4").tobytes()}


def pack_q8_0(codes: np.ndarray, d: np.ndarray) -> dict[str, bytes]:
    """Pack Q8_0 codes (rows, cols) i8 and d (rows, cols/32) f16 into the "qs" and "d" parts."""
    return {"qs": codes.astype(np.int8).tobytes(), "d": _pad4(d.astype("<f2").tobytes())}


def pack_float(w: np.ndarray, dtype: str) -> dict[str, bytes]:
    """Pack an f32 or f16 array into its single "data" part."""
    np_dtype = {"f32": "<f4", "f16": "<f2"}[dtype]
    return {"data": _pad4(np.ascontiguousarray(w, dtype=np_dtype).tobytes())}


# ---- parts -> f32 ----------------------------------------------------------


def dequantize(dtype: str, shape: tuple[int, ...], parts: dict[str, bytes | memoryview]) -> np.ndarray:
    """Dequantize one tensor from its parts to an f32 array of `shape` (bit-identical to gguf's)."""
    return dequantize_parts(dtype, tuple(shape), parts)
