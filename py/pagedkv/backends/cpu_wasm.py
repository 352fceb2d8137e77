"""Projections on QUANTIZED weights through the WebAssembly SIMD kernel (web/wasm/linear.wat): the tab's CPU path.

The einsum path (cpu_linear.py) holds every weight as f32 and decode reads 4 bytes a weight; here the
projections and the output head stay in their q4_1 / q8_0 blocks (0.75 / 1.25 bytes a weight with the f32
scales) and the kernel decodes each block in registers. q4_0 and q5_0 are held as q8_0 (quants.promote: the
same weights, losslessly); other types keep the einsum path. Numerics: each weight is exactly numpy's
dequantized f32 (d * code + m); the dot products sum in a different order than einsum (f32 accumulate).

The kernel is any callable with the wasm export's signature, matmul(kind, qs, dm, rows, cols, x, t, out,
scratch), integers all, pointers being addresses in the memory numpy's arrays live in: in the tab, the
wasm export itself on Pyodide's memory (browser/interop.py: linear_wasm_matmul); in CPython, pointer_twin,
the numpy twin over the same addresses (tests).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..model.layout import dequantize
from ..model.quants import QK, promote, unpack
from .cpu_linear import PROJECTIONS, EinsumWeight

KINDS = {"q4_1": 0, "q8_0": 1}  # the kernel's `kind` argument
HELD_AS = {"q4_1": "q4_1", "q8_0": "q8_0", "q4_0": "q8_0", "q5_0": "q8_0"}  # manifest dtype -> kernel type
Kernel = Callable[[int, int, int, int, int, int, int, int, int], object]


def address_of(a: np.ndarray) -> int:
    """Where `a`'s first byte lives in the memory numpy's arrays live in: the pointer the wasm kernels take
    (in the tab, an offset into Pyodide's wasm memory)."""
    return a.__array_interface__["data"][0]


def array_at(address: int, ctype, count: int) -> np.ndarray:
    """The inverse of address_of for the kernels' numpy twins (CPython): `count` ctypes values at `address`."""
    import ctypes  # here: the tab never calls the twins

    return np.ctypeslib.as_array((ctype * count).from_address(address))


class QuantWeight:
    """An (out, in) weight in the kernel's layout (linear.wat's header): `qs` codes, `dm` (rows, nb, 2) f32
    (d, m) pairs. `h @ w.T` runs the kernel; `w[rows]` dequantizes those rows (the tied embedding)."""

    def __init__(self, kind: str, qs: np.ndarray, dm: np.ndarray, kernel: Kernel) -> None:
        rows, nb, two = dm.shape
        per_block = 16 if kind == "q4_1" else 32
        if kind not in KINDS or two != 2 or qs.shape != (rows, nb * per_block):
            raise ValueError(f"{kind} weight: qs {qs.shape} and dm {dm.shape} are not the kernel's layout")
        self.kind, self.qs, self.dm, self.kernel = kind, qs, dm, kernel
        self.shape = (rows, nb * QK)
        self.nbytes = qs.nbytes + dm.nbytes
        self._scratch = np.empty(self.shape[1], np.float32)  # (cols,) the kernel's decoded row or block sums
        # (kind, qs, dm, rows, cols) and scratch: fixed per weight, so each call only looks up x and out
        self._args = (KINDS[kind], address_of(qs), address_of(dm), rows, self.shape[1])
        self._scratch_addr = address_of(self._scratch)
        # One token (decode) goes through fixed buffers: an address lookup costs as much as a small product in
        # Pyodide (measured: 8.6 us each; `h @ w.T` for a 32x576 weight 91 -> 57 us).
        self._x1 = np.empty((1, self.shape[1]), np.float32)  # (1, cols)
        self._out1 = np.empty((1, rows), np.float32)  # (1, rows)
        self._args1 = self._args + (address_of(self._x1), 1, address_of(self._out1), self._scratch_addr)

    @classmethod
    def from_parts(cls, dtype: str, shape: tuple[int, int], parts: dict, kernel: Kernel) -> "QuantWeight":
        """A manifest tensor's web parts (model/layout.py) -> the kernel's layout, without an f32 copy."""
        kind = HELD_AS[dtype]
        fields = promote(dtype, kind, unpack(dtype, shape, parts))
        rows, cols = shape
        nb = cols // QK
        m = fields["m"] if kind == "q4_1" else np.zeros_like(fields["d"])
        dm = np.stack([fields["d"].astype(np.float32), m.astype(np.float32)], axis=2)  # (rows, nb, 2)
        if kind == "q4_1":
            q = fields["q"].reshape(rows, nb, 2, 16)
            qs = (q[:, :, 0] | (q[:, :, 1] << 4)).astype(np.uint8).reshape(rows, nb * 16)
        else:
            qs = np.ascontiguousarray(fields["q"], np.int8)
        return cls(kind, qs, dm, kernel)

    def codes(self, rows) -> np.ndarray:
        """(n, nb, 32) f32 codes of the given rows, in weight order."""
        qs = self.qs[rows].reshape(-1, self.dm.shape[1], self.qs.shape[1] // self.dm.shape[1])
        if self.kind == "q4_1":
            qs = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
        return qs.astype(np.float32)

    def __getitem__(self, rows) -> np.ndarray:
        dm = self.dm[rows]  # (n, nb, 2)
        w = self.codes(rows) * dm[:, :, 0:1] + dm[:, :, 1:2]  # numpy's dequantize: d * code, then + m
        return w.reshape(-1, self.shape[1])

    @property
    def T(self) -> "_QuantTransposed":  # noqa: N802  (ndarray's name, which NumpyModel calls)
        return _QuantTransposed(self)

    def matmul(self, h: np.ndarray) -> np.ndarray:
        """(T, cols) activations -> (T, rows) = h @ W.T through the kernel."""
        rows, cols = self.shape
        if h.ndim != 2 or h.shape[1] != cols:
            raise ValueError(f"projection input {h.shape} does not match weight {self.shape} (out, in)")
        if h.shape[0] == 1:
            np.copyto(self._x1, h)
            self.kernel(*self._args1)
            return self._out1.copy()  # (1, rows)
        x = np.ascontiguousarray(h, np.float32)  # (T, cols)
        out = np.empty((x.shape[0], rows), np.float32)  # (T, rows)
        if x.shape[0]:
            self.kernel(*self._args, address_of(x), x.shape[0], address_of(out), self._scratch_addr)
        return out


class _QuantTransposed:
    __array_ufunc__ = None  # ndarray's @ yields to __rmatmul__

    def __init__(self, w: QuantWeight) -> None:
        self.w = w

    def __rmatmul__(self, h: np.ndarray) -> np.ndarray:
        return self.w.matmul(h)


def tensor_loader(kernel: Kernel) -> Callable:
    """ModelWeights.from_shards' `convert`: projections, the output head and the embedding (the tied head;
    lookups dequantize their rows) of a kernel type as QuantWeight, every other tensor dequantized to f32."""
    names = {f".{p}.weight" for p in PROJECTIONS}

    def convert(name: str, dtype: str, shape: tuple[int, ...], parts: dict):
        wanted = name in ("token_embd.weight", "output.weight") or (
            name.startswith("blk.") and name[name.index(".", 4):] in names)
        if wanted and dtype in HELD_AS:
            return QuantWeight.from_parts(dtype, tuple(shape), parts, kernel)
        return dequantize(dtype, tuple(shape), parts)

    return convert


def wasm_weights(tensors: dict, n_layers: int, head: str) -> dict:
    """`tensors` with each remaining f32 projection (and head) wrapped for einsum; QuantWeights stay."""
    out = dict(tensors)
    for name in [head] + [f"blk.{i}.{p}.weight" for i in range(n_layers) for p in PROJECTIONS]:
        if isinstance(out[name], np.ndarray):
            out[name] = EinsumWeight(out[name])
    return out


def pointer_twin(kind: int, qs: int, dm: int, rows: int, cols: int, x: int, t: int, out: int, scratch: int) -> None:
    """The kernel's numpy twin over the same addresses (CPython): out = x @ W.T, W decoded as linear.wat does."""
    import ctypes  # here: the tab never calls the twin

    nb = cols // QK
    kind_name = [k for k, v in KINDS.items() if v == kind][0]
    ctype = ctypes.c_uint8 if kind_name == "q4_1" else ctypes.c_int8
    per_block = 16 if kind_name == "q4_1" else 32
    w = QuantWeight(kind_name, array_at(qs, ctype, rows * nb * per_block).reshape(rows, -1),
                    array_at(dm, ctypes.c_float, rows * nb * 2).reshape(rows, nb, 2), pointer_twin)
    xs = array_at(x, ctypes.c_float, t * cols).reshape(t, cols)
    array_at(out, ctypes.c_float, t * rows).reshape(t, rows)[...] = xs @ w[np.arange(rows)].T
    array_at(scratch, ctypes.c_float, cols)[...] = 0.0  # the kernel's scratch is clobbered too
