"""Projections as one einsum per weight, for numpy builds without BLAS (Pyodide in the tab).

Pyodide's numpy has no BLAS: `h @ W.T` for a (T, in) activation and an (out, in) weight falls back to a
generic loop that is slower than einsum's own sum-of-products loop (measured in Pyodide 0.26, numpy 2.0.2,
best of 7 on a loaded 2-core machine: a (1536, 576) weight at T=8 11.9 vs 6.3 ms, T=32 32.9 vs 22.0, T=128
149 vs 92 ms; one token ("oi,ti->to", the weight's rows contiguous) 0.86 vs 0.40 ms, the (49152, 576) head
31.3 vs 18.1 ms). With BLAS (CPython) matmul wins: the backend takes this only when asked
(CpuBackend(linear="einsum"), the page's numpy path).

NumpyModel computes every projection as `h @ self.w[name].T`; wrapping those weights keeps its code and
numerics definition in one place (numpy_ref.py) while the product runs here.
"""
from __future__ import annotations

import numpy as np

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


class _Transposed:
    """W.T for `h @ W.T`: ndarray's @ yields to __rmatmul__ because __array_ufunc__ is None."""

    __array_ufunc__ = None

    def __init__(self, w: np.ndarray) -> None:
        self.w = w  # (out, in)

    def __rmatmul__(self, h: np.ndarray) -> np.ndarray:
        if h.ndim != 2 or h.shape[1] != self.w.shape[1]:
            raise ValueError(f"projection input {h.shape} does not match weight {self.w.shape} (out, in)")
        if h.shape[0] == 1:
            return np.einsum("oi,ti->to", self.w, h)  # (1, out): one dot product per weight row
        return np.einsum("ti,oi->to", h, self.w)  # (T, out)


class EinsumWeight:
    """An (out, in) projection weight whose `.T` multiplies through _Transposed; indexing reads rows (the
    tied embedding is also the output head)."""

    def __init__(self, w: np.ndarray) -> None:
        if w.ndim != 2:
            raise ValueError(f"a projection weight is 2-D (out, in), got shape {w.shape}")
        self.w = w
        self.shape = w.shape

    def __getitem__(self, rows) -> np.ndarray:
        return self.w[rows]

    @property
    def T(self) -> _Transposed:  # noqa: N802  (ndarray's name, which NumpyModel calls)
        return _Transposed(self.w)


def einsum_weights(tensors: dict[str, np.ndarray], n_layers: int, head: str) -> dict:
    """A copy of `tensors` with each layer's projection weights and the output head `head` wrapped (the
    arrays are shared, not copied)."""
    out = dict(tensors)
    out[head] = EinsumWeight(tensors[head])
    for layer in range(n_layers):
        for proj in PROJECTIONS:
            name = f"blk.{layer}.{proj}.weight"
            out[name] = EinsumWeight(tensors[name])
    return out
