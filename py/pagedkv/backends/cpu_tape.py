"""The one-token step as a tape of kernel calls: the tab's CPU path decodes a token in one crossing into JS.

WasmAttentionModel's one-token step (backends/cpu_attention.py) is ~9 kernel calls a layer: the products (the
kernel on its threads), attn_decode and the glue. Made from Python each is a crossing of Pyodide's FFI, a few
microseconds, ~270 of them a SmolLM2 step (~1.2 ms of a 9.5 ms step, issue 51). The model writes the step once
as a tape, a float64 array in Pyodide's memory of [opcode, its arguments...] runs (OPS), and web/linear_tape.js
walks it in the worker, calling the same exports with the same arguments: one crossing a step, the same bits.
Each step only the attention's arguments that move with the context are rewritten in place (StepTape.set).

Where the kernels have no tape runner (CPython: the twins, wasmtime's instances) or a layer needs Python between
its calls (CALL: a bias add, a product of an f32 weight), `interpret` walks the same tape here, calling each
kernel by its name: one description of the step, two walkers.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .cpu_wasm import address_of

# opcode -> (the kernel export it calls, its argument count, the positions of its f32 arguments). MATMUL is one
# token's product (code, qs, dm, rows, cols, x, out, scratch): the store's matmul1 (its threads, or the export on
# Pyodide's memory); CALL (index) calls StepTape.calls[index]() here, which the JS walker cannot.
MATMUL, RMS_NORM, ADD_RMS_NORM, RMS_NORM_ROWS, SILU_MUL, GELU_TANH_MUL, ATTN_DECODE, CALL, ATTN_THREADS = range(9)
OPS = {
    MATMUL: ("matmul", 8, ()),
    RMS_NORM: ("rms_norm", 5, (3,)),  # x, w, n, eps, out
    ADD_RMS_NORM: ("add_rms_norm", 6, (4,)),  # x, y, w, n, eps, out
    RMS_NORM_ROWS: ("rms_norm_rows", 6, (4,)),  # x, w, n, rows, eps, out
    SILU_MUL: ("silu_mul", 4, ()),  # g, u, n, out
    GELU_TANH_MUL: ("gelu_tanh_mul", 4, ()),  # g, u, n, out
    # qkv, cos, sin, k, v, table, ctx, lo, bs, nkv, group, hd, slot, scale, s, ld, out
    ATTN_DECODE: ("attn_decode", 17, (13,)),
    CALL: ("call", 1, ()),
    # attn_decode's arguments, run by the kernel threads over their mirror of the KV pools (linear_threads.js
    # attn_decode: the same bits), which the step's store holds (its tape_threads)
    ATTN_THREADS: ("attn_decode_threads", 17, (13,)),
}
ATTENTION = (ATTN_DECODE, ATTN_THREADS)  # the ops whose moving arguments set() rewrites
BY_NAME = {name: code for code, (name, _, _) in OPS.items()}
# attn_decode's arguments that move with the step (the rest are the layer's): cos, sin, table, ctx, lo, slot, ld
ATTN_STEP_ARGS = (1, 2, 5, 6, 7, 12, 15)


class StepTape:
    """A one-token step's kernel calls in order (op), then frozen into `words` (finish): (n,) float64 in the
    memory numpy's arrays live in, which web/linear_tape.js reads at its address. Attention ops are kept by their
    kind (`key`): each step set() rewrites one kind's moving arguments in every layer of that kind at once."""

    def __init__(self) -> None:
        self._words: list[float] = []
        self.calls: list[Callable[[], object]] = []
        self._attention: dict[object, list[int]] = {}  # key -> the word offsets of its attn_decode ops
        self.words = np.empty(0, np.float64)
        self._at: dict[object, np.ndarray] = {}
        self.ops: list[tuple[int, list]] = []  # the words decoded (ops_of), for `interpret`
        self._op_at: dict[object, list[list]] = {}  # key -> the argument lists of its attn_decode ops in self.ops

    def op(self, name: str, *args, key: object = None) -> None:
        code = BY_NAME[name]
        if len(args) != OPS[code][1]:
            raise ValueError(f"{name} takes {OPS[code][1]} arguments, got {len(args)}")
        if code in ATTENTION:
            self._attention.setdefault(key, []).append(len(self._words))
        self._words += [code, *map(float, args)]

    def call(self, fn: Callable[[], object]) -> None:
        """Python between two kernel calls (the tape then runs through `interpret` only)."""
        self.op("call", len(self.calls))
        self.calls.append(fn)

    def finish(self) -> "StepTape":
        self.words = np.array(self._words, np.float64)  # (n,)
        self._at = {key: (np.array(offsets)[:, None] + 1 + np.array(ATTN_STEP_ARGS)[None, :])  # (layers, 7)
                    for key, offsets in self._attention.items()}
        self.ops = ops_of(self.words)
        at = {offset: args for offset, (_, args) in zip(op_offsets(self.words), self.ops)}
        self._op_at = {key: [at[offset] for offset in offsets] for key, offsets in self._attention.items()}
        return self

    def set(self, key: object, values: tuple) -> None:
        """The moving arguments (cos, sin, table, ctx, lo, slot, ld: ATTN_STEP_ARGS) of every attn_decode of kind
        `key`, in one write (and in `ops`' argument lists, which `interpret` reads)."""
        self.words[self._at[key]] = values
        for args in self._op_at[key]:
            for j, v in zip(ATTN_STEP_ARGS, values):
                args[j] = int(v)

    @property
    def address(self) -> int:
        return address_of(self.words)

    def run(self, kernels, store) -> None:
        """The step: through the kernels' tape runner in one call where they have one and the tape has no CALL,
        else `interpret`."""
        runner = getattr(kernels, "run_tape", None)
        if runner is not None and not self.calls:
            runner(self.address, self.words.size, store.tape_threads)
        else:
            interpret(self, kernels, store.matmul1, store.tape_threads)


def op_offsets(words: np.ndarray) -> list[int]:
    """The word offset of each op of a tape's words."""
    offsets, i = [], 0
    while i < words.size:
        offsets.append(i)
        i += 1 + OPS[int(words[i])][1]
    return offsets


def ops_of(words: np.ndarray) -> list[tuple[int, list]]:
    """A tape's words as (opcode, its arguments: ints but the f32 ones) a call."""
    values = words.tolist()
    ops = []
    for i in op_offsets(words):
        code = int(values[i])
        _, n, floats = OPS[code]
        ops.append((code, [v if j in floats else int(v) for j, v in enumerate(values[i + 1:i + 1 + n])]))
    return ops


def interpret(tape: StepTape, kernels, matmul1: Callable, threads=None) -> None:
    """web/linear_tape.js's walk, here: each op's kernel by its name on `kernels` with the tape's arguments (decoded
    once, the attention's moving ones kept current by set), MATMUL through matmul1(code, qs, dm, rows, cols, x,
    out, scratch), ATTN_THREADS through threads.attn_decode, CALL through tape.calls."""
    walk(tape.ops, tape.calls, kernels, matmul1, threads)


def walk(ops: list[tuple[int, list]], calls: list, kernels, matmul1: Callable, threads=None) -> None:
    for code, args in ops:
        if code == MATMUL:
            matmul1(*args)
        elif code == CALL:
            calls[args[0]]()
        elif code == ATTN_THREADS:
            threads.attn_decode(*args)
        else:
            getattr(kernels, OPS[code][0])(*args)
