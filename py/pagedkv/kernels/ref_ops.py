"""Numpy references for the model's WGSL kernels, and the math the reference forward is built from.

rms_norm, rope_adjacent, silu and shift_keys are the building blocks of backends/numpy_ref.py (and of the
CPU and WebGPU backends' key shifts); the kernel references below are written with them and with
layout.dequantize, so the GPU kernels are checked against the same oracle as the whole model.
Pure numpy: runs in CPython and Pyodide.
"""

from __future__ import annotations

import numpy as np

from ..model.layout import dequantize
from ..model.quants import WEIGHT_TYPES, pack, unpack

QUANTIZED = tuple(name for name, t in WEIGHT_TYPES.items() if t.quantized)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (T, H) -> x / rms(x) * weight (shaders/rmsnorm.wgsl). The mean as np.mean takes it (a sum in x's dtype,
    then / H), without np.mean's Python wrapper: ~50 us a call in Pyodide, two calls a layer a step."""
    return x / np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True) / x.shape[-1] + eps) * weight


def rope_inv_freq(head_dim: int, base: float, freq_scale: float = 1.0,
                  factors: tuple[float, ...] | None = None) -> np.ndarray:
    """(head_dim/2,) f32 rotary frequencies; llama.cpp computes theta = pos * freq_scale * base^(-2i/head_dim)
    / factors[i] (freq_scale from linear rope scaling, factors from a GGUF's rope_freqs.weight)."""
    inv = freq_scale / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if factors is not None:
        inv = inv / np.asarray(factors, dtype=np.float64)
    return inv.astype(np.float32)


def model_inv_freq(config) -> np.ndarray:
    """(head_dim/2,) f32 rotary frequencies of a ModelConfig's file (its rope base and scaling): those of every layer
    of a family whose layers all rotate alike (layer_inv_freq gives each layer's own)."""
    return rope_inv_freq(config.head_dim, config.rope_base, config.rope_freq_scale, config.rope_freq_factors)


def layer_inv_freq(config, layer) -> np.ndarray | None:
    """(head_dim/2,) f32 rotary frequencies of one family.Layer of `config`; None for a layer without rotary."""
    att = layer.attention
    if att.rope_base is None:
        return None
    if att.rope_scaled:
        return rope_inv_freq(config.head_dim, att.rope_base, config.rope_freq_scale, config.rope_freq_factors)
    return rope_inv_freq(config.head_dim, att.rope_base)


def rope_adjacent(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (2i, 2i+1) of x (T, n_heads, head_dim) by positions * inv_freq[i]."""
    return rotate_adjacent(x, *rope_tables(positions, inv_freq))


def rope_tables(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (T, 1, head_dim/2) of the angles positions * inv_freq[i] that rope_adjacent rotates by."""
    angles = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # (T, head_dim/2)
    return np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]


def rotate_adjacent(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """rope_adjacent's rotation of x (T, n_heads, head_dim) by its angles' cos and sin, (T, 1, head_dim/2) each."""
    x0, x1 = x[..., 0::2], x[..., 1::2]  # (T, n_heads, head_dim/2)
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def shift_keys(k_blocks: np.ndarray, deltas: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Re-rotate cached keys k_blocks (n, block_size, n_kv_heads, head_dim) by -deltas (n,) positions.

    The keys were rotated at position p; the result is them rotated at p - delta (RoPE composes).
    """
    n, bs, nkv, hd = k_blocks.shape
    positions = np.repeat(-np.asarray(deltas, dtype=np.int64), bs)  # (n * block_size,)
    flat = k_blocks.astype(np.float32).reshape(n * bs, nkv, hd)
    return rope_adjacent(flat, positions, inv_freq).reshape(k_blocks.shape).astype(k_blocks.dtype)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


GELU_COEF = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.7978845608028654)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in x's dtype (Gemma's GeGLU)."""
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(SQRT_2_OVER_PI * x * (np.float32(1.0) + GELU_COEF * x * x)))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}  # a family.Layer's activation by name


def _check_quantized(dtype: str, shape: tuple[int, int]) -> tuple[int, int]:
    if dtype not in QUANTIZED:
        raise ValueError(f"quantized kernels take {list(QUANTIZED)}, got {dtype!r}")
    block = WEIGHT_TYPES[dtype].block
    if len(shape) != 2 or shape[1] % block != 0 or shape[0] <= 0:
        raise ValueError(f"{dtype} weight must be 2-D (rows, cols) with cols a multiple of {block}, got {list(shape)}")
    return shape


def quantized_linear(x: np.ndarray, dtype: str, shape: tuple[int, int], parts: dict) -> np.ndarray:
    """x (T, cols) @ W.T -> (T, rows) with W dequantized from its parts: matvec_* and matmul_* kernels."""
    rows, cols = _check_quantized(dtype, shape)
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"x must be (tokens, {cols}), got {x.shape}")
    return x.astype(np.float32) @ dequantize(dtype, shape, parts).T  # (T, rows)


def row_parts(dtype: str, shape: tuple[int, int], parts: dict, row_ids: np.ndarray) -> dict[str, bytes]:
    """The parts of the sub-matrix made of rows `row_ids` (in that order), in the same layout."""
    rows, cols = _check_quantized(dtype, shape)
    ids = np.asarray(row_ids, dtype=np.int64)  # (n,)
    if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= rows)):
        raise ValueError(f"row ids must be a 1-D array of values in [0, {rows})")
    fields = unpack(dtype, (rows, cols), parts)
    return pack(dtype, {name: field[ids] for name, field in fields.items()})


def embedding(token_ids: np.ndarray, dtype: str, shape: tuple[int, int], parts: dict) -> np.ndarray:
    """Rows `token_ids` (T,) of a quantized (vocab, hidden) table, dequantized -> (T, hidden) f32."""
    ids = np.asarray(token_ids)
    sub = row_parts(dtype, shape, parts, ids)
    return dequantize(dtype, (ids.shape[0], shape[1]), sub)


def rope_cos_sin(head_dim: int, base: float, num_positions: int, inv_freq: np.ndarray | None = None) -> np.ndarray:
    """(num_positions, head_dim/2, 2) f32 table of (cos, sin) of pos * inv_freq[i], as rope_adjacent computes them
    (inv_freq: a model's own frequencies, model_inv_freq; default rope_inv_freq(head_dim, base))."""
    if num_positions <= 0:
        raise ValueError(f"num_positions must be positive, got {num_positions}")
    if inv_freq is None:
        inv_freq = rope_inv_freq(head_dim, base)  # (head_dim/2,)
    angles = np.arange(num_positions, dtype=np.int32).astype(np.float32)[:, None] * inv_freq[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)


def rope(q: np.ndarray, k: np.ndarray, positions: np.ndarray, head_dim: int, base: float):
    """Rotate q (T, n_heads*head_dim) and k (T, n_kv_heads*head_dim) by their tokens' positions."""
    inv_freq = rope_inv_freq(head_dim, base)
    t = positions.shape[0]
    q_out = rope_adjacent(q.reshape(t, -1, head_dim), positions, inv_freq).reshape(q.shape)
    k_out = rope_adjacent(k.reshape(t, -1, head_dim), positions, inv_freq).reshape(k.shape)
    return q_out, k_out


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, elementwise, any shape."""
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have one shape, got {gate.shape} and {up.shape}")
    return silu(gate.astype(np.float32)) * up.astype(np.float32)


def argmax(logits: np.ndarray) -> np.ndarray:
    """(S, vocab) -> (S,) uint32 index of each row's maximum, lowest index on ties (numpy's rule)."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be (sequences, vocab), got {logits.shape}")
    return np.argmax(logits, axis=1).astype(np.uint32)
