"""Reference forward pass in numpy over a PAGED KV cache: the oracle for the WGSL kernels.

It interprets the model's family declaration (model/family.py): each layer's norms, biases, rotary, attention
window and activation come from config.layers, the embedding scale from the config; nothing here names a family.

Inputs follow vLLM's flattened batch: the new tokens of every sequence are
concatenated; each sequence's K/V live in fixed-size physical blocks of a
per-layer pool, found through its row of `block_tables`. Prefill (many new
tokens) and decode (one new token) are the same code path. A batch with KV groups (kv/groups.py:
group_block_tables) runs on pools per slot instead: layer l of group g reads and writes pool j (its slot in g)
through group g's tables and slots.

Everything is f32; weights are dequantized once at load (ModelWeights). The KV pools hold f32 values;
with a kv_dtype other than f32 they hold the dequantized values produced by the exact quantizer of
pagedkv.kv.dtypes (the one the WGSL kv_write matches bit for bit), so attention reads what the GPU reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kv.dtypes import kv_dtype as check_kv_dtype
from ..kv.dtypes import round_trip
from ..kv.groups import KVGroups
from ..model.config import ModelConfig
from ..kernels.ref_ops import ACTIVATIONS, layer_inv_freq, model_inv_freq, rms_norm, rope_adjacent
from ..model.weights import ModelWeights
from ..model_runner import ForwardBatch


@dataclass(frozen=True)
class PagedKVCache:
    """Per-layer K and V pools, each (num_blocks, block_size, n_kv_heads, head_dim) f32; with KV groups one pool
    per slot of a group (group_size of them), a block of every pool making up one page.

    kv_dtype: rows are stored as round_trip(row, kv_dtype) (see the module docstring).
    """

    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]
    kv_dtype: str = "f32"

    def __post_init__(self) -> None:
        check_kv_dtype(self.kv_dtype)

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int,
                 kv_dtype: str = "f32", num_pools: int | None = None) -> "PagedKVCache":
        """Zero-filled pools for every layer, or `num_pools` of them (a KV group's slots)."""
        check_kv_dtype(kv_dtype)
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        shape = (num_blocks, block_size, config.n_kv_heads, config.head_dim)
        n = config.n_layers if num_pools is None else num_pools
        return cls(
            k=tuple(np.zeros(shape, np.float32) for _ in range(n)),
            v=tuple(np.zeros(shape, np.float32) for _ in range(n)),
            kv_dtype=kv_dtype,
        )

    @classmethod
    def in_pages(cls, config: ModelConfig, pages: np.ndarray, block_size: int,
                 kv_dtype: str = "f32", num_pools: int | None = None) -> "PagedKVCache":
        """Pools that are views of `pages`, (num_pages, page_floats) f32 that other models' pools view too: page
        p holds block p of every pool, (pools, 2, block_size, n_kv_heads, head_dim) from its start, with one
        pool per layer, or `num_pools` of them (a KV group's slots: a page then holds one group's layers). Each
        pool is a strided view; one block of it is contiguous."""
        check_kv_dtype(kv_dtype)
        n = config.n_layers if num_pools is None else num_pools
        shape = (n, 2, block_size, config.n_kv_heads, config.head_dim)
        need = int(np.prod(shape))
        if pages.ndim != 2 or pages.dtype != np.float32 or pages.shape[1] < need:
            raise ValueError(f"pages {pages.dtype} {pages.shape} cannot hold blocks of {shape} f32 ({need} floats)")
        view = pages[:, :need].reshape((pages.shape[0], *shape))  # (P, pools, 2, bs, kv, hd)
        return cls(k=tuple(view[:, pool, 0] for pool in range(n)),
                   v=tuple(view[:, pool, 1] for pool in range(n)), kv_dtype=kv_dtype)

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0]

    @property
    def block_size(self) -> int:
        return self.k[0].shape[1]


def block_mass(token_mass: np.ndarray, block_size: int, num_blocks: int) -> np.ndarray:
    """(ctx,) attention mass per cached token -> (num_blocks,) per block-table entry (zero past ctx)."""
    padded = np.zeros(num_blocks * block_size, np.float32)  # (num_blocks * block_size,)
    padded[: token_mass.shape[0]] = token_mass
    return padded.reshape(num_blocks, block_size).sum(axis=1)


class NumpyModel:
    """The reference forward pass; stateless apart from the weights (the KV cache is passed in)."""

    def __init__(self, weights: ModelWeights) -> None:
        self.config = weights.config
        self.w = weights.tensors
        self.layers = self.config.layers  # family.Layer per decoder layer
        self.kv_groups = KVGroups.of(self.config)  # the layout of a batch with group_block_tables
        self.inv_freq = model_inv_freq(self.config)  # (head_dim/2,) f32: the file's base and scaling
        # (head_dim/2,) f32 per layer, None where a layer has no rotary; layers that rotate alike share one array
        freqs: dict = {(self.config.rope_base, True): self.inv_freq}
        self.inv_freqs = tuple(
            None if spec.attention.rope_base is None else
            freqs.setdefault((spec.attention.rope_base, spec.attention.rope_scaled), layer_inv_freq(self.config, spec))
            for spec in self.layers)

    def forward(self, batch: ForwardBatch, kv: PagedKVCache, all_logits: bool = False,
                attention_mass: np.ndarray | None = None) -> np.ndarray:
        """Run one step: writes the new tokens' K/V into kv, returns logits.

        Returns (S, vocab) logits of each sequence's last new token, or (T, vocab)
        for every new token when all_logits is set. attention_mass, when given
        (S, max_blocks) f32 zeros, receives per block-table entry the softmax
        probability of the LAST layer summed over heads and new tokens (importance eviction; one layer
        keeps the GPU's cost at one small dispatch per step, shaders/attention_mass.wgsl).
        """
        cfg = self.config
        batch.check_fits(vocab=cfg.vocab, context_length=cfg.context_length, num_blocks=kv.num_blocks,
                         block_size=kv.block_size)
        pools = cfg.n_layers if batch.group_block_tables is None else self.kv_groups.group_size
        if batch.num_groups not in (1, self.kv_groups.num_groups) or len(kv.k) != pools:
            raise ValueError(f"a batch of {batch.num_groups} KV group(s) needs {pools} pools (the model's groups: "
                             f"{self.kv_groups.num_groups}), the cache has {len(kv.k)}")

        x = self.w["token_embd.weight"][batch.token_ids]  # (T, hidden)
        if cfg.embedding_scale != 1.0:
            x = x * np.float32(cfg.embedding_scale)
        for layer, spec in enumerate(self.layers):
            a = self._attention(layer, self._norm(layer, "attn_norm", x), batch, kv,
                                attention_mass if layer == cfg.n_layers - 1 else None)
            x = x + (self._norm(layer, "post_attention_norm", a) if spec.post_attention_norm else a)
            f = self._mlp(layer, self._norm(layer, "ffn_norm", x))
            x = x + (self._norm(layer, "post_ffw_norm", f) if spec.post_ffn_norm else f)
        if not all_logits:
            x = x[batch.query_start_loc[1:] - 1]  # (S, hidden)
        x = rms_norm(x, self.w["output_norm.weight"], cfg.rms_eps)
        head = self.w["token_embd.weight" if cfg.tied_embeddings else "output.weight"]  # (vocab, hidden)
        return x @ head.T  # (S or T, vocab)

    def _norm(self, layer: int, name: str, x: np.ndarray) -> np.ndarray:
        """RMSNorm of x over its last axis with layer `layer`'s gain `name`."""
        return rms_norm(x, self.w[f"blk.{layer}.{name}.weight"], self.config.rms_eps)

    def _attention(self, layer: int, h: np.ndarray, batch: ForwardBatch, kv: PagedKVCache,
                   mass: np.ndarray | None) -> np.ndarray:
        cfg, spec = self.config, self.layers[layer]
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        t = h.shape[0]
        q, k, v = self._projections(layer, "attn_qkv", ("attn_q", "attn_k", "attn_v"), h, spec.attention_bias)
        q = q.reshape(t, nh, hd)  # (T, n_heads, head_dim)
        k = k.reshape(t, nkv, hd)  # (T, n_kv_heads, head_dim)
        v = v.reshape(t, nkv, hd)  # (T, n_kv_heads, head_dim)
        if spec.qk_norm:  # per head, before rotary
            q, k = self._norm(layer, "attn_q_norm", q), self._norm(layer, "attn_k_norm", k)
        if spec.attention.rope_base is not None:
            q, k = self._rope(layer, q, k, batch)

        # Write the new K/V through the slot mapping, then read every key
        # (old and new) back through the block table: the paged path only.
        # (block, offset) indexing writes through a pool that views shared pages (PagedKVCache.in_pages), where
        # a reshape to (slots, ...) would write into a copy.
        bs = kv.block_size
        if batch.group_block_tables is None:  # every layer its own pools, one table
            pool, tables = layer, batch.block_tables
            where = self._slots(batch, bs)  # (T,), (T,)
        else:  # layer -> (group, slot): the slot's pools through the group's tables and slots
            group, pool = self.kv_groups.where(layer)
            tables, slot_mapping = batch.tables_of(group)  # (S, max_blocks), (T,)
            where = (slot_mapping // bs, slot_mapping % bs)
        kv.k[pool][where] = round_trip(k, kv.kv_dtype)
        kv.v[pool][where] = round_trip(v, kv.kv_dtype)
        self.kv_rows_written(kv, pool, where)

        out = np.empty((t, nh, hd), np.float32)  # (T, n_heads, head_dim)
        for s in range(batch.num_seqs):
            lo, hi = int(batch.query_start_loc[s]), int(batch.query_start_loc[s + 1])
            out[lo:hi] = self._sequence_attention(layer, q[lo:hi], kv.k[pool], kv.v[pool], tables[s],
                                                  int(batch.context_lens[s]), None if mass is None else mass[s])
        return out.reshape(t, nh * hd) @ self.w[f"blk.{layer}.attn_output.weight"].T  # (T, hidden)

    def _rope(self, layer: int, q: np.ndarray, k: np.ndarray, batch: ForwardBatch) -> tuple[np.ndarray, np.ndarray]:
        """q (T, n_heads, head_dim) and k (T, n_kv_heads, head_dim) rotated at the batch's positions with the
        layer's frequencies."""
        inv = self.inv_freqs[layer]
        return rope_adjacent(q, batch.positions, inv), rope_adjacent(k, batch.positions, inv)

    def kv_rows_written(self, kv: PagedKVCache, pool: int, where: tuple[np.ndarray, np.ndarray]) -> None:
        """The rows (block, offset) of pool `pool` (K and V) the forward just wrote; here nothing else holds them
        (WasmAttentionModel copies them into the kernel threads' mirror)."""

    def kv_blocks_written(self, kv: PagedKVCache, blocks) -> None:
        """Blocks of every pool the backend just wrote (copied, shifted, swapped or read in); as kv_rows_written."""

    def _slots(self, batch: ForwardBatch, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(block, offset) of each new token's slot in the pools."""
        return batch.slot_mapping // block_size, batch.slot_mapping % block_size

    def _sequence_attention(self, layer: int, q: np.ndarray, k_blocks: np.ndarray, v_blocks: np.ndarray,
                            table: np.ndarray, ctx: int, mass: np.ndarray | None) -> np.ndarray:
        """One sequence's new queries q (q_len, n_heads, head_dim), the LAST q_len of its ctx cached tokens,
        over layer `layer`'s pools (num_blocks, block_size, n_kv_heads, head_dim) through its block table row ->
        (q_len, n_heads, head_dim); adds its probabilities per table entry into mass (max_blocks,) if given.
        A window layer's query at cache index i sees the keys j with i - window < j <= i."""
        cfg, att = self.config, self.layers[layer].attention
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_len, bs = q.shape[0], k_blocks.shape[1]
        scale = np.float32(att.scale)
        key_pos = np.arange(ctx)  # (ctx,)
        where = (table[key_pos // bs], key_pos % bs)  # (ctx,), (ctx,): block and offset of every cached token
        keys = k_blocks[where].transpose(1, 0, 2)  # (n_kv_heads, ctx, head_dim)
        vals = v_blocks[where].transpose(1, 0, 2)  # (n_kv_heads, ctx, head_dim)
        qs = q.reshape(q_len, nkv, cfg.q_per_kv, hd).transpose(1, 2, 0, 3)  # (n_kv, group, q_len, hd)
        scores = (qs @ keys[:, None].transpose(0, 1, 3, 2)) * scale  # (n_kv, group, q_len, ctx)
        q_idx = np.arange(ctx - q_len, ctx)  # (q_len,) cache index of each new token
        hidden = key_pos[None, :] > q_idx[:, None]  # (q_len, ctx): the causal mask
        if att.window is not None:
            hidden |= key_pos[None, :] <= q_idx[:, None] - att.window
        scores = np.where(hidden, -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        if mass is not None:
            mass += block_mass(probs.sum(axis=(0, 1, 2)), bs, mass.shape[0])
        o = probs @ vals[:, None]  # (n_kv, group, q_len, head_dim)
        return o.transpose(2, 0, 1, 3).reshape(q_len, nh, hd)

    def _projections(self, layer: int, stacked: str, names: tuple[str, ...], h: np.ndarray,
                     bias: bool) -> list[np.ndarray]:
        """h @ W.T for each of `names` (plus their biases where `bias`): one product when the weights hold them
        stacked as `stacked` (backends/cpu_wasm.py: stack_projections, whose weight knows its parts' rows)."""
        w = self.w.get(f"blk.{layer}.{stacked}.weight")
        if w is None:
            ys = [h @ self.w[f"blk.{layer}.{n}.weight"].T for n in names]  # (T, rows) each
        else:
            y, at, ys = h @ w.T, 0, []  # (T, sum of parts) -> one column slice a part
            for rows in w.parts:
                ys.append(y[:, at:at + rows])
                at += rows
        return [y + self.w[f"blk.{layer}.{n}.bias"] for y, n in zip(ys, names)] if bias else ys

    def _mlp(self, layer: int, h: np.ndarray) -> np.ndarray:
        gate, up = self._projections(layer, "ffn_gate_up", ("ffn_gate", "ffn_up"), h, False)  # (T, ffn) each
        act = ACTIVATIONS[self.layers[layer].activation]
        return (act(gate) * up) @ self.w[f"blk.{layer}.ffn_down.weight"].T  # (T, hidden)


def greedy_reference(model: NumpyModel, prompt: list[int], n: int) -> list[int]:
    """Oracle: one sequence alone, identity block table, prefill then decode, no engine involved."""
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    blocks = -(-(len(prompt) + n) // 16)
    kv = PagedKVCache.allocate(model.config, blocks, 16)
    table = i32([np.arange(blocks)])
    ids = list(prompt)
    batch = ForwardBatch(i32(ids), i32(range(len(ids))), i32(range(len(ids))), i32([0, len(ids)]), table,
                         i32([len(ids)]))
    out = []
    for _ in range(n):
        tok = int(np.argmax(model.forward(batch, kv)[0]))
        out.append(tok)
        ids.append(tok)
        p = len(ids) - 1
        batch = ForwardBatch(i32([tok]), i32([p]), i32([p]), i32([0, 1]), table, i32([p + 1]))
    return out
