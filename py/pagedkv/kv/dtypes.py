"""KV cache element types: the one registry of names, byte sizes and the numpy (de)quantizers.

The WGSL kernels (shaders/kv_write.wgsl quantizes, shaders/paged_kv_read.wgsl dequantizes) store
every dtype in the same token-major layout, which the functions here reproduce bit for bit:

    a cache (K or V) of one layer = (num_blocks, block_size, token_u32s) u32 words, where one token holds
      data:   n_kv_heads rows of head_dim values, `bits` each, packed little end first
              (f32: the bits; f16: two halves per u32; int8 / fp8: 4 bytes per u32; int4 / int4-asym: 8 nibbles
              per u32)
      scales: then n_kv_heads * (head_dim / group) scale words (quantized dtypes only), row-major: an f32
              scale, or (int4-asym) the f16 step in the low half and the f16 minimum in the high half
      pad:    zero u32s up to a multiple of 4, so a token starts on a 16-byte word (the kernels' vec4<u32>).

Quantizers (numpy here, WGSL in kv_write.wgsl):
    int8 / int4 (symmetric):  d = amax(group) * f32(1 / qmax);  q = clamp(nearest(x / d), -qmax, qmax);  x' = q * d
    fp8-e4m3 (OCP, no inf):   d = amax(row) * f32(1 / 448);     q = the e4m3 value nearest to x / d (subnormals
                              included), codes built with bit operations;                  x' = e4m3(q) * d
    int4-asym (llama.cpp q4_1-like, min / max):  x clamped to +-65504 (the f16 range), m = min(group) rounded
                              down and d = (max(group) - m) * f32(1 / 15) rounded up, both onto the normal f16
                              numbers (or m = 0 when |min| < 2^-14, d >= 2^-14), by bit operations rather
                              than a conversion whose rounding WGSL leaves open;
                              q = clamp(nearest((x - m) / d), 0, 15);                       x' = q * d + m
                              (q * d is exact, so a fused multiply-add gives the same x').
The scale is a product (correctly rounded in f32 on both sides; a division is not: WGSL allows 2.5 ULP and
SwiftShader's amax / 127 differed from numpy's in the last bit). `nearest` is the one to the EXACT quotient
x / d with ties to even (WGSL round(), numpy rint): numpy decides it in float64, where an f32 / f32 quotient
never lands on a rounding midpoint unless it is one; the shader divides in f32 and decides quotients within
1e-4 of a midpoint exactly with Dekker's two-product (kv_write.wgsl), for scales above ~1e-30 (where the
product's error term is not a flushed denormal) and compilers that do not fuse a * b + c. A scale below the smallest normal f32 (a row of zeros or of denormals) is stored as 0 and its
codes as 0: GPUs may flush denormals, so neither side ever computes with one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLT_MIN = np.float32(1.1754944e-38)  # smallest normal f32
E4M3_MAX = np.float32(448.0)


@dataclass(frozen=True)
class KVDtype:
    """One KV cache element type.

    bits: bits per stored value; group: channels sharing one f32 scale (0: no scale; capped at head_dim);
    code: the KV_FORMAT pipeline constant of the WGSL kernels; asymmetric: unsigned codes 0..qmax with an f16
    step and minimum per group (int4-asym) instead of signed codes -qmax..qmax and an f32 scale.
    """

    name: str
    bits: int
    group: int
    code: int
    qmax: int = 0  # largest integer code (int formats)
    asymmetric: bool = False

    @property
    def quantized(self) -> bool:
        return self.group > 0

    def group_for(self, head_dim: int) -> int:
        """Channels per scale for rows of `head_dim` values (a per-head scale when head_dim is smaller)."""
        check_head_dim(head_dim)
        return min(self.group, head_dim) if self.quantized else 0

    def scales_per_row(self, head_dim: int) -> int:
        return head_dim // self.group_for(head_dim) if self.quantized else 0

    def row_u32s(self, head_dim: int) -> int:
        """Data u32s of one (token, kv head) row."""
        check_head_dim(head_dim)
        return head_dim * self.bits // 32

    def token_u32s(self, n_kv_heads: int, head_dim: int) -> int:
        """u32s of one token of one cache (K or V) of one layer: data, scales, padding to 4."""
        used = n_kv_heads * (self.row_u32s(head_dim) + self.scales_per_row(head_dim))
        return -(-used // 4) * 4

    def bytes_per_token_per_head(self, head_dim: int) -> float:
        """Data and scale bytes of one (token, kv head) row of K or V, before the per-token padding."""
        return (self.row_u32s(head_dim) + self.scales_per_row(head_dim)) * 4.0

    def token_bytes(self, n_kv_heads: int, head_dim: int) -> int:
        """Bytes of one token in one cache (K or V) of one layer, padding included: what the GPU allocates."""
        return self.token_u32s(n_kv_heads, head_dim) * 4

    def bytes_per_token(self, n_layers: int, n_kv_heads: int, head_dim: int) -> int:
        """Bytes of one token in the whole KV cache of a model: K and V of every layer, padding included."""
        return 2 * n_layers * self.token_bytes(n_kv_heads, head_dim)


KV_DTYPES: dict[str, KVDtype] = {
    d.name: d for d in (
        KVDtype("f32", 32, 0, 0),
        KVDtype("f16", 16, 0, 1),
        # One scale per 32 channels, not per head: on SmolLM2's real K/V (bench/kv_quality_dtypes.py,
        # row_error_real_kv, first 512 corpus tokens, all layers) a per-head scale gave 1.35x the K error
        # (relative RMS 0.0110 vs 0.0082; V 0.0067 vs 0.0058): RoPE'd keys carry outlier channels that
        # stretch a shared scale. The price is one more f32 per row: 224 vs 208 B per token and layer.
        KVDtype("int8", 8, 32, 2, qmax=127),
        KVDtype("fp8-e4m3", 8, 1 << 30, 3),  # one scale per token per kv head (group = head_dim)
        KVDtype("int4", 4, 32, 4, qmax=7),  # llama.cpp q4_0-like: per token, per 32 channels
        # Same bytes as int4, 16 levels over [min, max] instead of 15 over [-amax, amax]: a group holding an
        # outlier channel on one side keeps half the step. On SmolLM2's real keys (first corpus window, all
        # layers) the relative error of q.k scores fell from 0.158 (int4) to 0.101; per-channel power-of-two
        # key smoothing on top of int4 reached 0.146 at best and changed nothing on top of this (0.102);
        # bench/studies/kv_key_smoothing.py has the figures. Perplexity on the 20,480-token corpus: +1.44 vs f32
        # (int4: +4.46), greedy agreement 0.839 (int4: 0.748); bench/results/kv_quality_int4_asym.json.
        KVDtype("int4-asym", 4, 32, 5, qmax=15, asymmetric=True),
    )
}
DEFAULT_KV_DTYPE = "f16"


def check_head_dim(head_dim: int) -> None:
    if not isinstance(head_dim, int) or head_dim < 16 or head_dim % 16:
        raise ValueError(f"head_dim must be a positive multiple of 16, got {head_dim!r}")


def kv_dtype(name: str) -> KVDtype:
    """The registry entry of `name`; ValueError naming the valid dtypes otherwise."""
    if not isinstance(name, str) or name not in KV_DTYPES:
        raise ValueError(f"unknown KV cache dtype {name!r}; valid dtypes are {', '.join(KV_DTYPES)}")
    return KV_DTYPES[name]


# ---------------------------------------------------------------- quantizers on rows (..., head_dim)

def _grouped(x: np.ndarray, group: int) -> np.ndarray:
    return x.reshape(x.shape[:-1] + (x.shape[-1] // group, group))  # (..., n_groups, group)


def _scales(x: np.ndarray, group: int, top: np.float32) -> np.ndarray:
    amax = np.abs(_grouped(x, group)).max(axis=-1)  # (..., n_groups)
    d = (amax * np.float32(1.0 / float(top))).astype(np.float32)
    return np.where(d < FLT_MIN, np.float32(0), d).astype(np.float32)


F16_MAX = np.float32(65504.0)
F16_MIN_NORMAL = np.float32(2.0 ** -14)
_LOW13 = np.uint32(0x1FFF)  # the f32 mantissa bits an f16 does not have


def _round_away_to_f16(bits: np.ndarray) -> np.ndarray:
    """f32 bits -> the f32 whose 13 mantissa bits an f16 lacks are rounded away from zero (kv_write.wgsl's
    round_away_to_f16)."""
    return np.where(bits & _LOW13, (bits & ~_LOW13) + np.uint32(0x2000), bits).astype(np.uint32).view(np.float32)


def _f16_floor(lo: np.ndarray) -> np.ndarray:
    """f32 values in [-65504, 65504] -> the largest of {0, normal f16} below them, 0 for |lo| < 2^-14 (a GPU
    may flush a denormal lo to -0, so the cut is a comparison that flushing cannot change)."""
    bits = lo.astype(np.float32).view(np.uint32)
    toward_zero = (bits & ~_LOW13).view(np.float32)
    out = np.where(lo >= F16_MIN_NORMAL, toward_zero,
                   np.where(lo > -F16_MIN_NORMAL, np.float32(0), _round_away_to_f16(bits)))
    return out.astype(np.float32)


def _f16_ceil(d: np.ndarray) -> np.ndarray:
    """Non-negative f32 -> the smallest normal f16 at or above it (at least 2^-14)."""
    bits = d.astype(np.float32).view(np.uint32)
    return np.where(d < F16_MIN_NORMAL, F16_MIN_NORMAL, _round_away_to_f16(bits)).astype(np.float32)


def _quantize_asymmetric(x: np.ndarray, dt: KVDtype) -> tuple[np.ndarray, np.ndarray]:
    """int4-asym: rows x (..., head_dim) f32 -> (codes 0..qmax (..., head_dim) int32, (..., n_groups, 2) f32 [d, m])."""
    group = dt.group_for(x.shape[-1])
    g = _grouped(np.clip(x, -F16_MAX, F16_MAX).astype(np.float32), group)  # (..., n_groups, group)
    m = _f16_floor(g.min(axis=-1))  # (..., n_groups)
    d = _f16_ceil(((g.max(axis=-1) - m).astype(np.float32) * np.float32(1.0 / dt.qmax)).astype(np.float32))
    y = (g - m[..., None]).astype(np.float32).astype(np.float64) / d[..., None]  # exact quotient's nearest f64
    codes = np.clip(np.rint(y), 0, dt.qmax).astype(np.int32).reshape(x.shape)
    return codes, np.stack([d, m], axis=-1)


def _scale_words(scales: np.ndarray, dt: KVDtype) -> np.ndarray:
    """Scales as quantize returns them -> (..., n_groups) u32 words: f32 bits, or f16 d | f16 m << 16."""
    if dt.asymmetric:  # both on the f16 grid already: the conversion is exact
        halves = scales.astype(np.float16).view(np.uint16).astype(np.uint32)  # (..., n_groups, 2)
        return halves[..., 0] | (halves[..., 1] << np.uint32(16))
    return np.ascontiguousarray(scales, dtype=np.float32).view(np.uint32)


def _scales_of_words(words: np.ndarray, dt: KVDtype) -> np.ndarray:
    """Inverse of _scale_words."""
    words = np.ascontiguousarray(words, dtype=np.uint32)
    if dt.asymmetric:
        return words.view(np.float16).astype(np.float32).reshape(words.shape + (2,))
    return words.view(np.float32)


def _encode_e4m3(y: np.ndarray) -> np.ndarray:
    """|y| (float64) -> e4m3 magnitude codes 0..0x7E, nearest with ties to even; sign handled by the caller."""
    a = np.abs(y).astype(np.float64)
    sub = np.rint(a * 512.0).astype(np.uint32)  # below 2^-6: multiples of 2^-9, exact scaling
    bits = a.view(np.uint64)
    r = bits + np.uint64((1 << 48) - 1) + ((bits >> np.uint64(49)) & np.uint64(1))  # 52 -> 3 mantissa bits
    normal = (((r >> np.uint64(52)).astype(np.int64) - 1016) << 3) | ((r >> np.uint64(49)) & np.uint64(7)).astype(np.int64)
    normal = np.minimum(np.where(a >= 2.0 ** -6, normal, 0), 0x7E).astype(np.uint32)
    return np.where(a < 2.0 ** -6, sub, normal).astype(np.uint32)


def _decode_e4m3(code: np.ndarray) -> np.ndarray:
    """e4m3 codes (with sign bit 0x80) -> f32."""
    code = code.astype(np.uint32)
    e, m = (code >> 3) & 15, code & 7
    normal = (((e + 120) << 23) | (m << 20)).astype(np.uint32).view(np.float32)
    mag = np.where(e == 0, m.astype(np.float32) * np.float32(1.0 / 512.0), normal).astype(np.float32)
    return np.where(code & 0x80, -mag, mag).astype(np.float32)


def quantize(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows x (..., head_dim) f32 -> (codes (..., head_dim) int32, scales (..., n_groups) f32).

    Codes are the signed integers (int8 / int4), the unsigned ones 0..15 (int4-asym, whose scales are
    (..., n_groups, 2) f32: step d and minimum m) or the e4m3 bytes 0..255 (fp8); f32 / f16 have no codes.
    """
    dt = kv_dtype(dtype)
    if not dt.quantized:
        raise ValueError(f"{dtype} is stored as is, not quantized")
    return quantize_with(x, dt)


def quantize_with(x: np.ndarray, dt: KVDtype) -> tuple[np.ndarray, np.ndarray]:
    """quantize() for any quantized KVDtype, registered or not (benchmarks compare group sizes with it)."""
    x = np.asarray(x, dtype=np.float32)
    if dt.asymmetric:
        return _quantize_asymmetric(x, dt)
    group = dt.group_for(x.shape[-1])
    top = np.float32(dt.qmax) if dt.qmax else E4M3_MAX
    d = _scales(x, group, top)  # (..., n_groups)
    safe = np.where(d > 0, d, np.float32(1))[..., None].astype(np.float64)  # (..., n_groups, 1)
    y = _grouped(x, group).astype(np.float64) / safe  # (..., n_groups, group) the exact quotient's nearest f64
    y = np.where(d[..., None] > 0, y, 0.0).reshape(x.shape)
    if dt.qmax:
        return np.clip(np.rint(y), -dt.qmax, dt.qmax).astype(np.int32), d
    negative = (x < 0) & np.repeat(d > 0, group, axis=-1)  # a zero scale stores all-zero codes
    return (_encode_e4m3(y) | np.where(negative, 0x80, 0).astype(np.uint32)).astype(np.int32), d


def dequantize(codes: np.ndarray, scales: np.ndarray, dtype: str) -> np.ndarray:
    """Inverse of quantize: (..., head_dim) f32, value = decoded code * its group's scale (one f32 multiply)."""
    return dequantize_with(codes, scales, kv_dtype(dtype))


def dequantize_with(codes: np.ndarray, scales: np.ndarray, dt: KVDtype) -> np.ndarray:
    """dequantize() for any quantized KVDtype."""
    group = dt.group_for(codes.shape[-1])
    if dt.asymmetric:
        d, m = scales[..., 0, None], scales[..., 1, None]  # (..., n_groups, 1) each
        return ((_grouped(codes.astype(np.float32), group) * d).astype(np.float32) + m).astype(np.float32).reshape(
            codes.shape)
    vals = codes.astype(np.float32) if dt.qmax else _decode_e4m3(codes)
    return (_grouped(vals, group) * scales[..., None]).astype(np.float32).reshape(codes.shape)


def round_trip(x: np.ndarray, dtype: str) -> np.ndarray:
    """What the cache returns for rows x (..., head_dim): x itself (f32), f16-rounded, or quantized."""
    dt = kv_dtype(dtype)
    x = np.asarray(x, dtype=np.float32)
    if dt.name == "f32":
        return x
    if dt.name == "f16":
        return x.astype(np.float16).astype(np.float32)
    return dequantize(*quantize(x, dtype), dtype)


# ---------------------------------------------------------------- the GPU word layout

def pack_tokens(x: np.ndarray, dtype: str) -> np.ndarray:
    """Tokens x (num_tokens, n_kv_heads, head_dim) f32 -> (num_tokens, token_u32s) u32, as kv_write stores them."""
    dt = kv_dtype(dtype)
    x = np.asarray(x, dtype=np.float32)
    t, n_kv, hd = x.shape
    out = np.zeros((t, dt.token_u32s(n_kv, hd)), np.uint32)  # (num_tokens, token_u32s)
    data_u32 = n_kv * dt.row_u32s(hd)
    if dt.name == "f32":
        out[:, :data_u32] = x.reshape(t, -1).view(np.uint32)
        return out
    if dt.name == "f16":
        out[:, :data_u32] = x.astype(np.float16).reshape(t, -1).view(np.uint32)  # little end first
        return out
    codes, scales = quantize(x, dtype)  # (t, n_kv, hd), (t, n_kv, n_groups)
    per = 32 // dt.bits
    fields = (codes.reshape(t, data_u32, per).astype(np.uint32) & ((1 << dt.bits) - 1))  # (t, data_u32, per)
    shifts = (np.arange(per, dtype=np.uint32) * dt.bits)  # (per,)
    out[:, :data_u32] = np.bitwise_or.reduce(fields << shifts, axis=-1)
    words = _scale_words(scales, dt)  # (t, n_kv, n_groups)
    out[:, data_u32:data_u32 + words[0].size] = words.reshape(t, -1)
    return out


def unpack_tokens(words: np.ndarray, dtype: str, n_kv_heads: int, head_dim: int) -> np.ndarray:
    """(..., token_u32s) u32 -> (..., n_kv_heads, head_dim) f32: the values the attention kernels read."""
    dt = kv_dtype(dtype)
    words = np.asarray(words, dtype=np.uint32)
    if words.shape[-1] != dt.token_u32s(n_kv_heads, head_dim):
        raise ValueError(f"{dtype} tokens of {n_kv_heads} x {head_dim} need {dt.token_u32s(n_kv_heads, head_dim)} "
                         f"u32s, got {words.shape[-1]}")
    lead = words.shape[:-1]
    data_u32 = n_kv_heads * dt.row_u32s(head_dim)
    data = np.ascontiguousarray(words[..., :data_u32])
    shape = lead + (n_kv_heads, head_dim)
    if dt.name == "f32":
        return data.view(np.float32).reshape(shape).copy()
    if dt.name == "f16":
        return data.view(np.float16).astype(np.float32).reshape(shape)
    per = 32 // dt.bits
    shifts = (np.arange(per, dtype=np.uint32) * dt.bits)  # (per,)
    fields = ((data[..., None] >> shifts) & ((1 << dt.bits) - 1)).astype(np.int32)  # (..., data_u32, per)
    if dt.qmax and not dt.asymmetric:  # two's complement fields
        fields = np.where(fields >= 1 << (dt.bits - 1), fields - (1 << dt.bits), fields)
    n_groups = dt.scales_per_row(head_dim)
    scales = _scales_of_words(words[..., data_u32:data_u32 + n_kv_heads * n_groups].reshape(
        lead + (n_kv_heads, n_groups)), dt)
    return dequantize(fields.reshape(shape), scales, dtype)


@dataclass(frozen=True)
class PackedKV:
    """One cache (K or V) of one layer as the GPU holds it: words (num_blocks, block_size, token_u32s) u32."""

    words: np.ndarray
    dtype: str
    n_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        dt = kv_dtype(self.dtype)
        want = dt.token_u32s(self.n_kv_heads, self.head_dim)
        if self.words.dtype != np.uint32 or self.words.ndim != 3 or self.words.shape[2] != want:
            raise ValueError(f"{self.dtype} cache words must be (num_blocks, block_size, {want}) uint32, "
                             f"got {self.words.shape} {self.words.dtype}")

    @classmethod
    def pack(cls, values: np.ndarray, dtype: str) -> "PackedKV":
        """Quantize a whole cache (num_blocks, block_size, n_kv_heads, head_dim) f32."""
        nb, bs, n_kv, hd = values.shape
        return cls(pack_tokens(values.reshape(nb * bs, n_kv, hd), dtype).reshape(nb, bs, -1), dtype, n_kv, hd)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The logical (num_blocks, block_size, n_kv_heads, head_dim)."""
        return self.words.shape[:2] + (self.n_kv_heads, self.head_dim)

    def values(self) -> np.ndarray:
        """(num_blocks, block_size, n_kv_heads, head_dim) f32: what the attention kernels read."""
        return unpack_tokens(self.words, self.dtype, self.n_kv_heads, self.head_dim)

    def with_rows(self, rows: np.ndarray, slots: np.ndarray) -> "PackedKV":
        """A copy with rows (num_tokens, n_kv_heads, head_dim) f32 quantized into slots (num_tokens,)."""
        flat = self.words.reshape(-1, self.words.shape[2]).copy()  # (num_slots, token_u32s)
        flat[slots] = pack_tokens(rows, self.dtype)
        return PackedKV(flat.reshape(self.words.shape), self.dtype, self.n_kv_heads, self.head_dim)
