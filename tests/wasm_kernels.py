"""The built wasm kernels (web/wasm/linear.wat through build.wasm_modules: wabt's wat2wasm, the bytes dist/wasm
ships) run in CPython by wasmtime, behind the interface the tab's Python calls: exports taking addresses in the
memory numpy's arrays live in (cpu_wasm.HeapStore's kernel, cpu_attention's kernels object).

In the tab those addresses are offsets into Pyodide's own wasm memory. In CPython numpy's arrays live in the
process's heap, outside any wasm memory, so WasmKernels places each call's buffers in the instance's memory, as
web/linear_threads.js does for its shared memory: every pointer argument's region (its size from the call's
other arguments: FOOTPRINTS, the exports' documented layouts in linear.wat) is copied in, overlapping regions as
one span (an output written in place, a slice of a pool), the export runs on their offsets, and every span is
copied back. The bytes around them are 0xFF (NaN as f32) before each call, so a region sized too small
shows up as NaN or garbage in the results, not as plausible numbers.
"""
from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np
import wasmtime

import build
from pagedkv.backends.cpu_wasm import (ACC8_FLOATS, ACT8, CHUNKS_PER_THREAD, D_ONLY, QUANTIZED_X, XQ_BYTES, act_bits,
                                      array_at, chunks, row_steps, scratch_floats)
from pagedkv.model.quants import QK

LINEAR_WAT = build.ROOT / "web" / "wasm" / "linear.wat"
PAGE = 65536
MIN_KEYS = 64  # linear_threads.js's minKeys: a decode step's keys below which its attention stays on one thread
ALIGN = 16  # every region at a 16-byte offset, as numpy's arrays are in the tab (v128 loads take any address)


@functools.cache
def modules() -> dict[str, bytes]:
    """linear.wat's four modules as the build writes them (linear, linear_shared, linear_relaxed, ...)."""
    return build.wasm_modules(LINEAR_WAT)


def engine(relaxed: bool = True) -> wasmtime.Engine:
    """An engine with SIMD and threads (shared memories); relaxed SIMD only where asked (a browser without it
    validates only the plain modules)."""
    config = wasmtime.Config()
    config.wasm_simd, config.wasm_relaxed_simd = True, relaxed
    config.wasm_threads, config.shared_memory = True, True
    return wasmtime.Engine(config)


class SharedMemory(wasmtime.SharedMemory):
    """wasmtime.SharedMemory that can be an instance's import: wasmtime-py 50.0.1's _as_extern wraps its pointer
    in a second one, which ctypes refuses ("incompatible types, LP_LP_wasmtime_sharedmemory"); the C API's
    extern takes the pointer itself."""

    def _as_extern(self):
        from wasmtime import _ffi as ffi

        union = ffi.wasmtime_extern_union(sharedmemory=self.ptr())
        return ffi.wasmtime_extern_t(ffi.WASMTIME_EXTERN_SHAREDMEMORY, union)


def _table_blocks(table: int, ctx: int, bs: int) -> int:
    """The pool blocks a table's first ceil(ctx / bs) entries reach: the largest id + 1."""
    used = -(-ctx // bs)
    return int(array_at(table, ctypes.c_int32, used).max()) + 1 if used else 0


def _matmul(kind, qs, dm, rows, cols, x, t, out, ldo, scratch):
    nb = cols // QK
    row_q, row_d = row_steps(kind, nb)  # 8-bit codes (kinds 1, 9, 17) or 4-bit (0); q8_d: both steps a whole row
    q_bytes, d_bytes = (nb * 32, nb * 4) if kind & D_ONLY else (row_q, row_d)  # the last row's
    x_bytes = t * nb * XQ_BYTES[8] if kind & ACT8 and kind & QUANTIZED_X else t * cols * 4  # x: the blocks
    return [(qs, (rows - 1) * row_q + q_bytes if rows else 0), (dm, (rows - 1) * row_d + d_bytes if rows else 0),
            (x, x_bytes),
            (out, ((t - 1) * ldo + rows) * 4 if t else 0),
            (scratch, scratch_floats(cols, t, kind) * 4)]


def _quant(bits):
    return lambda x, nb, t, s: [(x, t * nb * QK * 4), (s, t * nb * XQ_BYTES[bits])]


def _attn(a, pool, table, ctx, nq, bs, nkv, group, hd, out, scores):
    """attn_scores (a = q, out the scores) or attn_values (a = the probabilities, out (nq, heads, hd))."""
    nh, pool_bytes = nkv * group, _table_blocks(table, ctx, bs) * bs * nkv * hd * 4
    a_floats, out_floats = (nq * nh * hd, nq * nh * ctx) if scores else (nq * nh * ctx, nq * nh * hd)
    return [(a, a_floats * 4), (pool, pool_bytes), (table, -(-ctx // bs) * 4), (out, out_floats * 4)]


def _attn_decode(qkv, cos, sin, k, v, table, ctx, lo, bs, nkv, group, hd, slot, scale, s, ld, out):
    nh = nkv * group
    pool = max(_table_blocks(table, ctx, bs), slot // bs + 1) * bs * nkv * hd * 4
    return [(qkv, (nh + 2 * nkv) * hd * 4), (cos, hd // 2 * 4), (sin, hd // 2 * 4), (k, pool), (v, pool),
            (table, -(-ctx // bs) * 4), (s, nh * ld * 4), (out, nh * hd * 4)]


def _attn_prefill(q, k, v, table, ctx, nq, bs, nkv, group, hd, window, scale, s, out):
    nh, pool = nkv * group, _table_blocks(table, ctx, bs) * bs * nkv * hd * 4
    return [(q, nq * nh * hd * 4), (k, pool), (v, pool), (table, -(-ctx // bs) * 4), (s, nh * ((ctx + 3) & ~3) * 4),
            (out, nq * nh * hd * 4)]


# export -> (argument indices that are pointers, their regions [(address, bytes)] from the call's arguments)
FOOTPRINTS = {
    "matmul": ((1, 2, 5, 7, 9), _matmul),
    "quant_x": ((0, 3), _quant(16)),
    "quant_x8": ((0, 3), _quant(8)),
    "attn_scores": ((0, 1, 2, 9), lambda *a: _attn(*a, scores=True)),
    "attn_values": ((0, 1, 2, 9), lambda *a: _attn(*a, scores=False)),
    "attn_decode": ((0, 1, 2, 3, 4, 5, 14, 16), _attn_decode),
    "attn_prefill": ((0, 1, 2, 3, 12, 13), _attn_prefill),
    "rms_norm": ((0, 1, 4), lambda x, w, n, eps, out: [(x, n * 4), (w, n * 4), (out, n * 4)]),
    "add_rms_norm": ((0, 1, 2, 5), lambda x, y, w, n, eps, out: [(x, n * 4), (y, n * 4), (w, n * 4), (out, n * 4)]),
    "silu_mul": ((0, 1, 3), lambda g, u, n, out: [(g, n * 4), (u, n * 4), (out, n * 4)]),
    "gelu_tanh_mul": ((0, 1, 3), lambda g, u, n, out: [(g, n * 4), (u, n * 4), (out, n * 4)]),
    "silu_mul_rows": ((0, 3), lambda gu, n, rows, out: [(gu, 2 * n * rows * 4), (out, n * rows * 4)]),
    "gelu_tanh_mul_rows": ((0, 3), lambda gu, n, rows, out: [(gu, 2 * n * rows * 4), (out, n * rows * 4)]),
    "rms_norm_rows": ((0, 1, 5), lambda x, w, n, rows, eps, out: [(x, n * rows * 4), (w, n * 4),
                                                                 (out, n * rows * 4)]),
}


def spans(regions: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching [address, address + bytes) regions merged: [(start, end)] in address order."""
    merged: list[list[int]] = []
    for start, end in sorted((a, a + n) for a, n in regions if n > 0):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


class WasmKernels:
    """One instance of a built module (`name`: linear_relaxed, the tab's where relaxed SIMD validates, or linear)
    on a memory of its own, its exports as attributes taking host addresses (see the module docstring).
    `calls` counts the calls per export."""

    def __init__(self, name: str = "linear_relaxed", relaxed: bool = True, pages: int = 64) -> None:
        self.store = wasmtime.Store(engine(relaxed))
        self.memory = wasmtime.Memory(self.store, wasmtime.MemoryType(wasmtime.Limits(pages, None)))
        self.instance = wasmtime.Instance(self.store, wasmtime.Module(self.store.engine, modules()[name]),
                                          [self.memory])
        self.exports = self.instance.exports(self.store)
        self.calls: dict[str, int] = {}

    def heap(self) -> np.ndarray:
        """The whole memory as bytes (its base moves if it grows: take it again after a call)."""
        base = ctypes.addressof(self.memory.data_ptr(self.store).contents)
        return array_at(base, ctypes.c_uint8, self.memory.data_len(self.store))

    def __getattr__(self, name: str):
        if name not in FOOTPRINTS:
            raise AttributeError(name)
        pointers, footprint = FOOTPRINTS[name]
        func = self.exports[name]

        def call(*args):
            regions = footprint(*args)  # [(address, bytes)], one for each of `pointers`, in order
            placed, top = [], ALIGN  # offset 0 left unused: no region at a null pointer
            for start, end in spans(regions):
                top = -(-top // ALIGN) * ALIGN
                placed.append((start, end, top))
                top += end - start
            if top + PAGE > self.memory.data_len(self.store):
                self.memory.grow(self.store, -(-(top + PAGE - self.memory.data_len(self.store)) // PAGE))
            heap = self.heap()
            heap[:top + PAGE] = 0xFF  # past the regions too: a read past the last one sees NaN
            for start, end, at in placed:
                heap[at:at + end - start] = array_at(start, ctypes.c_uint8, end - start)
            offsets = list(args)
            for i, (address, n) in zip(pointers, regions):
                if n:  # a pointer to nothing the export reads (t = 0) stays unused
                    start, _, at = next(p for p in placed if p[0] <= address < p[1])
                    offsets[i] = at + address - start
                else:
                    offsets[i] = 0
            self.calls[name] = self.calls.get(name, 0) + 1
            func(self.store, *offsets)
            heap = self.heap()
            for start, end, at in placed:
                array_at(start, ctypes.c_uint8, end - start)[...] = heap[at:at + end - start]

        return call


class WasmThreads:
    """web/linear_threads.js's object (cpu_wasm.SharedStore's `js`) on wasmtime: the weights placed once in one
    SharedMemory (linear_relaxed_shared, as the tab's threads share theirs), and each product run as the JS runs
    it: x copied in, integer activations quantized once for every thread (kind | QUANTIZED_X), the weight's rows
    cut into cpu_wasm.chunks that `threads` threads (this one and helpers, an instance and store each) claim one
    at a time, out copied back. wasmtime's calls release the GIL, so the threads run at once. `products` logs
    (rows, cols, t, threads used, chunks each thread ran) per product."""

    def __init__(self, threads: int = 2, min_work: int = 1 << 16) -> None:
        self.threads, self.min_work = threads, min_work
        full = engine()
        self.memory = SharedMemory(full, wasmtime.MemoryType(wasmtime.Limits(16, 65536), shared=True))
        module = wasmtime.Module(full, modules()["linear_relaxed_shared"])
        self.instances = []
        for _ in range(threads):
            store = wasmtime.Store(full)
            self.instances.append((store, wasmtime.Instance(store, module, [self.memory]).exports(store)))
        self.top, self.sizes, self.io, self.attn_area, self.decode_area = PAGE, {}, (0, 0), (0, 0), (0, 0)
        self.products: list[tuple[int, int, int, int, list[int]]] = []
        self.attention: list[tuple[int, list[int]]] = []
        self.mirrors: list[tuple[int, int, int]] = []  # (host address, bytes, offset here): mirror
        # attn_decode: (ctx, chunks of blocks each thread ran, chunks of dims each thread ran)
        self.decodes: list[tuple[int, list[int], list[int]]] = []

    def heap(self) -> np.ndarray:
        """The shared memory as bytes (a shared memory never moves when it grows)."""
        return array_at(ctypes.addressof(self.memory.data_ptr().contents), ctypes.c_uint8, self.memory.data_len())

    def alloc(self, nbytes: int) -> int:
        """A bump allocation, 64-byte aligned (freed blocks are not reused: a test's weights are placed once)."""
        at, self.top = self.top, self.top + -(-max(nbytes, 1) // 64) * 64
        if self.top > self.memory.data_len():
            self.memory.grow(-(-(self.top - self.memory.data_len()) // PAGE))
        self.sizes[at] = nbytes
        return at

    def place(self, address: int, nbytes: int) -> int:
        at = self.alloc(nbytes)
        self.heap()[at:at + nbytes] = array_at(address, ctypes.c_uint8, nbytes)
        return at

    def free(self, at: int) -> None:
        del self.sizes[at]

    def read(self, at: int, nbytes: int, dest: int) -> None:
        array_at(dest, ctypes.c_uint8, nbytes)[...] = self.heap()[at:at + nbytes]

    def mirror(self, address: int, nbytes: int) -> int:
        """linear_threads.js's mirror: zeros here for the host's [address, address + nbytes), made once."""
        for host, n, at in self.mirrors:
            if (host, n) == (address, nbytes):
                return at
            if address < host + n and host < address + nbytes:
                raise ValueError(f"a KV mirror of {nbytes} bytes at {address} overlaps one made before")
        at = self.alloc(nbytes)  # past everything placed before: memory grown now, zeros
        self.mirrors.append((address, nbytes, at))
        return at

    def unmirror(self, address: int) -> None:
        self.mirrors = [m for m in self.mirrors if m[0] != address]

    def mirror_of(self, address: int) -> int:
        return next((at + address - host for host, n, at in self.mirrors if host <= address < host + n), -1)

    def sync(self, runs: int, n: int) -> None:
        """linear_threads.js's sync: n (address, bytes) f64 pairs at host address `runs` copied into their mirror."""
        heap = self.heap()
        for address, nbytes in array_at(runs, ctypes.c_double, 2 * n).reshape(n, 2).astype(np.int64).tolist():
            at = self.mirror_of(address)
            if at < 0 or self.mirror_of(address + nbytes - 1) != at + nbytes - 1:
                raise ValueError(f"KV sync: bytes {address} .. {address + nbytes} are not in one mirror")
            heap[at:at + nbytes] = array_at(address, ctypes.c_uint8, nbytes)

    def mirror_differs(self, arrays) -> list[int]:
        """The indices of `arrays` (pools) whose bytes differ from their mirror's (a test's check that every write
        reached it)."""
        heap, bad = self.heap(), []
        for i, a in enumerate(arrays):
            at = self.mirror_of(a.__array_interface__["data"][0])
            blocks = [heap[at + b * a.strides[0]:at + b * a.strides[0] + a[0].nbytes] for b in range(a.shape[0])]
            held = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
            if at < 0 or not np.array_equal(np.concatenate(blocks), held):
                bad.append(i)
        return bad

    def attn_decode(self, qkv: int, cos: int, sin: int, k: int, v: int, table: int, ctx: int, lo: int, bs: int,
                    nkv: int, group: int, hd: int, slot: int, scale: float, s: int, ld: int, out: int) -> None:
        """linear_threads.js's attn_decode: q | k | v, cos, sin and the table copied in, rope_kv on the mirrors
        (the new row then copied into the host's pools), the scores of chunks of the keys' blocks on the threads
        (attn_keys), the softmax of chunks of the heads on them (attn_softmax), the values of chunks of each head's
        dims on them (attn_dims), out copied back; below MIN_KEYS keys all on this thread. `decodes` logs (ctx,
        blocks' chunks each thread ran, dims' chunks each thread ran)."""
        k_at, v_at = self.mirror_of(k), self.mirror_of(v)
        if k_at < 0 or v_at < 0:
            raise ValueError("attn_decode on the kernel threads needs K and V pools with a mirror")
        heads, hb, used = nkv * group, hd * 4, -(-ctx // bs)
        tok = nkv * hb
        sizes = [-(-n // 64) * 64 for n in ((heads + 2 * nkv) * hb, hb // 2, hb // 2, used * 4, heads * ld * 4,
                                             heads * hb)]
        if sum(sizes) > self.decode_area[1]:  # reused, as the JS reuses its decodeArea
            self.decode_area = (self.alloc(sum(sizes)), sum(sizes))
        qkv_at, cos_at, sin_at, table_at, s_at, out_at = (self.decode_area[0] + sum(sizes[:i]) for i in range(6))
        heap = self.heap()
        for host, to, n in ((qkv, qkv_at, sizes[0]), (cos, cos_at, hb // 2), (sin, sin_at, hb // 2),
                            (table, table_at, used * 4)):
            heap[to:to + n] = array_at(host, ctypes.c_uint8, n)
        store, ex = self.instances[0]
        ex["rope_kv"](store, qkv_at, cos_at, sin_at, k_at, v_at, nkv, group, hd, slot)
        for host, mirror in ((k, k_at), (v, v_at)):
            array_at(host + slot * tok, ctypes.c_uint8, tok)[...] = heap[mirror + slot * tok:mirror + (slot + 1) * tok]
        n = self.threads if ctx >= MIN_KEYS else 1
        block_chunk, dim_chunk = -(-used // (n * CHUNKS_PER_THREAD)), -(-hb // 64 // n) * 64

        def keys(i: int, store, ex, b0: int, b1: int) -> None:
            ex["attn_keys"](store, qkv_at, k_at, table_at, ctx, bs, nkv, group, hd, s_at, ld, b0, b1)

        def dims(i: int, store, ex, d0: int, d1: int) -> None:
            ex["attn_dims"](store, s_at, v_at, table_at, ctx, bs, nkv, group, hd, out_at, ld, d0, d1)

        blocks = [(b0, min(used, b0 + block_chunk)) for b0 in range(0, used, block_chunk)] if n > 1 else [(0, used)]
        ran_keys = self.on_threads(n, blocks, keys)
        per = -(-heads // n)

        def softmax(i: int, store, ex, r0: int, r1: int) -> None:
            ex["attn_softmax"](store, s_at + r0 * ld * 4, r1 - r0, ctx, lo, ld, scale)

        self.on_threads(n, [(r0, min(heads, r0 + per)) for r0 in range(0, heads, per)], softmax)
        slices = [(d0, min(hb, d0 + dim_chunk)) for d0 in range(0, hb, dim_chunk)] if n > 1 else [(0, hb)]
        self.decodes.append((ctx, ran_keys, self.on_threads(n, slices, dims)))
        array_at(out, ctypes.c_uint8, heads * hb)[...] = self.heap()[out_at:out_at + heads * hb]

    def matmul(self, kind: int, qs: int, dm: int, rows: int, cols: int, x: int, t: int, out: int) -> None:
        n = self.threads if rows >= self.threads and rows * cols * t >= self.min_work else 1
        bits, nb = act_bits(kind), cols // QK
        scratch = 4 * scratch_floats(cols, t, kind)
        need = 4 * t * cols + 4 * t * rows + n * scratch
        if need > self.io[1]:
            self.io = (self.alloc(2 * need), 2 * need)
        x_at = self.io[0]
        out_at = x_at + 4 * t * cols
        scratch_at = out_at + 4 * t * rows
        self.heap()[x_at:x_at + 4 * t * cols] = array_at(x, ctypes.c_uint8, 4 * t * cols)
        stride = scratch
        if bits is not None:  # one quantized x that every thread reads
            if n > 1:
                store, ex = self.instances[0]
                ex["quant_x8" if bits == 8 else "quant_x"](store, x_at, nb, t, scratch_at)
                kind |= QUANTIZED_X
                if bits == 8:  # x: the blocks; each thread's scratch: its accumulators, past them
                    x_at, scratch_at, stride = scratch_at, scratch_at + t * nb * XQ_BYTES[8], 4 * ACC8_FLOATS
            if bits == 16 or n == 1:
                stride = 0
        row_q, row_d = row_steps(kind, nb)
        work = chunks(rows, n) if n > 1 else [(0, rows)]  # one thread: the whole weight in one call

        def product(i: int, store, ex, r0: int, r1: int) -> None:
            ex["matmul"](store, kind, qs + r0 * row_q, dm + r0 * row_d, r1 - r0, cols, x_at, t,
                         out_at + 4 * r0, rows, scratch_at + i * stride)

        ran = self.on_threads(n, work, product)
        self.products.append((rows, cols, t, n, ran))
        array_at(out, ctypes.c_uint8, 4 * t * rows)[...] = self.heap()[out_at:out_at + 4 * t * rows]

    def on_threads(self, n: int, work: list, run) -> list[int]:
        """run(i, store, exports, *item) for every item of `work`, claimed one at a time by threads 0 .. n - 1 (this
        one and helpers) in order; how many each ran."""
        items, lock, ran, errors = iter(work), threading.Lock(), [0] * n, []

        def claim(i: int) -> None:
            store, ex = self.instances[i]
            try:
                while True:
                    with lock:
                        item = next(items, None)
                    if item is None:
                        return
                    run(i, store, ex, *item)
                    ran[i] += 1
            except Exception as exc:  # noqa: BLE001  (raised below, on the caller's thread)
                errors.append(exc)

        helpers = [threading.Thread(target=claim, args=(i,)) for i in range(1, n)]
        for h in helpers:
            h.start()
        claim(0)
        for h in helpers:
            h.join()
        if errors:
            raise errors[0]
        return ran

    def attn_prefill(self, q: int, k: int, v: int, table: int, ctx: int, nq: int, bs: int, nkv: int, group: int,
                     hd: int, window: int, scale: float, out: int) -> None:
        """linear_threads.js's attn_prefill: q and the table's K and V blocks copied in (the table then 0, 1, ...),
        chunks of queries from the last (cpu_wasm.CHUNKS_PER_THREAD per thread), each the last queries of a shorter
        context through the export, a score row area per thread, out copied back. `attention` logs (nq, chunks
        each thread ran)."""
        n, row, block = self.threads, nkv * group * hd * 4, bs * nkv * hd * 4
        used = -(-ctx // bs)
        s_bytes = -(-nkv * group * ((ctx + 3) & ~3) // 16) * 64
        need = 2 * nq * row + 2 * used * block + 4 * used + 64 + n * s_bytes
        if need > self.attn_area[1]:  # reused, as the JS reuses its attnArea
            self.attn_area = (self.alloc(need), need)
        at = self.attn_area[0]
        q_at, out_at = at, at + nq * row
        k_at, v_at = out_at + nq * row, out_at + nq * row + used * block
        table_at = v_at + used * block
        s_at = -(-(table_at + 4 * used) // 64) * 64
        heap = self.heap()
        heap[q_at:q_at + nq * row] = array_at(q, ctypes.c_uint8, nq * row)
        ids = array_at(table, ctypes.c_int32, used)
        if self.mirror_of(k) >= 0 and self.mirror_of(v) >= 0:  # the blocks read where they are: the mirrors
            k_at, v_at = self.mirror_of(k), self.mirror_of(v)
            heap[table_at:table_at + 4 * used] = ids.view(np.uint8)
        else:  # copies of the blocks, the table then 0, 1, ...
            for b, block_id in enumerate(ids.tolist()):
                for pool, to in ((k, k_at), (v, v_at)):
                    heap[to + b * block:to + (b + 1) * block] = array_at(pool + block_id * block, ctypes.c_uint8,
                                                                         block)
            heap[table_at:table_at + 4 * used] = np.arange(used, dtype=np.int32).view(np.uint8)
        chunk = -(-nq // (n * CHUNKS_PER_THREAD))
        work = [(max(0, i1 - chunk), i1) for i1 in range(nq, 0, -chunk)]

        def queries(i: int, store, ex, i0: int, i1: int) -> None:
            ex["attn_prefill"](store, q_at + i0 * row, k_at, v_at, table_at, ctx - nq + i1, i1 - i0, bs, nkv, group,
                               hd, window, scale, s_at + i * s_bytes, out_at + i0 * row)

        self.attention.append((nq, self.on_threads(n, work, queries)))
        array_at(out, ctypes.c_uint8, nq * row)[...] = self.heap()[out_at:out_at + nq * row]
