"""Projections on QUANTIZED weights through the WebAssembly SIMD kernel (web/wasm/linear.wat): the tab's CPU path.

The einsum path (cpu_linear.py) holds every weight as f32 and decode reads 4 bytes a weight; here the
projections and the output head stay quantized, in one of the kernel's layouts (KINDS: 4- or 8-bit codes and
two f32 a 32-weight block, 0.75 / 1.25 bytes a weight; a q8_0 head with integer activations without q8_0's zero
m, 1.125 bytes a weight: head_blocks), and the kernel decodes each block in registers.
Every GGUF type the converter keeps is held exactly (HELD_AS, kernel_blocks): q4_0 / q5_0 as q8_0 codes
(quants.promote), q5_1 / q5_K as 8-bit codes with mins, q4_K as q4_1 (its 6-bit sub-block scale and min times
the super-block's d and dmin, f32 products that are exact), q6_K as 8-bit codes with a scale per 16 weights.
Numerics: each weight is exactly numpy's dequantized f32 (d * code + m); the dot products sum in a different
order than einsum (f32 accumulate).

Where the weights live is a store's business. HeapStore leaves them in numpy's memory for a kernel with the wasm
export's signature, matmul(kind, qs, dm, rows, cols, x, t, out, ldo, scratch), integers all, pointers being
addresses in the memory numpy's arrays live in: in the tab, the wasm export itself on Pyodide's memory
(browser/interop.py: linear_wasm_matmul); in CPython, pointer_twin, the numpy twin over the same addresses.
SharedStore moves them into the memory the kernel's threads share (every core: web/linear_threads.js, through
interop.linear_threads; in CPython, ThreadsTwin), each product split into one slice of rows per thread.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from ..model.layout import dequantize
from ..model.quants import QK, k_scale_min, promote, unpack
from .cpu_linear import PROJECTIONS, EinsumWeight

# The kernel's `kind` argument (| ACT16, | QUANTIZED_X below) of each layout: 4-bit codes with (d, m) a block, 8-bit
# codes with d, with (d, m), with (d0, d1) for weights 0..15 and 16..31, with d alone (q8_d: the output head).
KINDS = {"q4_1": 0, "q8_0": 1, "q8_m": 17, "q8_16": 9, "q8_d": 65}
D_ONLY = 64  # kind bit: one f32 d a block, no m, each row's d and codes together (d_rows), not (d, m) pairs apart
HELD_AS = {"q4_1": "q4_1", "q4_K": "q4_1", "q8_0": "q8_0", "q4_0": "q8_0", "q5_0": "q8_0", "q5_1": "q8_m",
           "q5_K": "q8_m", "q6_K": "q8_16"}  # manifest dtype -> kernel layout
Kernel = Callable[[int, int, int, int, int, int, int, int, int, int], object]


def address_of(a: np.ndarray) -> int:
    """Where `a`'s first byte lives in the memory numpy's arrays live in: the pointer the wasm kernels take
    (in the tab, an offset into Pyodide's wasm memory)."""
    return a.__array_interface__["data"][0]


def array_at(address: int, ctype, count: int) -> np.ndarray:
    """The inverse of address_of for the kernels' numpy twins (CPython): `count` ctypes values at `address`."""
    import ctypes  # here: the tab never calls the twins

    return np.ctypeslib.as_array((ctype * count).from_address(address))


def dequantize_rows(kind: str, qs: np.ndarray, dm: np.ndarray) -> np.ndarray:
    """(n, nb * 32) f32 weights of n rows in the kernel's layout (qs codes, dm (n, nb, 2), q8_d's d (n, nb)):
    numpy's dequantize, d * code, then + m (q8_16: d0 * code for weights 0..15 of a block, d1 * code for 16..31)."""
    n, nb = dm.shape[:2]
    q = qs.reshape(n, nb, -1)
    if kind == "q8_d":
        return (q.astype(np.float32) * dm[:, :, None]).reshape(n, nb * QK)
    if kind == "q4_1":
        q = np.concatenate([q & 0x0F, q >> 4], axis=2)
    if kind == "q8_16":
        return (q.reshape(n, nb, 2, QK // 2).astype(np.float32) * dm[:, :, :, None]).reshape(n, nb * QK)
    return (q.astype(np.float32) * dm[:, :, 0:1] + dm[:, :, 1:2]).reshape(n, nb * QK)


def kernel_blocks(dtype: str, shape: tuple[int, int], parts: dict,
                  activations: str = "f32") -> tuple[str, np.ndarray, np.ndarray]:
    """A manifest tensor's web parts (model/layout.py) -> (kernel layout, qs codes, dm (rows, nb, 2) f32) holding
    exactly its weights, without an f32 copy of them. With 8-bit activations q5_0 goes as q8_m: its stored codes
    (0..31, the relaxed dot's i7 operand: kind_code) and m = -16 d, d * code - 16 d being d * (code - 16) exactly
    (both products exact in f32, their difference representable)."""
    kind, f32 = HELD_AS[dtype], np.float32
    rows, cols = shape
    nb = cols // QK
    fields = unpack(dtype, shape, parts)
    if dtype == "q5_0" and activations == "int8":
        d = fields["d"].astype(f32)
        q = fields["q"].astype(np.int8)  # 0..31 (unpack leaves q5_0's offset of 16 to the dequantization)
        return "q8_m", np.ascontiguousarray(q), np.stack([d, d * f32(-16)], axis=2)
    if kind == "q8_0":
        fields = promote(dtype, "q8_0", fields)
    if dtype in ("q4_K", "q5_K"):  # sub-block j of a super-block: d * sc_j * q - dmin * m_j
        sc, mn = k_scale_min(fields["scales"])  # (rows, nb / 8, 8) each
        d = (fields["d"].astype(f32)[..., None] * sc.astype(f32)).reshape(rows, nb)
        m = -(fields["dmin"].astype(f32)[..., None] * mn.astype(f32)).reshape(rows, nb)
    elif dtype == "q6_K":  # d * sc_j * (q - 32), sc_j a scale of 16 weights: two a block, in dm's two slots
        d, m = (fields["d"].astype(f32)[..., None] * fields["sc"].astype(f32)).reshape(rows, nb, 2).transpose(2, 0, 1)
        fields = {"q": (fields["q"].astype(np.int16) - 32)}
    else:
        d = fields["d"].astype(f32)
        m = fields["m"].astype(f32) if "m" in fields else np.zeros_like(d)
    dm = np.stack([d, m], axis=2)  # (rows, nb, 2)
    if kind == "q4_1":
        q = fields["q"].reshape(rows, nb, 2, 16)
        return kind, (q[:, :, 0] | (q[:, :, 1] << 4)).astype(np.uint8).reshape(rows, nb * 16), dm
    return kind, np.ascontiguousarray(fields["q"].astype(np.int8)), dm


def head_blocks(dtype: str, shape: tuple[int, int], parts: dict) -> tuple[str, np.ndarray, np.ndarray]:
    """An output head's web parts -> (q8_d, its codes, d (rows, nb) f32) for a q8_0 file's head: 36 bytes a
    block (and a row's padding: d_rows), not kernel_blocks' 40 (its m is 0; the head is most of a small model's
    step: Gemma 3 270M's 262,144 rows 210 -> 189 MB), the same weights; kernel_blocks' layout for other types.
    Not f16 d (llama.cpp's 34 bytes): widening it costs the one-token loop more than the bytes save in V8
    (docs/performance.md, issue 51)."""
    if dtype != "q8_0":
        return kernel_blocks(dtype, shape, parts)
    fields = unpack(dtype, shape, parts)
    return "q8_d", fields["q"], fields["d"].astype(np.float32)  # QuantWeight packs them into d_rows' one array


def d_pad(nb: int) -> int:
    """Where a q8_d row's codes begin: after its nb f32 d, padded to 16 bytes (the codes' v128 loads aligned)."""
    return -(-nb * 4 // 16) * 16


def d_rows(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    """q8_d's layout (linear.wat's kind 65): (rows, d_pad(nb) + nb * 32) bytes, row r its nb f32 d, zeros to
    d_pad, then its codes, so the head's product reads one stream of memory, not two (codes and scales apart,
    measured ~10 % slower: docs/performance.md). qs (rows, nb * 32) i8, d (rows, nb) f32; either may be a view."""
    rows, nb = d.shape
    out = np.zeros((rows, d_pad(nb) + nb * QK), np.uint8)
    out[:, :nb * 4] = np.ascontiguousarray(d, np.float32).view(np.uint8)
    out[:, d_pad(nb):] = qs.view(np.uint8)
    return out


def split_d_rows(rows: np.ndarray, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """d_rows' rows (n, d_pad(nb) + nb * 32) bytes -> (codes (n, nb * 32) i8, d (n, nb) f32)."""
    return (np.ascontiguousarray(rows[:, d_pad(nb):]).view(np.int8),
            np.ascontiguousarray(rows[:, :nb * 4]).view(np.float32))


def row_steps(code: int, nb: int) -> tuple[int, int]:
    """The bytes from one row's codes (qs) to the next row's, and from its scales (dm) to the next's, in the layout
    of kind code `code` with nb blocks a row: a q8_d row holds both (d_rows), so both step over it."""
    if code & D_ONLY:
        return (d_pad(nb) + nb * QK,) * 2
    return nb * (32 if code & 1 else 16), nb * 8


class HeapStore:
    """Weights left where numpy put them, the kernel reading them at their addresses on one thread: the wasm
    export on Pyodide's memory (browser/interop.py: linear_wasm_matmul) or, in CPython, pointer_twin."""

    threads = 1
    tape_threads = None  # web/linear_tape.js's walker calls the export itself (cpu_tape.StepTape.run)

    def __init__(self, kernel: Kernel, activations: str = "f32") -> None:
        self.kernel, self.activations = kernel, check_activations(activations)

    def place(self, a: np.ndarray) -> np.ndarray:
        return a

    @staticmethod
    def address(placed: np.ndarray) -> int:
        return address_of(placed)

    def matmul1(self, code: int, qs: int, dm: int, rows: int, cols: int, x: int, out: int, scratch: int) -> None:
        """One token's product at those addresses (a step tape's MATMUL: cpu_tape.py); scratch its own, at least
        scratch_floats(cols, 1, code) f32."""
        self.kernel(code, qs, dm, rows, cols, x, 1, out, rows, scratch)

    def rows(self, placed: np.ndarray, rows) -> np.ndarray:
        return placed[rows]

    def fetch(self, placed: np.ndarray) -> np.ndarray:
        return placed

    def bind(self, kernel_args: tuple[int, int, int, int, int]) -> Callable[[int, int, int], object]:
        """run(x, t, out): out (t, rows) = x (t, cols) @ W.T for a weight's kernel_args (code, qs, dm, rows, cols:
        QuantWeight's); W's scratch (a decoded row, block sums, the tokens' quantized blocks) is its own."""
        code, rows, cols, kernel = kernel_args[0], kernel_args[3], kernel_args[4], self.kernel
        held = [np.empty(scratch_floats(cols, 1, code), np.float32)]

        def run(x: int, t: int, out: int) -> None:
            if held[0].size < scratch_floats(cols, t, code):
                held[0] = np.empty(scratch_floats(cols, t, code), np.float32)
            kernel(*kernel_args, x, t, out, rows, address_of(held[0]))

        return run


class Region:
    """An array's bytes in the kernel threads' shared memory: offset, dtype and shape (SharedStore.place)."""

    def __init__(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.offset, self.dtype, self.shape = offset, dtype, shape


class SharedStore:
    """Weights copied into the memory the kernel's threads share (web/linear_threads.js; ThreadsTwin in CPython):
    each product runs on `threads` threads, one slice of the weight's rows each, its activations copied in and
    its outputs out. The copies numpy held are dropped; a weight's bytes go back to the memory with it."""

    def __init__(self, threads, activations: str = "f32") -> None:
        self.js, self.activations = threads, check_activations(activations)
        self.threads = int(threads.threads)
        self.tape_threads = threads  # web/linear_tape.js's walker runs a step tape's products on them

    @staticmethod
    def address(placed: Region) -> int:
        return placed.offset

    def matmul1(self, code: int, qs: int, dm: int, rows: int, cols: int, x: int, out: int, scratch: int) -> None:
        """One token's product, x and out in Pyodide's memory, on the threads (a step tape's MATMUL: cpu_tape.py;
        the threads keep their own scratch)."""
        self.js.matmul(code, qs, dm, rows, cols, x, 1, out)

    def place(self, a: np.ndarray) -> Region:
        a = np.ascontiguousarray(a)
        region = Region(int(self.js.place(address_of(a), a.nbytes)), a.dtype, a.shape)
        weakref.finalize(region, self.js.free, region.offset)
        return region

    def rows(self, placed: Region, rows) -> np.ndarray:
        """placed[rows] read back (the tied embedding's lookups), one row per call."""
        idx = np.arange(placed.shape[0])[rows]
        out = np.empty((idx.size, *placed.shape[1:]), placed.dtype)
        row_bytes = out.itemsize * int(np.prod(placed.shape[1:], dtype=np.int64))
        base = address_of(out)
        for i, r in enumerate(idx.reshape(-1).tolist()):
            self.js.read(placed.offset + r * row_bytes, row_bytes, base + i * row_bytes)
        return out.reshape(*idx.shape, *placed.shape[1:])

    def fetch(self, placed: Region) -> np.ndarray:
        """The whole array back, in one copy."""
        out = np.empty(placed.shape, placed.dtype)
        self.js.read(placed.offset, out.nbytes, address_of(out))
        return out

    def bind(self, kernel_args: tuple[int, int, int, int, int]) -> Callable[[int, int, int], object]:
        """run(x, t, out) on the threads, x and out in Pyodide's memory, for a weight's kernel_args (HeapStore.bind)."""
        matmul = self.js.matmul

        def run(x: int, t: int, out: int) -> None:
            matmul(*kernel_args, x, t, out)

        return run


Store = HeapStore | SharedStore


class QuantWeight:
    """An (out, in) weight in the kernel's layout (linear.wat's header): `qs` codes, `dm` (rows, nb, 2) f32
    (d, m) pairs, held by `store` (HeapStore or SharedStore). `h @ w.T` runs the kernel (through the store's
    activations: kind_code); `w[rows]` dequantizes those rows (the tied embedding)."""

    def __init__(self, kind: str, qs: np.ndarray, dm: np.ndarray, store: Store) -> None:
        rows, nb = dm.shape[:2]
        per_block = 16 if kind == "q4_1" else 32
        scales = ((rows, nb), np.float32) if kind == "q8_d" else ((rows, nb, 2), np.float32)
        if kind not in KINDS or (dm.shape, dm.dtype) != scales or qs.shape != (rows, nb * per_block):
            raise ValueError(f"{kind} weight: qs {qs.shape} and dm {dm.shape} {dm.dtype} are not the kernel's layout")
        if kind == "q8_d" and store.activations == "f32":
            raise ValueError("q8_d weights (d without m) run with integer activations only, not f32")
        self.kind, self.store = kind, store
        self.shape = (rows, nb * QK)
        self.parts = (rows,)  # the rows of each weight stacked here (stack)
        self.dm_shape = dm.shape
        if kind == "q8_d":  # one array: each row's d, then its codes (d_rows)
            packed = d_rows(qs, dm)
            self.nbytes = packed.nbytes
            self.qs = self.dm = store.place(packed)
            addresses = (store.address(self.qs) + d_pad(nb), store.address(self.qs))
        else:
            self.nbytes = qs.nbytes + dm.nbytes
            self.qs, self.dm = store.place(qs), store.place(dm)
            addresses = (store.address(self.qs), store.address(self.dm))
        # (code, qs, dm, rows, cols): a step tape's MATMUL arguments before x, out and scratch (cpu_tape.py)
        self.kernel_args = (kind_code(kind, store.activations), *addresses, rows, self.shape[1])
        self._run = store.bind(self.kernel_args)
        # One token (decode) goes through fixed buffers: an address lookup costs as much as a small product in
        # Pyodide (measured: 8.6 us each; `h @ w.T` for a 32x576 weight 91 -> 57 us).
        self._x1 = np.empty((1, self.shape[1]), np.float32)  # (1, cols)
        self._out1 = np.empty((1, rows), np.float32)  # (1, rows)
        self._one = (address_of(self._x1), 1, address_of(self._out1))

    @classmethod
    def from_parts(cls, dtype: str, shape: tuple[int, int], parts: dict, store: Store) -> "QuantWeight":
        """A manifest tensor's web parts (model/layout.py) -> the kernel's layout (kernel_blocks)."""
        return cls(*kernel_blocks(dtype, tuple(shape), parts, store.activations), store)

    @classmethod
    def stack(cls, weights: list["QuantWeight"]) -> "QuantWeight":
        """One weight of the rows of `weights` (one kind, one store, one width) in order; `parts` their rows."""
        store = weights[0].store
        if weights[0].kind == "q8_d":
            raise ValueError("q8_d weights (an output head) are not stacked")
        stacked = cls(weights[0].kind, np.concatenate([store.fetch(w.qs) for w in weights]),
                      np.concatenate([store.fetch(w.dm) for w in weights]), store)
        stacked.parts = tuple(r for w in weights for r in w.parts)
        return stacked

    def __getitem__(self, rows) -> np.ndarray:
        if self.kind == "q8_d":
            nb = self.dm_shape[1]
            qs, d = split_d_rows(self.store.rows(self.qs, rows).reshape(-1, row_steps(D_ONLY, nb)[0]), nb)
            return dequantize_rows(self.kind, qs, d)
        dm = self.store.rows(self.dm, rows).reshape(-1, *self.dm_shape[1:])
        return dequantize_rows(self.kind, self.store.rows(self.qs, rows).reshape(dm.shape[0], -1), dm)

    @property
    def T(self) -> "_QuantTransposed":  # noqa: N802  (ndarray's name, which NumpyModel calls)
        return _QuantTransposed(self)

    def run1(self, x: int, out: int) -> None:
        """One token at address x (cols f32) -> out (rows f32), both in Pyodide's memory (numpy arrays')."""
        self._run(x, 1, out)

    def matmul(self, h: np.ndarray) -> np.ndarray:
        """(T, cols) activations -> (T, rows) = h @ W.T through the kernel."""
        rows, cols = self.shape
        if h.ndim != 2 or h.shape[1] != cols:
            raise ValueError(f"projection input {h.shape} does not match weight {self.shape} (out, in)")
        if h.shape[0] == 1:
            np.copyto(self._x1, h)
            self._run(*self._one)
            return self._out1.copy()  # (1, rows)
        x = np.ascontiguousarray(h, np.float32)  # (T, cols)
        out = np.empty((x.shape[0], rows), np.float32)  # (T, rows)
        if x.shape[0]:
            self._run(address_of(x), x.shape[0], address_of(out))
        return out


class _QuantTransposed:
    __array_ufunc__ = None  # ndarray's @ yields to __rmatmul__

    def __init__(self, w: QuantWeight) -> None:
        self.w = w

    def __rmatmul__(self, h: np.ndarray) -> np.ndarray:
        return self.w.matmul(h)


def tensor_loader(store: Store) -> Callable:
    """ModelWeights.from_shards' `convert`: projections, the output head and the embedding (the tied head;
    lookups dequantize their rows) of a kernel type as QuantWeight in `store` (the head and embedding of a q8_0
    file without q8_0's zero m where the store's activations are integer: head_blocks), every other tensor
    dequantized to f32."""
    names = {f".{p}.weight" for p in PROJECTIONS}

    def convert(name: str, dtype: str, shape: tuple[int, ...], parts: dict):
        head = name in ("token_embd.weight", "output.weight")
        wanted = head or (name.startswith("blk.") and name[name.index(".", 4):] in names)
        if head and dtype in HELD_AS and store.activations != "f32":
            return QuantWeight(*head_blocks(dtype, tuple(shape), parts), store)
        if wanted and dtype in HELD_AS:
            return QuantWeight.from_parts(dtype, tuple(shape), parts, store)
        return dequantize(dtype, tuple(shape), parts)

    return convert


STACKS = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up": ("ffn_gate", "ffn_up")}


def as_q8_0(w: QuantWeight) -> QuantWeight | None:
    """A q8_m weight whose every m is -16 d (q5_0's, held so for 8-bit activations: kernel_blocks) as q8_0, its
    codes - 16 and m 0: the same weights (d * (code - 16) exactly); None for any other."""
    if w.kind != "q8_m":
        return None
    dm = w.store.fetch(w.dm)
    if not np.array_equal(dm[:, :, 1], dm[:, :, 0] * np.float32(-16)):
        return None
    codes = (w.store.fetch(w.qs).astype(np.int16) - 16).astype(np.int8)
    return QuantWeight("q8_0", codes, np.stack([dm[:, :, 0], np.zeros_like(dm[:, :, 0])], axis=2), w.store)


def stack_projections(tensors: dict, n_layers: int) -> None:
    """In place: each layer's q, k, v (and gate, up) QuantWeights of one kind, store and width become one
    stacked weight under the name the shaders give the same stack (attn_qkv, ffn_gate_up): one product where
    there were three (two), split across the kernel's threads as one. NumpyModel splits its rows back. Where
    q5_0 parts held for 8-bit activations (q8_m) meet a q8_0 one (llama.cpp's Q4_K_M: attn_v), they go back to
    q8_0 to stack (as_q8_0): one product through 16-bit activations costs a decode step less than three."""
    for i in range(n_layers):
        for stacked, names in STACKS.items():
            ws = [tensors.get(f"blk.{i}.{n}.weight") for n in names]
            if all(isinstance(w, QuantWeight) for w in ws) and {w.kind for w in ws} == {"q8_0", "q8_m"}:
                back = [w if w.kind == "q8_0" else as_q8_0(w) for w in ws]
                ws = back if all(w is not None for w in back) else ws
            if all(isinstance(w, QuantWeight) for w in ws) and len({(w.kind, id(w.store), w.shape[1]) for w in ws}) == 1:
                tensors[f"blk.{i}.{stacked}.weight"] = QuantWeight.stack(ws)
                for n in names:
                    del tensors[f"blk.{i}.{n}.weight"]


def wasm_weights(tensors: dict, n_layers: int, head: str) -> dict:
    """`tensors` with each remaining f32 projection (and head) wrapped for einsum; QuantWeights stay."""
    out = dict(tensors)
    for name in [head] + [f"blk.{i}.{p}.weight" for i in range(n_layers) for p in PROJECTIONS]:
        if isinstance(out.get(name), np.ndarray):
            out[name] = EinsumWeight(out[name])
    return out


# kind bits: 16-bit activations; x quantized already (16-bit: into scratch; 8-bit: x points at the blocks, scratch
# at the thread's accumulators); 8-bit activations
ACT16, QUANTIZED_X, ACT8 = 2, 4, 32
ACTIVATIONS = ("f32", "int16", "int8")  # what a store's products take x as (the page's ?activations=)
XQ_BYTES = {16: 72, 8: 40}  # a 32-value block of one token in scratch: its xsum and d (f32 each), 32 i16 / i8 codes
XQ_MAX = {16: 32767, 8: 127}  # the codes' largest magnitude: d = max |x| / XQ_MAX


def check_activations(activations: str) -> str:
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    return activations


def kind_code(kind: str, activations: str) -> int:
    """The kernel's `kind` argument for a weight of layout `kind` through `activations`: int8 takes 8-bit
    activations for 4-bit codes and q8_m's 0..31 (the relaxed-SIMD dot product takes the codes as its 0..127
    operand) and 16-bit ones for the other 8-bit codes (signed, so not an i7 operand); int16 16-bit for every
    layout; f32 none."""
    if activations == "int8" and kind in ("q4_1", "q8_m"):
        return KINDS[kind] | ACT8
    if kind == "q8_d" and activations == "f32":
        raise ValueError("q8_d weights (d without m) run with integer activations only, not f32")
    return KINDS[kind] | (ACT16 if activations != "f32" else 0)


def act_bits(code: int) -> int | None:
    """The activations' bits a kind code asks for: 8, 16, or None (f32)."""
    return 8 if code & ACT8 else 16 if code & ACT16 else None


ACC8_FLOATS = 640  # 8-bit activations: a thread's accumulators, 16 tokens x 5 slots x (d, m part) f32x4 ($dot_x8_r4)


def scratch_floats(cols: int, t: int, code: int) -> int:
    """The f32 a product's scratch needs: a decoded row (cols), or with integer activations every token's
    quantized blocks (linear.wat's quant_x / quant_x8: t * cols / 32 * XQ_BYTES bytes), with 8-bit ones then
    the accumulators (ACC8_FLOATS; x | QUANTIZED_X: x holds the blocks and scratch only these)."""
    bits = act_bits(code)
    if bits is None:
        return cols
    if bits == 8:
        return ACC8_FLOATS + (0 if code & QUANTIZED_X else -(-t * (cols // QK) * XQ_BYTES[8] // 4))
    return max(cols, -(-t * (cols // QK) * XQ_BYTES[bits] // 4))


def quantize_activations(x: np.ndarray, bits: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """linear.wat's quant_x (bits 16) or quant_x8 (bits 8) on one token x (cols,) f32: each 32-value block's scale
    d = max |x| / XQ_MAX, q = nearest(x / d) (ties to even; 0 where d is 0) and xsum = d * sum(q) (llama.cpp's q8_1
    s: a row with mins then multiplies its weights by the quantized x, where the exact sum of x left the codes'
    bias in the error), as (nb,) f32, (nb,) f32, (nb, 32) i16 or i8."""
    blocks = x.reshape(-1, QK)
    d = (np.abs(blocks).max(axis=1) / np.float32(XQ_MAX[bits])).astype(np.float32)  # (nb,)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv[:, None]).astype(np.int16 if bits == 16 else np.int8)  # (nb, 32)
    return d * q.sum(axis=1, dtype=np.int32).astype(np.float32), d, q


def integer_products(kind_name: str, qs: np.ndarray, dm: np.ndarray, xsum: np.ndarray, d: np.ndarray,
                     q: np.ndarray) -> np.ndarray:
    """(rows,) one token's products through integer activations (quantize_activations): per block
    d_w * d_x * (codes . q) in exact integers (q8_16: per half block, d0 and d1), plus m * xsum where the layout
    has mins (the sum order of the blocks aside, what linear.wat's $dot_x16 / $dot_x8_r1 compute)."""
    rows, nb, _ = dm.shape
    codes = qs.reshape(rows, nb, -1)
    if kind_name == "q4_1":
        codes = np.concatenate([codes & 0x0F, codes >> 4], axis=2)
    halves = np.einsum("rbhk,bhk->rbh", codes.reshape(rows, nb, 2, QK // 2).astype(np.int64),
                       q.reshape(nb, 2, QK // 2).astype(np.int64))  # (rows, nb, 2)
    if kind_name == "q8_16":
        return (halves.astype(np.float32) * (dm * d[None, :, None])).sum(axis=(1, 2), dtype=np.float32)
    ints = halves.sum(axis=2).astype(np.float32)  # (rows, nb)
    out = (ints * (dm[:, :, 0] * d[None, :])).sum(axis=1, dtype=np.float32)
    return out if kind_name == "q8_0" else out + (dm[:, :, 1] * xsum[None, :]).sum(axis=1, dtype=np.float32)


def pointer_twin(kind: int, qs: int, dm: int, rows: int, cols: int, x: int, t: int, out: int, ldo: int,
                 scratch: int) -> None:
    """The kernel's numpy twin over the same addresses (CPython): out = x @ W.T, W decoded as linear.wat does,
    out's rows ldo f32 apart; kind | ACT16 or ACT8: each token through its quant_x / quant_x8 blocks in scratch
    (written first unless kind | QUANTIZED_X), the same products as that token alone."""
    import ctypes  # here: the tab never calls the twin

    nb = cols // QK
    kind_name = [k for k, v in KINDS.items() if v == kind & 89][0]
    ctype = ctypes.c_uint8 if kind_name == "q4_1" else ctypes.c_int8
    per_block = 16 if kind_name == "q4_1" else 32
    if kind & D_ONLY:  # q8_d: q8_0's (d, 0) pairs, as the kernel's products see them
        if act_bits(kind) != 16:
            raise ValueError("q8_d weights (d without m) take 16-bit activations only (the kernel traps)")
        if qs != dm + d_pad(nb):
            raise ValueError("q8_d: qs must point at row 0's codes, d_pad(nb) bytes after its d at dm (d_rows)")
        qs_a, d = split_d_rows(array_at(dm, ctypes.c_uint8, rows * row_steps(kind, nb)[0]).reshape(rows, -1), nb)
        kind_name, dm_a = "q8_0", np.stack([d, np.zeros_like(d)], axis=2)
    else:
        qs_a = array_at(qs, ctype, rows * nb * per_block).reshape(rows, -1)
        dm_a = array_at(dm, ctypes.c_float, rows * nb * 2).reshape(rows, nb, 2)
    xs = array_at(x, ctypes.c_float, t * cols).reshape(t, cols)
    bits = act_bits(kind)
    if bits is not None:
        if bits == 8 and kind_name not in ("q4_1", "q8_m"):
            raise ValueError(f"8-bit activations take 4-bit codes or 0..127 ones (kinds 0, 17), not {kind_name}")
        blocks = x if bits == 8 and kind & QUANTIZED_X else scratch  # 8-bit, quantized already: x holds them
        if not kind & QUANTIZED_X:
            quant_x_twin(x, nb, t, scratch, bits)
        for i in range(t):
            at = blocks + i * nb * XQ_BYTES[bits]
            xsum, d = (array_at(at + 4 * nb * j, ctypes.c_float, nb) for j in (0, 1))
            q = array_at(at + 8 * nb, ctypes.c_int16 if bits == 16 else ctypes.c_int8, nb * QK).reshape(nb, QK)
            array_at(out + 4 * i * ldo, ctypes.c_float, rows)[...] = integer_products(kind_name, qs_a, dm_a, xsum, d, q)
        return
    w = dequantize_rows(kind_name, qs_a, dm_a)
    if t:
        at = (np.arange(t)[:, None] * ldo + np.arange(rows)).reshape(-1)
        array_at(out, ctypes.c_float, (t - 1) * ldo + rows)[at] = (xs @ w.T).reshape(-1)
    array_at(scratch, ctypes.c_float, cols)[...] = 0.0  # the kernel's scratch is clobbered too


def quant_x_twin(x: int, nb: int, t: int, scratch: int, bits: int = 16) -> None:
    """linear.wat's quant_x (bits 16) / quant_x8 (8) export over the same addresses (CPython): xsum, d, q of each
    of t tokens into scratch, nb * XQ_BYTES[bits] bytes apart."""
    import ctypes  # here: the tab never calls the twin

    for i in range(t):
        xsum, d, q = quantize_activations(array_at(x + 4 * i * nb * QK, ctypes.c_float, nb * QK), bits)
        at = scratch + i * nb * XQ_BYTES[bits]
        array_at(at, ctypes.c_float, nb)[...] = xsum
        array_at(at + 4 * nb, ctypes.c_float, nb)[...] = d
        array_at(at + 8 * nb, ctypes.c_int16 if bits == 16 else ctypes.c_int8, nb * QK)[...] = q.reshape(-1)


CHUNKS_PER_THREAD = 8  # web/linear_threads.js's: the rows of a product split into this many chunks per thread


def chunks(rows: int, threads: int) -> list[tuple[int, int]]:
    """The [r0, r1) chunks of a weight's rows that `threads` threads claim one at a time from a shared counter
    (web/linear_threads.js's runChunks): a thread that runs slower takes fewer."""
    size = -(-rows // (threads * CHUNKS_PER_THREAD))
    return [(r0, min(r0 + size, rows)) for r0 in range(0, rows, size)]


class ThreadsTwin:
    """web/linear_threads.js's object in numpy (CPython): place / free / read over arrays it keeps (their
    addresses are its offsets), matmul as the JS splits it: each chunk of rows through pointer_twin, out's rows
    the whole weight's apart. `split_calls` counts the products it split."""

    def __init__(self, threads: int = 2, min_work: int = 0) -> None:
        self.threads, self.min_work, self.split_calls = threads, min_work, 0
        self._live: dict[int, np.ndarray] = {}

    def place(self, address: int, nbytes: int) -> int:
        import ctypes  # here: the tab never calls the twin

        buf = array_at(address, ctypes.c_uint8, nbytes).copy()
        self._live[address_of(buf)] = buf
        return address_of(buf)

    def free(self, offset: int) -> None:
        del self._live[offset]

    def read(self, offset: int, nbytes: int, dest: int) -> None:
        import ctypes  # here: the tab never calls the twin

        array_at(dest, ctypes.c_uint8, nbytes)[...] = array_at(offset, ctypes.c_uint8, nbytes)

    def matmul(self, kind: int, qs: int, dm: int, rows: int, cols: int, x: int, t: int, out: int) -> None:
        n = self.threads if rows >= self.threads and rows * cols * t >= self.min_work else 1
        self.split_calls += n > 1
        nb, scratch, bits = cols // QK, np.empty(scratch_floats(cols, t, kind), np.float32), act_bits(kind)
        row_q, row_d = row_steps(kind, nb)
        if bits is not None and n > 1:  # the tokens quantized once, every chunk reading them
            quant_x_twin(x, nb, t, address_of(scratch), bits)
            kind |= QUANTIZED_X
            if bits == 8:  # x: the blocks (held in `blocks`); scratch: the accumulators
                blocks, scratch = scratch, np.empty(ACC8_FLOATS, np.float32)
                x = address_of(blocks)
        for r0, r1 in chunks(rows, n) if n > 1 else [(0, rows)]:
            pointer_twin(kind, qs + r0 * row_q, dm + r0 * row_d, r1 - r0, cols, x, t, out + 4 * r0,
                         rows, address_of(scratch))
