"""Reference llama forward pass in numpy over a PAGED KV cache: the oracle for the WGSL kernels.

Inputs follow vLLM's flattened batch: the new tokens of every sequence are
concatenated; each sequence's K/V live in fixed-size physical blocks of a
per-layer pool, found through its row of `block_tables`. Prefill (many new
tokens) and decode (one new token) are the same code path.

Everything is f32; weights are dequantized once at load (ModelWeights). The KV pools hold f32 values;
with a kv_dtype other than f32 they hold the dequantized values produced by the exact quantizer of
pagedkv.kv_dtype (the one the WGSL kv_write matches bit for bit), so attention reads what the GPU reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kv_dtype import kv_dtype as check_kv_dtype
from ..kv_dtype import round_trip
from ..model.config import ModelConfig
from ..model.weights import ModelWeights


def _int32_array(name: str, value, ndim: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype != np.int32 or arr.ndim != ndim:
        raise ValueError(f"{name} must be an int32 array with {ndim} dim(s), got {arr.dtype} with shape {arr.shape}")
    return arr


@dataclass(frozen=True)
class ForwardBatch:
    """One step's flattened batch (T new tokens over S sequences); validated on construction.

    The new tokens of a sequence are the last q_len of its cache (cache indices ctx - q_len .. ctx - 1;
    causality follows them). Their positions are consecutive and start at or after ctx - q_len: a
    sequence whose middle blocks were dropped may keep its tokens' text positions (kv_retention.py).
    """

    token_ids: np.ndarray  # (T,) int32
    positions: np.ndarray  # (T,) int32, rotary position of each new token (>= its index in the cache)
    slot_mapping: np.ndarray  # (T,) int32, physical slot = block_id * block_size + offset
    query_start_loc: np.ndarray  # (S + 1,) int32, new tokens of seq s are [qsl[s], qsl[s+1])
    block_tables: np.ndarray  # (S, max_blocks) int32, physical block ids per sequence
    context_lens: np.ndarray  # (S,) int32, tokens in the cache for seq s after this step

    def __post_init__(self) -> None:
        t = _int32_array("token_ids", self.token_ids, 1).shape[0]
        for name in ("positions", "slot_mapping"):
            if _int32_array(name, getattr(self, name), 1).shape[0] != t:
                raise ValueError(f"{name} must have one entry per token ({t})")
        qsl = _int32_array("query_start_loc", self.query_start_loc, 1)
        s = qsl.shape[0] - 1
        if s < 1 or qsl[0] != 0 or qsl[-1] != t or np.any(np.diff(qsl) < 1):
            raise ValueError(f"query_start_loc must rise strictly from 0 to {t}, got {qsl.tolist()}")
        if _int32_array("block_tables", self.block_tables, 2).shape[0] != s:
            raise ValueError(f"block_tables must have one row per sequence ({s})")
        ctx = _int32_array("context_lens", self.context_lens, 1)
        if ctx.shape[0] != s:
            raise ValueError(f"context_lens must have one entry per sequence ({s})")
        for i in range(s):
            q_len = int(qsl[i + 1] - qsl[i])
            first = int(self.positions[qsl[i]])
            expected = np.arange(first, first + q_len, dtype=np.int32)
            if first < ctx[i] - q_len or not np.array_equal(self.positions[qsl[i] : qsl[i + 1]], expected):
                raise ValueError(f"sequence {i}: positions must be consecutive, starting at or after its "
                                 f"first new cache index {int(ctx[i]) - q_len}")

    @property
    def num_seqs(self) -> int:
        """Number of sequences S in the batch."""
        return self.query_start_loc.shape[0] - 1


@dataclass(frozen=True)
class PagedKVCache:
    """Per-layer K and V pools, each (num_blocks, block_size, n_kv_heads, head_dim) f32.

    kv_dtype: rows are stored as round_trip(row, kv_dtype) (see the module docstring).
    """

    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]
    kv_dtype: str = "f32"

    def __post_init__(self) -> None:
        check_kv_dtype(self.kv_dtype)

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int,
                 kv_dtype: str = "f32") -> "PagedKVCache":
        """Zero-filled pools for every layer."""
        check_kv_dtype(kv_dtype)
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        shape = (num_blocks, block_size, config.n_kv_heads, config.head_dim)
        return cls(
            k=tuple(np.zeros(shape, np.float32) for _ in range(config.n_layers)),
            v=tuple(np.zeros(shape, np.float32) for _ in range(config.n_layers)),
            kv_dtype=kv_dtype,
        )

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0]

    @property
    def block_size(self) -> int:
        return self.k[0].shape[1]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (T, H) -> x / rms(x) * weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_inv_freq(head_dim: int, base: float) -> np.ndarray:
    """(head_dim/2,) f32 rotary frequencies; llama.cpp computes theta = pos * base^(-2i/head_dim)."""
    return (1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))).astype(np.float32)


def rope_adjacent(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (2i, 2i+1) of x (T, n_heads, head_dim) by positions * inv_freq[i]."""
    angles = positions.astype(np.float32)[:, None] * inv_freq[None, :]  # (T, head_dim/2)
    cos = np.cos(angles)[:, None, :]  # (T, 1, head_dim/2)
    sin = np.sin(angles)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]  # (T, n_heads, head_dim/2)
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def block_mass(token_mass: np.ndarray, block_size: int, num_blocks: int) -> np.ndarray:
    """(ctx,) attention mass per cached token -> (num_blocks,) per block-table entry (zero past ctx)."""
    padded = np.zeros(num_blocks * block_size, np.float32)  # (num_blocks * block_size,)
    padded[: token_mass.shape[0]] = token_mass
    return padded.reshape(num_blocks, block_size).sum(axis=1)


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


class NumpyModel:
    """The reference forward pass; stateless apart from the weights (the KV cache is passed in)."""

    def __init__(self, weights: ModelWeights) -> None:
        self.config = weights.config
        self.w = weights.tensors
        self.inv_freq = rope_inv_freq(self.config.head_dim, self.config.rope_base)  # (head_dim/2,) f32

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
        self._check_bounds(batch, kv)

        x = self.w["token_embd.weight"][batch.token_ids]  # (T, hidden)
        for layer in range(cfg.n_layers):
            x = x + self._attention(layer, rms_norm(x, self.w[f"blk.{layer}.attn_norm.weight"], cfg.rms_eps), batch, kv,
                                attention_mass if layer == cfg.n_layers - 1 else None)
            x = x + self._mlp(layer, rms_norm(x, self.w[f"blk.{layer}.ffn_norm.weight"], cfg.rms_eps))
        if not all_logits:
            x = x[batch.query_start_loc[1:] - 1]  # (S, hidden)
        x = rms_norm(x, self.w["output_norm.weight"], cfg.rms_eps)
        head = self.w["token_embd.weight" if cfg.tied_embeddings else "output.weight"]  # (vocab, hidden)
        return x @ head.T  # (S or T, vocab)

    def _check_bounds(self, batch: ForwardBatch, kv: PagedKVCache) -> None:
        cfg = self.config
        if int(batch.context_lens.max()) > cfg.context_length:
            raise ValueError(
                f"sequence of {int(batch.context_lens.max())} tokens exceeds the model context of {cfg.context_length}"
            )
        if batch.token_ids.min() < 0 or batch.token_ids.max() >= cfg.vocab:
            raise ValueError(f"token ids must be in [0, {cfg.vocab})")
        num_slots = kv.num_blocks * kv.block_size
        if batch.slot_mapping.min() < 0 or batch.slot_mapping.max() >= num_slots:
            raise ValueError(f"slot_mapping entries must be in [0, {num_slots})")
        needed_blocks = -(-batch.context_lens // kv.block_size)  # (S,) ceil
        if int(needed_blocks.max()) > batch.block_tables.shape[1]:
            raise ValueError("block_tables has fewer columns than the longest context needs")
        for s in range(batch.num_seqs):
            used = batch.block_tables[s, : needed_blocks[s]]
            if used.min() < 0 or used.max() >= kv.num_blocks:
                raise ValueError(f"sequence {s}: block ids must be in [0, {kv.num_blocks})")

    def _attention(self, layer: int, h: np.ndarray, batch: ForwardBatch, kv: PagedKVCache,
                   mass: np.ndarray | None) -> np.ndarray:
        cfg = self.config
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        t = h.shape[0]
        q = (h @ self.w[f"blk.{layer}.attn_q.weight"].T).reshape(t, nh, hd)  # (T, n_heads, head_dim)
        k = (h @ self.w[f"blk.{layer}.attn_k.weight"].T).reshape(t, nkv, hd)  # (T, n_kv_heads, head_dim)
        v = (h @ self.w[f"blk.{layer}.attn_v.weight"].T).reshape(t, nkv, hd)  # (T, n_kv_heads, head_dim)
        q = rope_adjacent(q, batch.positions, self.inv_freq)
        k = rope_adjacent(k, batch.positions, self.inv_freq)

        # Write the new K/V through the slot mapping, then read every key
        # (old and new) back through the block table: the paged path only.
        bs = kv.block_size
        k_pool = kv.k[layer].reshape(-1, nkv, hd)  # (num_blocks * block_size, n_kv_heads, head_dim), a view
        v_pool = kv.v[layer].reshape(-1, nkv, hd)
        k_pool[batch.slot_mapping] = round_trip(k, kv.kv_dtype)
        v_pool[batch.slot_mapping] = round_trip(v, kv.kv_dtype)

        out = np.empty((t, nh, hd), np.float32)  # (T, n_heads, head_dim)
        scale = np.float32(1.0 / np.sqrt(hd))
        for s in range(batch.num_seqs):
            lo, hi = int(batch.query_start_loc[s]), int(batch.query_start_loc[s + 1])
            ctx = int(batch.context_lens[s])
            key_pos = np.arange(ctx)  # (ctx,)
            slots = batch.block_tables[s, key_pos // bs] * bs + key_pos % bs  # (ctx,)
            keys = k_pool[slots].transpose(1, 0, 2)  # (n_kv_heads, ctx, head_dim)
            vals = v_pool[slots].transpose(1, 0, 2)  # (n_kv_heads, ctx, head_dim)
            qs = q[lo:hi].reshape(hi - lo, nkv, cfg.q_per_kv, hd).transpose(1, 2, 0, 3)  # (n_kv, group, q_len, hd)
            scores = (qs @ keys[:, None].transpose(0, 1, 3, 2)) * scale  # (n_kv, group, q_len, ctx)
            q_idx = np.arange(ctx - (hi - lo), ctx)  # (q_len,) cache index of each new token
            causal = key_pos[None, :] > q_idx[:, None]  # (q_len, ctx)
            scores = np.where(causal, -np.inf, scores)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            if mass is not None:
                mass[s] += block_mass(probs.sum(axis=(0, 1, 2)), bs, mass.shape[1])
            o = probs @ vals[:, None]  # (n_kv, group, q_len, head_dim)
            out[lo:hi] = o.transpose(2, 0, 1, 3).reshape(hi - lo, nh, hd)
        return out.reshape(t, nh * hd) @ self.w[f"blk.{layer}.attn_output.weight"].T  # (T, hidden)

    def _mlp(self, layer: int, h: np.ndarray) -> np.ndarray:
        gate = h @ self.w[f"blk.{layer}.ffn_gate.weight"].T  # (T, ffn)
        up = h @ self.w[f"blk.{layer}.ffn_up.weight"].T  # (T, ffn)
        return (silu(gate) * up) @ self.w[f"blk.{layer}.ffn_down.weight"].T  # (T, hidden)


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
