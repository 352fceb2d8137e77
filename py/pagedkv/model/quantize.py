"""f32 matrices -> raw GGUF blocks of every weight type, and llama.cpp's Q4_K_M per-tensor type choice.

Test files nobody wrote by hand start here: a pinned input (a real model's dequantized weights, or seeded
random ones) quantized to any type, then packed by quants.py like a GGUF file from elsewhere. The legacy
types and the floats use `gguf.quants.quantize` (llama.cpp's reference quantizers ported by llama.cpp
itself; imported lazily, CPython only); the K-quants are a numpy port of llama.cpp's reference layout with
a simpler scale search (min-max per sub-block, no iterative refinement): valid blocks that gguf
dequantizes, a little less accurate than llama.cpp's own.
"""

from __future__ import annotations

import numpy as np

from .quants import QK_K, WEIGHT_TYPES, check_shape, to_gguf, weight_type

K_QUANTS = ("q4_K", "q5_K", "q6_K")


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def pack_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """The 12 bytes (..., 12) u8 holding 8 six-bit scales ls and mins lm (..., 8): the inverse of quants.k_scale_min."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    out = np.zeros((*ls.shape[:-1], 12), np.uint8)
    out[..., 0:4] = (ls[..., :4] & 0x3F) | ((ls[..., 4:] >> 4) << 6)
    out[..., 4:8] = (lm[..., :4] & 0x3F) | ((lm[..., 4:] >> 4) << 6)
    out[..., 8:12] = (ls[..., 4:] & 0x0F) | ((lm[..., 4:] & 0x0F) << 4)
    return out


def _six_bit(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(super-block f16 step, 6-bit multiples (..., 8)) approximating non-negative values (..., 8)."""
    top = values.max(axis=-1, keepdims=True)
    inv = np.divide(63.0, top, out=np.zeros_like(top), where=top > 0)
    levels = np.clip(np.rint(values * inv), 0, 63)
    return _f16(top[..., 0] / 63.0), levels


def _quantize_qk(x: np.ndarray, name: str) -> dict[str, np.ndarray]:
    """Q4_K / Q5_K fields of (rows, cols): per sub-block of 32, w ~ (d * sc) * q - dmin * m."""
    rows, cols = x.shape
    nmax = 15 if name == "q4_K" else 31
    sub = x.reshape(rows, cols // QK_K, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0.0)  # (rows, ns, 8): llama.cpp keeps the min <= 0
    step = (sub.max(axis=-1) - lo) / nmax
    d, ls = _six_bit(step)
    dmin, lm = _six_bit(-lo)
    scale = (d.astype(np.float32)[..., None] * ls)[..., None]  # (rows, ns, 8, 1)
    offset = (dmin.astype(np.float32)[..., None] * lm)[..., None]
    q = np.rint(np.divide(sub + offset, scale, out=np.zeros_like(sub), where=scale > 0))
    return {"q": np.clip(q, 0, nmax).astype(np.uint8).reshape(rows, cols), "d": d, "dmin": dmin,
            "scales": pack_k_scales(ls, lm)}


def _quantize_q6_k(x: np.ndarray) -> dict[str, np.ndarray]:
    """Q6_K fields of (rows, cols): per group of 16, w ~ (d * s) * (q - 32), s int8, d per super-block."""
    rows, cols = x.shape
    g = x.reshape(rows, cols // QK_K, 16, 16)
    pick = np.take_along_axis(g, np.abs(g).argmax(axis=-1)[..., None], axis=-1)[..., 0]  # signed max-abs value
    group_scale = pick / -32.0  # (rows, ns, 16): the max-abs weight lands on code -32
    top = np.take_along_axis(group_scale, np.abs(group_scale).argmax(axis=-1)[..., None], axis=-1)  # (rows, ns, 1)
    inv = np.divide(-128.0, top, out=np.zeros_like(top), where=top != 0)
    sc = np.clip(np.rint(inv * group_scale), -128, 127).astype(np.int8)
    d = _f16(np.divide(1.0, inv, out=np.zeros_like(inv), where=inv != 0)[..., 0])
    step = (d.astype(np.float32)[..., None] * sc)[..., None]  # (rows, ns, 16, 1)
    q = np.rint(np.divide(g, step, out=np.zeros_like(g), where=step != 0))
    return {"q": (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(rows, cols), "sc": sc, "d": d}


def quantize(w: np.ndarray, name: str) -> np.ndarray:
    """Raw GGUF bytes (rows, row_bytes) u8 of a 2-D f32 matrix quantized to weight type `name`
    (1-D float tensors too: (1, bytes))."""
    t = weight_type(name)
    w = np.asarray(w, dtype=np.float32)
    if not np.isfinite(w).all():
        raise ValueError(f"cannot quantize to {name}: the input has {int((~np.isfinite(w)).sum())} non-finite values")
    if name in K_QUANTS:
        check_shape(name, w.shape)
        fields = _quantize_q6_k(w) if name == "q6_K" else _quantize_qk(w, name)
        return to_gguf(name, fields)
    import gguf  # lazily: CPython only

    if t.quantized:
        check_shape(name, w.shape)
    out = gguf.quants.quantize(w, gguf.GGMLQuantizationType[t.gguf])
    return np.ascontiguousarray(out).view(np.uint8).reshape(w.shape[0] if w.ndim == 2 else 1, -1)


# byte offsets of the f16 scales inside each type's GGUF block
F16_OFFSETS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q4_K": (0, 2),
               "q5_K": (0, 2), "q6_K": (208,)}


def random_gguf(name: str, rows: int, cols: int, seed: int, scale: float = 0.05) -> np.ndarray:
    """Random GGUF bytes (rows, row_bytes) of a quantized type: every byte random (all code values, all 6-bit
    scales), then the f16 scales drawn from N(0, scale^2), finite and normal (GPUs may flush f16 subnormals to
    zero). Pure numpy (runs in Pyodide)."""
    t = weight_type(name)
    check_shape(name, (rows, cols))
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * cols // t.block, t.block_bytes), dtype=np.uint8)
    for at in F16_OFFSETS[name]:
        v = rng.standard_normal((raw.shape[0], 1)) * scale
        v = np.where(np.abs(v) < 2.0**-14, np.copysign(2.0**-14, v), v)  # the smallest normal f16
        raw[:, at : at + 2] = v.astype("<f2").view(np.uint8)
    return raw.reshape(rows, -1)


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    # llama.cpp's use_more_bits(): the first and last eighth of the layers, and every third one between
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


FALLBACK = {"q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0"}  # llama.cpp, for rows not a multiple of 256


def q4_k_m_types(shapes: dict[str, tuple[int, ...]], n_layers: int) -> dict[str, str]:
    """Tensor name -> weight type as llama.cpp's Q4_K_M picks it: 1-D tensors f32; output.weight (or the
    tied token_embd.weight when there is no output.weight) q6_K; attn_v and ffn_down q6_K in the layers
    use_more_bits() names, q4_K elsewhere; a K-quant whose row length (cols) is not a multiple of 256 falls
    back to q5_0 / q5_1 / q8_0 as llama.cpp does (SmolLM2's 576-wide rows)."""
    tied = "output.weight" not in shapes
    types = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            types[name] = "f32"
            continue
        kind = "q4_K"
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            kind = "q6_K"
        elif name.startswith("blk.") and name.endswith((".attn_v.weight", ".ffn_down.weight")):
            if _use_more_bits(int(name.split(".")[1]), n_layers):
                kind = "q6_K"
        if shape[1] % QK_K:
            kind = FALLBACK[kind]
        types[name] = kind
    return types


__all__ = ["FALLBACK", "K_QUANTS", "WEIGHT_TYPES", "pack_k_scales", "q4_k_m_types", "quantize", "random_gguf"]
