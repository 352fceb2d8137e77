"""Flatten one scheduled step into the few int32 arrays every backend consumes.

Each array goes to the GPU in one write, so a step's Python->JS crossings do not
grow with the batch. A token's slot follows its index in the cache, which is
its position in the text minus the tokens a window or eviction dropped before
it; its rotary position is one or the other (KVRetention.positions).
"""
from __future__ import annotations

import numpy as np

from .backends.numpy_ref import ForwardBatch
from .request import Request


def build_batch(scheduled: list[tuple[Request, int]], block_size: int) -> ForwardBatch:
    """(request, n) pairs -> ForwardBatch; request computes tokens [num_computed, num_computed + n)."""
    token_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    context_lens: list[int] = []
    tables: list[list[int]] = []
    for req, n in scheduled:
        seq = req.seq
        start = seq.num_computed_tokens
        if n < 1 or start + n > seq.num_kv_tokens:
            raise ValueError(f"request {req.request_id}: {n} tokens from {start} exceed its "
                             f"{seq.num_kv_tokens} KV slots")
        table = seq.block_table
        first = start - seq.num_evicted_tokens  # cache index of the first new token
        for idx in range(first, first + n):
            slots.append(table[idx // block_size] * block_size + idx % block_size)
        token_ids.extend(seq.token_ids[start:start + n])
        shifted = req.retention is None or req.retention.shifts_positions
        positions.extend(range(first, first + n) if shifted else range(start, start + n))
        query_start.append(query_start[-1] + n)
        context_lens.append(first + n)
        tables.append(table)
    width = max(len(t) for t in tables)
    block_tables = np.zeros((len(tables), width), dtype=np.int32)  # (S, max_blocks), padded with block 0
    for i, t in enumerate(tables):
        block_tables[i, : len(t)] = t
    return ForwardBatch(
        token_ids=np.asarray(token_ids, dtype=np.int32),         # (T,)
        positions=np.asarray(positions, dtype=np.int32),         # (T,)
        slot_mapping=np.asarray(slots, dtype=np.int32),          # (T,)
        query_start_loc=np.asarray(query_start, dtype=np.int32),  # (S + 1,)
        block_tables=block_tables,                               # (S, max_blocks)
        context_lens=np.asarray(context_lens, dtype=np.int32),   # (S,)
    )
