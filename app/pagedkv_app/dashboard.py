"""What the page's memory dashboard shows: the block map, pool metrics and the streaming rate."""
from __future__ import annotations

from pagedkv.kv.accounting import kv_stats
from pagedkv.sequence import SequenceStatus

RATE_WINDOW_S = 5.0


class TokenRate:
    """Tokens per second streamed over the last RATE_WINDOW_S seconds."""

    def __init__(self) -> None:
        self._window: list[tuple[float, int]] = []  # (time, tokens) of each output

    def add(self, now: float, num_tokens: int) -> None:
        self._window.append((now, num_tokens))

    def per_second(self, now: float) -> float:
        self._window = [(t, n) for t, n in self._window if now - t < RATE_WINDOW_S]
        span = (now - self._window[0][0]) if len(self._window) > 1 else 0.0
        return sum(n for _, n in self._window[1:]) / span if span > 0 else 0.0


def block_map(kv) -> tuple[str, list[str]]:
    """One character per physical block, so a pool of thousands of blocks crosses to the page as one
    string: "f" free, "c" cached (free but holding a prefix), "s" shared by several sequences, or
    chr(0x100 + k) for a block owned by the chat `owners[k]` alone. Returns (cells, owners)."""
    pool = kv.pool
    cells = ["c" if b.block_hash is not None else "f" for b in pool.block_states()]
    owners: list[str] = []
    for seq in kv.live.values():
        if seq.status is not SequenceStatus.RUNNING:
            continue
        if seq.session not in owners:
            owners.append(seq.session)
        mark = chr(0x100 + owners.index(seq.session))
        for bid in seq.block_table:
            cells[bid] = mark if pool.ref_count(bid) == 1 else "s"
    return "".join(cells), owners


def memory_snapshot(engine, model_name: str, tokens_per_s: float, ledger: dict | None) -> dict:
    """Block map + metrics for the dashboard."""
    kv = engine.kv
    cells, owners = block_map(kv)
    stats = kv_stats(kv)
    return {
        "model": model_name, "block_size": kv.block_size, "cells": cells, "owners": owners,
        "total_blocks": stats.total_blocks, "used_blocks": stats.used_blocks,
        "free_blocks": stats.free_blocks, "cached_blocks": stats.cached_blocks,
        "utilization": stats.utilization, "slot_efficiency": stats.slot_efficiency,
        "sharing_factor": stats.sharing_factor, "tokens_stored": stats.physical_tokens,
        "per_chat_blocks": stats.per_session_blocks, "prefix_hit_rate": kv.prefix_hit_rate,
        "tokens_per_s": tokens_per_s, "engine": engine.stats(), "ledger": ledger,
    }
