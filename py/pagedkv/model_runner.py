"""Flatten one scheduled step into the few int32 arrays every backend consumes.

Each array goes to the GPU in one write, so a step's Python->JS crossings do not
grow with the batch. A token's slot follows its index in the cache, which is
its position in the text minus the tokens a window or eviction dropped before
it; its rotary position is one or the other (KVRetention.positions).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernels.ref_attention import check_block_tables
from .request import Request


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
    # A model with several KV groups (kv/groups.py) only: every group's tables and slots (group 0's are the two
    # above); a window group's entries out of its window hold the null block, which no kernel needs.
    group_block_tables: np.ndarray | None = None  # (G, S, max_blocks) int32
    group_slot_mapping: np.ndarray | None = None  # (G, T) int32

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
        if (self.group_block_tables is None) != (self.group_slot_mapping is None):
            raise ValueError("group_block_tables and group_slot_mapping come together")
        if self.group_block_tables is not None:
            gbt = _int32_array("group_block_tables", self.group_block_tables, 3)
            gsm = _int32_array("group_slot_mapping", self.group_slot_mapping, 2)
            if gbt.shape[1:] != self.block_tables.shape or gsm.shape != (gbt.shape[0], t):
                raise ValueError(f"group_block_tables {gbt.shape} / group_slot_mapping {gsm.shape} must be "
                                 f"(G, {self.block_tables.shape}) / (G, {t})")
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

    def check_fits(self, *, vocab: int, context_length: int, num_blocks: int, block_size: int) -> None:
        """Raise ValueError unless every token id, context, slot and used block-table entry fits a backend
        with this vocabulary, model context and pool; every backend checks a batch with this before a step."""
        if int(self.context_lens.max()) > context_length:
            raise ValueError(f"a sequence of {int(self.context_lens.max())} tokens exceeds the model context "
                             f"of {context_length}")
        if self.token_ids.min() < 0 or self.token_ids.max() >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab})")
        slots = num_blocks * block_size
        mappings = [self.slot_mapping] if self.group_slot_mapping is None else list(self.group_slot_mapping)
        tables = [self.block_tables] if self.group_block_tables is None else list(self.group_block_tables)
        for mapping in mappings:
            if mapping.min() < 0 or mapping.max() >= slots:
                raise ValueError(f"slot_mapping entries must be in [0, {slots})")
        for table in tables:
            check_block_tables(table, self.context_lens, num_blocks, block_size)

    @property
    def num_groups(self) -> int:
        """KV groups G: 1 without group arrays."""
        return 1 if self.group_block_tables is None else self.group_block_tables.shape[0]

    def tables_of(self, group: int) -> tuple[np.ndarray, np.ndarray]:
        """(block_tables (S, max_blocks), slot_mapping (T,)) of KV group `group`."""
        if self.group_block_tables is None:
            if group != 0:
                raise ValueError(f"this batch has one KV group, not group {group}")
            return self.block_tables, self.slot_mapping
        return self.group_block_tables[group], self.group_slot_mapping[group]  # type: ignore[index]


def build_batch(scheduled: list[tuple[Request, int]], block_size: int) -> ForwardBatch:
    """(request, n) pairs -> ForwardBatch; request computes tokens [num_computed, num_computed + n)."""
    token_ids: list[int] = []
    positions: list[int] = []
    cache_index: list[int] = []
    query_start = [0]
    context_lens: list[int] = []
    tables: list[list[list[int]]] = []  # per sequence, per group
    for req, n in scheduled:
        seq = req.seq
        start = seq.num_computed_tokens
        if n < 1 or start + n > seq.num_kv_tokens:
            raise ValueError(f"request {req.request_id}: {n} tokens from {start} exceed its "
                             f"{seq.num_kv_tokens} KV slots")
        first = start - seq.num_evicted_tokens  # cache index of the first new token
        cache_index.extend(range(first, first + n))
        token_ids.extend(seq.token_ids[start:start + n])
        shifted = req.retention is None or req.retention.shifts_positions
        positions.extend(range(first, first + n) if shifted else range(start, start + n))
        query_start.append(query_start[-1] + n)
        context_lens.append(first + n)
        tables.append(seq.block_tables)
    num_groups = len(tables[0])
    width = max(len(t) for per_seq in tables for t in per_seq)
    # (G, S, max_blocks), padded with block 0
    group_tables = np.zeros((num_groups, len(tables), width), dtype=np.int32)
    for i, per_seq in enumerate(tables):
        if len(per_seq) != num_groups:
            raise ValueError(f"request {scheduled[i][0].request_id} has {len(per_seq)} KV groups, not {num_groups}")
        for g, t in enumerate(per_seq):
            group_tables[g, i, : len(t)] = t
    idx = np.asarray(cache_index, dtype=np.int64)  # (T,)
    rows = np.repeat(np.arange(len(tables)), np.diff(query_start))  # (T,) the sequence of each new token
    group_slots = (group_tables[:, rows, idx // block_size] * block_size + idx % block_size).astype(np.int32)  # (G, T)
    grouped = num_groups > 1
    return ForwardBatch(
        token_ids=np.asarray(token_ids, dtype=np.int32),         # (T,)
        positions=np.asarray(positions, dtype=np.int32),         # (T,)
        slot_mapping=group_slots[0],                             # (T,)
        query_start_loc=np.asarray(query_start, dtype=np.int32),  # (S + 1,)
        block_tables=group_tables[0],                            # (S, max_blocks)
        context_lens=np.asarray(context_lens, dtype=np.int32),   # (S,)
        group_block_tables=group_tables if grouped else None,    # (G, S, max_blocks)
        group_slot_mapping=group_slots if grouped else None,     # (G, T)
    )
