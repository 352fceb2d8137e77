"""Attention through the wasm kernel (web/wasm/linear.wat: attn_scores, attn_values): the tab's CPU path.

A lone sequence's decode step runs its whole layer loop through the kernels on fixed buffers
(WasmAttentionModel.forward), each layer as its family declares it (model/family.py: the Layer the step reads,
STEP_OPS the ops it computes): per layer its products (q | k | v and gate | up stacked where the weights are),
attn_decode (rope, a layer without rotary through cos 1 / sin 0, a window through its group's table from the
window's first block) and the glue (rms_norm_rows for per-head q / k norms, rms_norm for post norms,
add_rms_norm: the residual and the next norm, silu_mul or gelu_tanh_mul), no numpy between them; the reference's
order of operations, the sums of squares, e^x and tanh (as a sigmoid) aside. A batch of several tokens or
sequences, a quantized KV pool or the attention mass keep the reference's layer loop, with attn_decode for each
one-token attention, through its KV group's table and slot where the batch has groups.

NumpyModel (the oracle) gathers every cached key and value of a sequence through fancy indexing and runs
small batched matmuls, without BLAS in Pyodide, per layer and step. Here a sequence's one new token reads
the paged f32 pools in place through its block table: the kernel computes q . k for every cached key, numpy
the softmax exactly as the reference does (scale, causal mask, max, exp, sum), the kernel the
probability-weighted sum of the values. Prefill runs the same kernels over every new token at once (query i
reads the keys up to its own). Numerics: the two products sum in a different f32 order than numpy's matmul;
everything else is the reference's arithmetic.

With kernel threads (a SharedStore's) the pools get a mirror in the threads' memory when they are made
(mirror_kv), kept by every write, and a decode step's attention and a prompt's run on every thread over it.

The kernels are any object with the wasm exports' attributes attn_scores / attn_values (integers all,
pointers being addresses in the memory numpy's arrays live in): in the tab, the wasm instance's exports on
Pyodide's memory (browser/interop.py: wasm_attention); in CPython, PointerTwin (tests).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..model.weights import ModelWeights
from .cpu_tape import StepTape
from .cpu_wasm import STACKS, HeapStore, QuantWeight, address_of, array_at, scratch_floats
from ..kernels.ref_ops import gelu_tanh, rms_norm, rope_tables, rotate_adjacent, silu
from .numpy_ref import NumpyModel, block_mass


# The ops of a family's declaration (model/family.py OPS) the one-token step computes through the kernels
# (WasmAttentionModel.forward); a model that needs another keeps the reference's layer loop.
STEP_OPS = frozenset({"attention_bias", "qk_norm", "post_attention_norm", "post_ffn_norm", "silu", "gelu_tanh",
                      "embedding_scale", "sliding_window", "no_rope", "rope_per_layer", "q_width"})
ACTIVATION_EXPORTS = {"silu": "silu_mul", "gelu_tanh": "gelu_tanh_mul"}  # a Layer's activation -> its glue export
# A prompt chunk of this many queries or more takes its attention on the kernel threads (_kernel_threads): below
# it, copying the context's K and V into their memory costs about what the second thread saves.
THREADED_QUERIES = 4


@dataclass(frozen=True)
class StepLayer:
    """One decoder layer of the one-token step, as its family.Layer declares it: its products (q | k | v and
    gate | up as QuantWeights whose rows fill the buffer in turn: the stacked one, or each part where their layouts
    differ (Q4_K_M's q8_0 v beside q5_0 q and k with 8-bit activations); None where they go through the
    reference's _projections; o and down as the weights hold them), the addresses of its norms' gains (0: a norm
    the layer lacks), the next norm being the next layer's attn_norm or output_norm, its activation's export and
    q | k | v's biases (1, q + 2 kv) or None."""

    qkv: tuple[QuantWeight, ...] | None
    gate_up: tuple[QuantWeight, ...] | None
    o: object
    down: object
    attn_norm: int
    ffn_norm: int
    next_norm: int
    q_norm: int
    k_norm: int
    post_attention_norm: int
    post_ffn_norm: int
    activation: str
    bias: np.ndarray | None


class WasmAttentionModel(NumpyModel):
    """NumpyModel whose one-token attention runs through the kernels; scratch sized for the model's context."""

    def __init__(self, weights: ModelWeights, kernels) -> None:
        super().__init__(weights)
        cfg = self.config
        if cfg.head_dim % 16:
            raise ValueError(f"the wasm attention needs head_dim a multiple of 16, got {cfg.head_dim}")
        self.kernels = kernels
        # (n_heads, ctx) the kernel's q . k (attn_decode: its softmax, rows ctx rounded up to 4 apart)
        self._scores = np.empty(cfg.n_heads * (cfg.context_length + 3), np.float32)
        self._probs = np.empty(cfg.n_heads * cfg.context_length, np.float32)  # (n_heads, ctx) the softmax
        self._q = np.empty((cfg.n_heads, cfg.head_dim), np.float32)  # (n_heads, head_dim)
        self._out = np.empty((cfg.n_heads, cfg.head_dim), np.float32)  # (n_heads, head_dim)
        self._qkv = np.empty((1, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim), np.float32)  # attn_decode's
        # the one-token step's buffers: the residual x, the normed h, a product's output y, gate | up, silu * up
        self._x, self._h, self._y = (np.empty((1, cfg.hidden), np.float32) for _ in range(3))
        self._gu = np.empty((1, 2 * cfg.ffn), np.float32)
        self._act = np.empty((1, cfg.ffn), np.float32)
        self._addrs = {name: address_of(getattr(self, name)) for name in (
            "_scores", "_probs", "_q", "_out", "_qkv", "_x", "_h", "_y", "_gu", "_act")}
        # (head_dim/2,) cos 1 and sin 0: attn_decode's rotation of a layer without rotary leaves q and k as they are
        # (x0 * 1 - x1 * 0 = x0, x0 * 0 + x1 * 1 = x1 exactly), so every layer's one-token attention is one call
        self._no_rotation = (np.ones(cfg.head_dim // 2, np.float32), np.zeros(cfg.head_dim // 2, np.float32))
        self._layers = self._step_layers()
        self._pools: dict[int, tuple[np.ndarray, int]] = {}  # id(pool) -> (pool, address): pools live on
        self._batch, self._tables = None, {}  # the step whose tables these are, and their entries (_step)
        # the one-token step's tape (cpu_tape.py), the KV cache and grouping it was made for, a layer of each of
        # its attention kinds, the store its products run in
        self._tape, self._tape_for, self._tape_keys, self._store = None, (None, False), {}, None
        self._threads = self._kernel_threads()
        self._mirrored = None  # the KV cache whose pools the kernel threads mirror (mirror_kv)
        self.mirror_error: str | None = None  # why mirror_kv made none, where it tried

    def _kernel_threads(self):
        """The kernel threads a prompt chunk's attention and, over the KV mirror, a decode step's run on
        (web/linear_threads.js attn_prefill, attn_decode: those of the SharedStore holding the projections), or
        None: the exports on one thread (a HeapStore, one thread, a twin without attn_prefill)."""
        store = next((w.store for w in self.w.values() if isinstance(w, QuantWeight)), None)
        js = getattr(store, "tape_threads", None)
        return js if js is not None and int(js.threads) > 1 and hasattr(js, "attn_prefill") else None

    def mirror_kv(self, kv) -> None:
        """Gives the kernel threads a mirror of kv's f32 pools in their memory (linear_threads.js mirror: the
        arrays the pools are, or the pages they view, each once however many models view them), so that a decode
        step's attention runs on every thread (attn_decode_threads) and a prompt's reads the blocks in place. Called
        when kv is made, zeros like a new mirror (CpuBackend): from then on every write to its pools is copied
        into the mirror (kv_rows_written, kv_blocks_written; the threads' attn_decode writes both). No mirror
        without threads, or for pools of another dtype; none either where the threads' memory cannot grow by the
        pools' bytes (mirror_error says why; the attention stays on one thread, as without threads)."""
        js = self._threads
        if js is None or not hasattr(js, "mirror") or kv.kv_dtype != "f32":
            return
        owners = {}
        for pool in (*kv.k, *kv.v):
            self._pool_addr(pool)  # f32, contiguous blocks a whole number apart: ValueError otherwise
            while isinstance(pool.base, np.ndarray):
                pool = pool.base
            owners[address_of(pool)] = pool
        made = []
        try:
            for address, owner in owners.items():
                mirror(js, owner)
                made.append(address)
        except Exception as exc:  # noqa: BLE001  (a JS RangeError in the tab: the shared memory at its maximum)
            for address in made:
                js.unmirror(address)
            total = sum(o.nbytes for o in owners.values())
            self.mirror_error = f"no KV mirror for the kernel threads ({total:,} B): {exc}"
            return
        self._mirrored = kv

    def kv_rows_written(self, kv, pool: int, where: tuple[np.ndarray, np.ndarray]) -> None:
        """The rows the forward wrote into pool `pool`, K and V, copied into the threads' mirror: runs of
        consecutive rows in one copy each."""
        if kv is not self._mirrored:
            return
        blocks, offsets = (np.asarray(a, np.int64).reshape(-1) for a in where)
        runs = []
        for arr in (kv.k[pool], kv.v[pool]):
            row = arr[0, 0].nbytes
            at = address_of(arr) + blocks * arr.strides[0] + offsets * row  # (T,) each row's address
            start = np.flatnonzero(np.r_[True, at[1:] != at[:-1] + row])  # where a run of rows begins
            lens = np.diff(np.r_[start, at.size]) * row
            runs.append(np.stack([at[start], lens], axis=1))
        self._sync(np.concatenate(runs))

    def kv_blocks_written(self, kv, blocks) -> None:
        """Whole blocks of every pool, copied into the threads' mirror."""
        if kv is not self._mirrored:
            return
        ids = np.asarray(list(blocks), np.int64)
        if ids.size:  # (pools * n, 2): each pool's blocks
            self._sync(np.concatenate([np.stack([address_of(a) + ids * a.strides[0],
                                                 np.full(ids.size, a[0].nbytes)], axis=1) for a in (*kv.k, *kv.v)]))

    def _sync(self, runs: np.ndarray) -> None:
        runs = np.ascontiguousarray(runs, np.float64)  # (n, 2) address, bytes
        self._threads.sync(address_of(runs), runs.shape[0])

    def _step_layers(self) -> list[StepLayer] | None:
        """Each layer's part of the one-token step (StepLayer), read from the family's declaration (its Layer per
        decoder layer); None when the model needs an op beyond STEP_OPS, a width is not a multiple of 4 or the
        kernels lack an export the layers name (their glue)."""
        cfg, w = self.config, self.w
        glue = {"rms_norm", "add_rms_norm", *(ACTIVATION_EXPORTS[spec.activation] for spec in self.layers)}
        if any(spec.qk_norm for spec in self.layers):
            glue.add("rms_norm_rows")
        if (not cfg.family.ops(cfg) <= STEP_OPS or cfg.hidden % 4 or cfg.ffn % 4
                or not all(hasattr(self.kernels, name) for name in glue)):
            return None

        def at(name: str) -> int:  # a norm's gain, held f32 and contiguous so that its address stays
            w[name] = np.ascontiguousarray(w[name], np.float32)
            return address_of(w[name])

        def stacked(layer: int, name: str) -> tuple[QuantWeight, ...] | None:  # None: the reference's _projections
            both = w.get(f"blk.{layer}.{name}.weight")
            if isinstance(both, QuantWeight):
                return (both,)
            parts = tuple(w.get(f"blk.{layer}.{n}.weight") for n in STACKS[name])
            if all(isinstance(p, QuantWeight) for p in parts) and len({id(p.store) for p in parts}) == 1:
                return parts
            return None

        layers = []
        for i, spec in enumerate(self.layers):
            nxt = f"blk.{i + 1}.attn_norm.weight" if i + 1 < cfg.n_layers else "output_norm.weight"
            bias = None
            if spec.attention_bias:  # q | k | v's biases in one row, added as the reference adds each
                bias = np.concatenate([w[f"blk.{i}.{n}.bias"] for n in ("attn_q", "attn_k", "attn_v")])[None]
            layers.append(StepLayer(
                qkv=stacked(i, "attn_qkv"), gate_up=stacked(i, "ffn_gate_up"),
                o=w[f"blk.{i}.attn_output.weight"], down=w[f"blk.{i}.ffn_down.weight"],
                attn_norm=at(f"blk.{i}.attn_norm.weight"), ffn_norm=at(f"blk.{i}.ffn_norm.weight"), next_norm=at(nxt),
                q_norm=at(f"blk.{i}.attn_q_norm.weight") if spec.qk_norm else 0,
                k_norm=at(f"blk.{i}.attn_k_norm.weight") if spec.qk_norm else 0,
                post_attention_norm=at(f"blk.{i}.post_attention_norm.weight") if spec.post_attention_norm else 0,
                post_ffn_norm=at(f"blk.{i}.post_ffw_norm.weight") if spec.post_ffn_norm else 0,
                activation=ACTIVATION_EXPORTS[spec.activation], bias=bias))
        return layers

    def forward(self, batch, kv, all_logits: bool = False, attention_mass: np.ndarray | None = None) -> np.ndarray:
        """NumpyModel.forward; one token of one sequence on f32 pools without the mass runs its layers through
        the kernels on the fixed buffers (the module docstring), each layer as its family declares it."""
        if (self._layers is None or batch.token_ids.shape[0] != 1 or attention_mass is not None
                or kv.kv_dtype != "f32"):
            return super().forward(batch, kv, all_logits, attention_mass)
        cfg = self.config
        batch.check_fits(vocab=cfg.vocab, context_length=cfg.context_length, num_blocks=kv.num_blocks,
                         block_size=kv.block_size)
        self._x[...] = self.w["token_embd.weight"][batch.token_ids]
        if cfg.embedding_scale != 1.0:
            self._x *= np.float32(cfg.embedding_scale)  # the reference's f32 product
        tape = self._step_tape(batch, kv)
        for key, layer in self._tape_keys.items():  # the attention's arguments that move with the step
            tape.set(key, self._attention_moving(layer, batch, kv)[2])
        tape.run(self.kernels, self._store)
        return self._h @ self.w["token_embd.weight" if cfg.tied_embeddings else "output.weight"].T  # (1, vocab)

    def _step_tape(self, batch, kv) -> StepTape:
        """The one-token step's kernel calls (cpu_tape.py), made once per KV cache (its pools' addresses are the
        tape's): embedding in _x, per layer its products (q | k | v and gate | up stacked), q / k norms per head,
        attn_decode, post norms, the residual sums with the next norm (add_rms_norm), the activation; _h then
        holds the output norm's. Python between two calls (a bias, a product of a weight held f32) is a CALL."""
        grouped = batch.group_block_tables is not None
        if self._tape is not None and self._tape_for[0] is kv and self._tape_for[1] == grouped:
            return self._tape
        cfg, a = self.config, self._addrs
        hidden, ffn, hd, eps = cfg.hidden, cfg.ffn, cfg.head_dim, float(cfg.rms_eps)
        q_bytes = 4 * cfg.q_dim  # k's heads follow q's in _qkv
        quant = [w for s in self._layers for w in (*(s.qkv or ()), *(s.gate_up or ()), s.o, s.down)
                 if isinstance(w, QuantWeight)]
        self._store = quant[0].store if quant else HeapStore(None)
        scratch = max((scratch_floats(w.shape[1], 1, w.kernel_args[0]) for w in quant), default=1)
        self._tape_scratch = np.empty(scratch, np.float32)  # (scratch,) the products' on one thread
        tape, keys = StepTape(), {}

        def product(w, x: str, out: str, at: int = 0) -> None:  # w's rows from row `at` of out
            if isinstance(w, QuantWeight) and w.store is self._store:
                tape.op("matmul", *w.kernel_args, a[x], a[out] + 4 * at, address_of(self._tape_scratch))
            elif isinstance(w, QuantWeight):
                tape.call(lambda: w.run1(a[x], a[out] + 4 * at))
            else:
                tape.call(lambda: self._run1(w, x, out))

        def parts(ws: tuple[QuantWeight, ...], x: str, out: str) -> None:  # their rows one after another in out
            at = 0
            for w in ws:
                product(w, x, out, at)
                at += w.shape[0]

        def stacked(layer: int, both: str, names: tuple[str, ...], out: np.ndarray) -> None:
            tape.call(lambda: np.concatenate(self._projections(layer, both, names, self._h, False), axis=1, out=out))

        tape.op("rms_norm", a["_x"], self._layers[0].attn_norm, hidden, eps, a["_h"])
        for layer, s in enumerate(self._layers):
            if s.qkv is not None:
                parts(s.qkv, "_h", "_qkv")
            else:
                stacked(layer, "attn_qkv", ("attn_q", "attn_k", "attn_v"), self._qkv)
            if s.bias is not None:
                tape.call(lambda bias=s.bias: np.add(self._qkv, bias, out=self._qkv))
            if s.q_norm:  # per head, before rotary (attn_decode rotates)
                tape.op("rms_norm_rows", a["_qkv"], s.q_norm, hd, cfg.n_heads, eps, a["_qkv"])
                tape.op("rms_norm_rows", a["_qkv"] + q_bytes, s.k_norm, hd, cfg.n_kv_heads, eps, a["_qkv"] + q_bytes)
            key, args = self._decode_args(layer, batch, kv)  # its moving ones rewritten each step (forward)
            keys.setdefault(key, layer)
            tape.op("attn_decode_threads" if kv is self._mirrored else "attn_decode", *args, key=key)
            product(s.o, "_out", "_y")
            if s.post_attention_norm:
                tape.op("rms_norm", a["_y"], s.post_attention_norm, hidden, eps, a["_y"])
            tape.op("add_rms_norm", a["_x"], a["_y"], s.ffn_norm, hidden, eps, a["_h"])  # x += attention; h = norm(x)
            if s.gate_up is not None:
                parts(s.gate_up, "_h", "_gu")
            else:
                stacked(layer, "ffn_gate_up", ("ffn_gate", "ffn_up"), self._gu)
            tape.op(s.activation, a["_gu"], a["_gu"] + 4 * ffn, ffn, a["_act"])
            product(s.down, "_act", "_y")
            if s.post_ffn_norm:
                tape.op("rms_norm", a["_y"], s.post_ffn_norm, hidden, eps, a["_y"])
            tape.op("add_rms_norm", a["_x"], a["_y"], s.next_norm, hidden, eps, a["_h"])  # x += mlp; the next norm
        self._tape, self._tape_for, self._tape_keys = tape.finish(), (kv, grouped), keys
        return tape

    def _mlp(self, layer: int, h: np.ndarray) -> np.ndarray:
        """The reference's MLP with its activation through the one-token step's glue on every row of the stacked
        gate | up product in one call (silu_mul_rows, gelu_tanh_mul_rows: numpy's e^x on a prompt's (T, ffn) gates
        cost SmolLM2's 512-token prefill ~0.17 s of 2.6 in Pyodide); the reference's own where the weights are not
        stacked."""
        w, ffn = self.w.get(f"blk.{layer}.ffn_gate_up.weight"), self.config.ffn
        glue = getattr(self.kernels, ACTIVATION_EXPORTS.get(self.layers[layer].activation, "") + "_rows", None)
        if glue is None or getattr(w, "parts", None) != (ffn, ffn) or h.shape[0] == 1:
            return super()._mlp(layer, h)
        gu = np.ascontiguousarray(h @ w.T, np.float32)  # (T, 2 * ffn): gate | up a row
        act = np.empty((gu.shape[0], ffn), np.float32)  # (T, ffn)
        glue(address_of(gu), ffn, gu.shape[0], address_of(act))
        return act @ self.w[f"blk.{layer}.ffn_down.weight"].T  # (T, hidden)

    def _run1(self, w, x: str, out: str) -> None:
        """One token's product of weight w from fixed buffer x into out: the kernel at their addresses for a
        QuantWeight, numpy's for a weight held f32 (an f16 file's)."""
        if isinstance(w, QuantWeight):
            w.run1(self._addrs[x], self._addrs[out])
        else:
            getattr(self, out)[...] = getattr(self, x).reshape(1, -1) @ w.T

    def _step(self, batch) -> dict:
        """What every layer of one step shares, made at its first layer (in Pyodide each numpy call costs
        microseconds, 30 layers over): the rotations' cos and sin of each layer kind's frequencies (_rope_tables),
        the new tokens' slots, each sequence's block-table rows for the kernels, attn_decode's arguments."""
        if self._batch is not batch:
            self._batch, self._tables = batch, {}
        return self._tables

    def _attention(self, layer: int, h: np.ndarray, batch, kv, mass) -> np.ndarray:
        """A one-token step on f32 pools without the attention mass: q | k | v into one buffer (q and k normed per
        head there where the layer says so, as the reference does before rotary), then the kernel's attn_decode
        (rope, the KV write, q . k, softmax, p @ v in one call); else the reference's steps."""
        if h.shape[0] != 1 or mass is not None or kv.kv_dtype != "f32":
            return super()._attention(layer, h, batch, kv, mass)
        cfg, spec = self.config, self.layers[layer]
        ys = self._projections(layer, "attn_qkv", ("attn_q", "attn_k", "attn_v"), h, spec.attention_bias)
        np.concatenate(ys, axis=1, out=self._qkv)
        if spec.qk_norm:
            q_end, k_end = cfg.n_heads * cfg.head_dim, (cfg.n_heads + cfg.n_kv_heads) * cfg.head_dim
            q, k = (self._qkv[0, a:b].reshape(-1, cfg.head_dim) for a, b in ((0, q_end), (q_end, k_end)))
            q[...] = self._norm(layer, "attn_q_norm", q)
            k[...] = self._norm(layer, "attn_k_norm", k)
        self._decode_attention(layer, batch, kv)
        return self._out.reshape(1, -1) @ self.w[f"blk.{layer}.attn_output.weight"].T  # (1, hidden)

    def _decode_attention(self, layer: int, batch, kv) -> None:
        """attn_decode of the one new token whose q | k | v are in self._qkv, into self._out (the layer loop's
        one-token attention; the one-token step's tape makes the same call)."""
        args = self._decode_args(layer, batch, kv)[1]
        (self._threads if kv is self._mirrored else self.kernels).attn_decode(*args)

    def _decode_args(self, layer: int, batch, kv) -> tuple[tuple, tuple]:
        """(the layer's attention kind, attn_decode's 17 arguments for the one new token whose q | k | v are in
        self._qkv, into self._out): the layer's pools, scale and buffers around the step's moving arguments."""
        key, pool, moving = self._attention_moving(layer, batch, kv)
        cfg, a = self.config, self._addrs
        k_addr, v_addr = self._pool_addrs(kv, pool)
        cos, sin, table, seen, lo, slot, ld = moving
        return key, (a["_qkv"], cos, sin, k_addr, v_addr, table, seen, lo, kv.block_size, cfg.n_kv_heads,
                     cfg.q_per_kv, cfg.head_dim, slot, key[3], a["_scores"], ld, a["_out"])

    def _attention_moving(self, layer: int, batch, kv) -> tuple[tuple, int, tuple]:
        """(the layer's attention kind, its pool, attn_decode's arguments that move with the step: cos, sin,
        table, ctx, lo, slot, ld (cpu_tape.ATTN_STEP_ARGS)) for the one new token. The kind (KV group, window,
        rotary, scale) decides the moving arguments, made at its first layer of a step (the table's rows, the new
        token's pool row, the rotations' addresses; ~10 us a layer in Pyodide otherwise). A window layer's table
        starts at the block of the window's first key, the keys before it in that block masked (lo): the window
        group's entries before it hold the null block."""
        t, spec = self._step(batch), self.layers[layer]
        group, pool = (0, layer) if batch.group_block_tables is None else self.kv_groups.where(layer)
        k_blocks, v_blocks = kv.k[pool], kv.v[pool]
        inv, window, scale = self.inv_freqs[layer], spec.attention.window, float(np.float32(spec.attention.scale))
        key = (group, window, id(inv), scale)  # what the moving arguments depend on
        moving = t.get(("decode", key))
        if moving is None or moving[0] != k_blocks.shape or moving[1] != k_blocks.strides:
            ctx, bs = int(batch.context_lens[0]), kv.block_size
            tables, slots = batch.tables_of(group)
            lo = first_seen(ctx, 1, window)
            first = lo // bs
            seen = ctx - first * bs  # keys from the table's first block on
            _, _, step, geometry = self._geometry(tables[0][first:], seen, 1, k_blocks, v_blocks)
            slot = int(slots[0])  # its pool row: a page's blocks `step` apart
            cos, sin = self._no_rotation if inv is None else self._rope_tables(batch, inv)
            moving = t[("decode", key)] = (k_blocks.shape, k_blocks.strides, (
                address_of(cos), address_of(sin), geometry[0], seen, lo - first * bs,
                (slot // bs) * step * bs + slot % bs, (seen + 3) & ~3))
        return key, pool, moving[2]

    def _pool_addrs(self, kv, pool: int) -> tuple[int, int]:
        """The K and V pools' addresses of slot `pool` (they step over blocks alike)."""
        k_addr, k_step = self._pool_addr(kv.k[pool])
        v_addr, v_step = self._pool_addr(kv.v[pool])
        if k_step != v_step:
            raise ValueError(f"K and V pools step over blocks differently ({k_step} vs {v_step})")
        return k_addr, v_addr

    def _rope(self, layer: int, q: np.ndarray, k: np.ndarray, batch) -> tuple[np.ndarray, np.ndarray]:
        """The reference's rope_adjacent (the same arithmetic) on the step's cos and sin of the layer's frequencies."""
        cos, sin = self._rope_tables(batch, self.inv_freqs[layer])
        return rotate_adjacent(q, cos, sin), rotate_adjacent(k, cos, sin)

    def _rope_tables(self, batch, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The step's cos and sin (T, 1, head_dim/2) of frequencies inv, made at their first use in the step."""
        t = self._step(batch)
        return t.get(("rope", id(inv))) or t.setdefault(("rope", id(inv)), rope_tables(batch.positions, inv))

    def _slots(self, batch, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        t = self._step(batch)
        if "slots" not in t:
            t["slots"] = super()._slots(batch, block_size)
        return t["slots"]

    def _pool_addr(self, pool: np.ndarray) -> tuple[int, int]:
        """The pool's address and how many blocks of it one row of the block table steps over: 1 for a
        C-contiguous pool; for a view of pages several models share (PagedKVCache.in_pages) a page's bytes over
        one block's, so the kernel's `address + id x block bytes` lands on the block in the page."""
        known = self._pools.get(id(pool))
        if known is None or known[0] is not pool:
            block_bytes = pool[0].nbytes
            if pool.dtype != np.float32 or not pool[0].flags.c_contiguous or pool.strides[0] % block_bytes:
                raise ValueError(f"the wasm attention reads f32 pools whose blocks are contiguous and a whole "
                                 f"number of blocks apart, got {pool.dtype} {pool.shape} strides {pool.strides}")
            known = self._pools[id(pool)] = (pool, pool.__array_interface__["data"][0], pool.strides[0] // block_bytes)
        return known[1], known[2]

    def _geometry(self, table: np.ndarray, ctx: int, nq: int, k_blocks: np.ndarray, v_blocks: np.ndarray) -> tuple:
        """(K pool address, V pool address, blocks a table row steps over, the kernels' (rows, ctx, nq, bs, nkv,
        group, hd)) of a sequence's table row: the same for every layer of a step, made at its first."""
        cfg, bs = self.config, k_blocks.shape[1]
        used = -(-ctx // bs)
        k_addr, step = self._pool_addr(k_blocks)
        v_addr, v_step = self._pool_addr(v_blocks)
        if v_step != step:
            raise ValueError(f"K and V pools step over blocks differently ({step} vs {v_step})")
        key = (table[:used].tobytes(), ctx, nq, step, k_blocks.shape[0])  # what the rows depend on
        known = self._tables.get(key)
        if known is None:
            if table.shape[0] < used or int(table[:used].min()) < 0 or int(table[:used].max()) >= k_blocks.shape[0]:
                raise ValueError(f"block table {table[:used].tolist()} does not cover {ctx} tokens in "
                                 f"{k_blocks.shape[0]} blocks of {bs}")
            rows = np.ascontiguousarray(table[:used] * step, np.int32)  # (used,) block ids the kernels read
            known = self._tables[key] = (rows, (address_of(rows), ctx, nq, bs, cfg.n_kv_heads, cfg.q_per_kv,
                                                cfg.head_dim))
        return k_addr, v_addr, step, known[1]

    def _sequence_attention(self, layer: int, q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray,
                            table: np.ndarray, ctx: int, mass: np.ndarray | None) -> np.ndarray:
        cfg, att = self.config, self.layers[layer].attention
        nq, nh, hd, bs = q.shape[0], cfg.n_heads, cfg.head_dim, k_blocks.shape[1]
        if mass is None:  # from the block of the first key any new query sees (a window group's entries before
            first = first_seen(ctx, nq, att.window) // bs  # it: the null block); the masks below are relative
            table, ctx = table[first:], ctx - first * bs
        k_addr, v_addr, _, geometry = self._geometry(table, ctx, nq, k_blocks, v_blocks)
        scale = np.float32(att.scale)
        if nq == 1:  # decode: fixed buffers (an address lookup costs as much as a small product in Pyodide)
            a = self._addrs
            self._q[...] = q[0]
            self.kernels.attn_scores(a["_q"], k_addr, *geometry, a["_scores"])
            # The reference's softmax of one query row: no key is in the future, so its causal mask is empty.
            s = self._scores[: nh * ctx].reshape(nh, ctx) * scale  # (n_heads, ctx)
            if att.window is not None and ctx > att.window:  # the keys before the window, as the reference masks
                s[:, :ctx - att.window] = -np.inf
            probs = self._probs[: nh * ctx].reshape(nh, ctx)  # (n_heads, ctx)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            np.divide(s, s.sum(axis=-1, keepdims=True), out=probs)
            if mass is not None:
                mass += block_mass(probs.sum(axis=0), bs, mass.shape[0])
            self.kernels.attn_values(a["_probs"], v_addr, *geometry, a["_out"])
            return self._out[None].copy()  # (1, n_heads, head_dim)
        qc = np.ascontiguousarray(q, np.float32)  # (nq, n_heads, head_dim)
        out = np.empty((nq, nh, hd), np.float32)
        if mass is None:  # prefill in one call, query by query: attn_decode's softmax on each query's row
            args = (address_of(qc), k_addr, v_addr, geometry[0], ctx, nq, bs, cfg.n_kv_heads, cfg.q_per_kv, hd,
                    att.window or 0, float(scale))
            if self._threads is not None and nq >= THREADED_QUERIES:  # every thread a chunk of the queries
                self._threads.attn_prefill(*args, address_of(out))
            else:
                self.kernels.attn_prefill(*args, self._addrs["_scores"], address_of(out))
            return out
        # the attention mass: the reference's softmax over the kernel's scores (prefill_probs), summed per block
        scores = np.empty((nq, nh, ctx), np.float32)  # the kernel leaves each query's unseen keys as they are
        self.kernels.attn_scores(address_of(qc), k_addr, *geometry, address_of(scores))
        probs = prefill_probs(scores, att.window, scale)  # (nq, n_heads, ctx), zero on unseen keys
        mass += block_mass(probs.sum(axis=(0, 1)), bs, mass.shape[0])
        self.kernels.attn_values(address_of(probs), v_addr, *geometry, address_of(out))
        return out


def mirror(threads, a: np.ndarray) -> int:
    """The kernel threads' mirror of array a's bytes (linear_threads.js mirror), made once and dropped when a is
    (so that no later array at its address reads as mirrored); its offset in their memory."""
    address = address_of(a)
    at = int(threads.mirror(address, a.nbytes))
    weakref.finalize(a, threads.unmirror, address)
    return at


def prefill_probs(scores: np.ndarray, window: int | None, scale: float) -> np.ndarray:
    """The reference's prefill softmax of scores (nq, heads, ctx), the last nq queries of ctx keys: each query's
    causal mask (and the keys before its window), exp(s - max) / sum over the whole row; zero on unseen keys."""
    nq, _, ctx = scores.shape
    causal = np.arange(ctx)[None, :] > np.arange(ctx - nq, ctx)[:, None]  # (nq, ctx)
    if window:
        causal |= np.arange(ctx)[None, :] <= np.arange(ctx - nq, ctx)[:, None] - window
    s = np.where(causal[:, None, :], -np.inf, scores * np.float32(scale))
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return s / s.sum(axis=-1, keepdims=True)


def first_seen(ctx: int, nq: int, window: int | None) -> int:
    """The first cache index any of a sequence's last nq of ctx tokens attends to: its first query's window start
    (query i sees the keys j with i - window < j <= i), 0 without a window."""
    return 0 if window is None else max(0, ctx - nq + 1 - window)


class PointerTwin:
    """The kernels' numpy twins over the same addresses (CPython): what attn_scores / attn_values, attn_decode
    and the one-token step's glue (rms_norm, rms_norm_rows, add_rms_norm, silu_mul, gelu_tanh_mul: the
    reference's own operations) compute."""

    @staticmethod
    def _views(table: int, pool: int, ctx: int, bs: int, nkv: int, hd: int):
        import ctypes  # here: the tab never calls the twin

        used = -(-ctx // bs)
        blocks = array_at(table, ctypes.c_int32, used)
        num_blocks = int(blocks.max()) + 1
        pool_view = array_at(pool, ctypes.c_float, num_blocks * bs * nkv * hd).reshape(-1, nkv, hd)
        slots = blocks.astype(np.int64)[np.arange(ctx) // bs] * bs + np.arange(ctx) % bs  # (ctx,)
        return array_at, ctypes.c_float, pool_view[slots]  # (ctx, nkv, hd)

    def attn_scores(self, q: int, k: int, table: int, ctx: int, nq: int, bs: int, nkv: int, group: int, hd: int,
                    out: int) -> None:
        view, f32, keys = self._views(table, k, ctx, bs, nkv, hd)
        qs = view(q, f32, nq * nkv * group * hd).reshape(nq, nkv, group, hd)
        o = view(out, f32, nq * nkv * group * ctx).reshape(nq, nkv, group, ctx)
        for i in range(nq):  # query i sees keys 0 .. ctx - nq + i; the rest of its row stays as it was
            seen = ctx - nq + i + 1
            o[i, :, :, :seen] = np.einsum("hgd,chd->hgc", qs[i], keys[:seen])

    def attn_prefill(self, q: int, k: int, v: int, table: int, ctx: int, nq: int, bs: int, nkv: int, group: int,
                     hd: int, window: int, scale: float, s: int, out: int) -> None:
        """The reference's prefill softmax between the two products (prefill_probs: every query's scores at once,
        over whole rows)."""
        scores = np.empty((nq, nkv * group, ctx), np.float32)  # the unseen keys left as they are, masked there
        self.attn_scores(q, k, table, ctx, nq, bs, nkv, group, hd, address_of(scores))
        probs = np.ascontiguousarray(prefill_probs(scores, window, scale), np.float32)  # (nq, n_heads, ctx)
        self.attn_values(address_of(probs), v, table, ctx, nq, bs, nkv, group, hd, out)

    def attn_values(self, p: int, v: int, table: int, ctx: int, nq: int, bs: int, nkv: int, group: int, hd: int,
                    out: int) -> None:
        view, f32, vals = self._views(table, v, ctx, bs, nkv, hd)
        probs = view(p, f32, nq * nkv * group * ctx).reshape(nq, nkv, group, ctx)
        o = view(out, f32, nq * nkv * group * hd).reshape(nq, nkv, group, hd)
        for i in range(nq):
            seen = ctx - nq + i + 1
            o[i] = np.einsum("hgc,chd->hgd", probs[i, :, :, :seen], vals[:seen])

    @staticmethod
    def rms_norm(x: int, w: int, n: int, eps: float, out: int) -> None:
        import ctypes  # here: the tab never calls the twin

        f32 = ctypes.c_float
        array_at(out, f32, n)[...] = rms_norm(array_at(x, f32, n)[None], array_at(w, f32, n), eps)[0]

    @staticmethod
    def add_rms_norm(x: int, y: int, w: int, n: int, eps: float, out: int) -> None:
        import ctypes  # here: the tab never calls the twin

        xs = array_at(x, ctypes.c_float, n)
        xs[...] = xs + array_at(y, ctypes.c_float, n)
        PointerTwin.rms_norm(x, w, n, eps, out)

    @staticmethod
    def rms_norm_rows(x: int, w: int, n: int, rows: int, eps: float, out: int) -> None:
        import ctypes  # here: the tab never calls the twin

        f32 = ctypes.c_float
        array_at(out, f32, n * rows)[...] = rms_norm(array_at(x, f32, n * rows).reshape(rows, n),
                                                     array_at(w, f32, n), eps).reshape(-1)

    @staticmethod
    def gelu_tanh_mul(g: int, u: int, n: int, out: int) -> None:
        import ctypes  # here: the tab never calls the twin

        f32 = ctypes.c_float
        array_at(out, f32, n)[...] = gelu_tanh(array_at(g, f32, n)) * array_at(u, f32, n)

    def silu_mul_rows(self, gu: int, n: int, rows: int, out: int) -> None:
        for r in range(rows):
            self.silu_mul(gu + 8 * n * r, gu + 8 * n * r + 4 * n, n, out + 4 * n * r)

    def gelu_tanh_mul_rows(self, gu: int, n: int, rows: int, out: int) -> None:
        for r in range(rows):
            self.gelu_tanh_mul(gu + 8 * n * r, gu + 8 * n * r + 4 * n, n, out + 4 * n * r)

    @staticmethod
    def silu_mul(g: int, u: int, n: int, out: int) -> None:
        import ctypes  # here: the tab never calls the twin

        f32 = ctypes.c_float
        array_at(out, f32, n)[...] = silu(array_at(g, f32, n)) * array_at(u, f32, n)

    def attn_decode(self, qkv: int, cos: int, sin: int, k: int, v: int, table: int, ctx: int, lo: int, bs: int,
                    nkv: int, group: int, hd: int, slot: int, scale: float, s: int, ld: int, out: int) -> None:
        import ctypes  # here: the tab never calls the twin

        nh, tok, f32 = nkv * group, nkv * hd, ctypes.c_float
        heads = array_at(qkv, f32, (nh + 2 * nkv) * hd).reshape(nh + 2 * nkv, hd)
        c, sn = (array_at(a, f32, hd // 2)[None, None, :] for a in (cos, sin))
        heads[: nh + nkv] = rotate_adjacent(heads[None, : nh + nkv], c, sn)[0]
        array_at(k + 4 * slot * tok, f32, tok)[...] = heads[nh: nh + nkv].reshape(-1)
        array_at(v + 4 * slot * tok, f32, tok)[...] = heads[nh + nkv:].reshape(-1)
        scores = np.empty((nh, ctx), np.float32)
        self.attn_scores(qkv, k, table, ctx, 1, bs, nkv, group, hd, address_of(scores))
        scaled = scores * np.float32(scale)
        scaled[:, :lo] = -np.inf  # the keys before the window
        e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
        probs = np.ascontiguousarray(e / e.sum(axis=-1, keepdims=True), np.float32)  # (n_heads, ctx)
        array_at(s, f32, nh * ld).reshape(nh, ld)[:, :ctx] = probs
        self.attn_values(address_of(probs), v, table, ctx, 1, bs, nkv, group, hd, out)
