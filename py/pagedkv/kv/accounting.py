"""KV memory accounting: pool metrics, several models under one byte budget (sizes come from spec.KVSpec)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import ALLOWED_BLOCK_SIZES, CacheConfig
from ..sequence import SequenceStatus
from .block_pool import BlockPool
from .groups import KVGroups
from .manager import KVCacheManager
from .spec import KVSpec


@dataclass(frozen=True)
class KVStats:
    """Snapshot of one manager. Token counts are KV slots, not bytes.

    total/free/cached are pool-wide; used counts the blocks this manager's
    running sequences hold (the pool's used count when the pool is not shared), every KV group's;
    group_used_blocks splits it by group (kv/groups.py; one entry for a model without window layers).
    Logical tokens count a token once per group whose table holds it.
    """
    total_blocks: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    utilization: float          # used / total
    slot_efficiency: float      # tokens stored in used blocks / slots of used blocks
    sharing_factor: float       # logical tokens over running sequences / physical tokens stored
    logical_tokens: int
    physical_tokens: int
    per_session_blocks: dict[str, int] = field(default_factory=dict)  # distinct blocks per session
    group_used_blocks: tuple[int, ...] = ()  # distinct blocks per KV group


def kv_stats(manager: KVCacheManager) -> KVStats:
    """Metrics of `manager` over its running (GPU-resident) sequences."""
    pool, bs = manager.pool, manager.block_size
    fill: dict[int, int] = {}          # block id -> slots holding a token (max over owners)
    per_session: dict[str, set[int]] = {}
    per_group: list[set[int]] = [set() for _ in range(manager.num_groups)]
    logical = 0
    null = manager.null_block
    for seq in manager.live.values():
        if seq.status is not SequenceStatus.RUNNING:
            continue
        owned = per_session.setdefault(seq.session, set())
        for g, table in enumerate(seq.block_tables):
            for i, bid in enumerate(table):
                if bid == null:  # out of a window group's window
                    continue
                n = min(bs, seq.num_kv_tokens - i * bs)
                logical += n
                if n > fill.get(bid, 0):
                    fill[bid] = n
                owned.add(bid)
                per_group[g].add(bid)
    physical = sum(fill.values())
    used = len(fill)
    return KVStats(
        total_blocks=pool.num_blocks, used_blocks=used, free_blocks=pool.num_free,
        cached_blocks=pool.num_cached, utilization=used / pool.num_blocks,
        slot_efficiency=physical / (used * bs) if used else 1.0,
        sharing_factor=logical / physical if physical else 1.0,
        logical_tokens=logical, physical_tokens=physical,
        per_session_blocks={s: len(b) for s, b in sorted(per_session.items())},
        group_used_blocks=tuple(len(b) for b in per_group))


class SharedKVBudget:
    """Several models (different bytes per token) drawing blocks from one byte budget.

    The budget is one pool of equal pages of `page_bytes`; each model's block is one page, holding the largest
    block size of ALLOWED_BLOCK_SIZES whose K/V fits (vLLM v1's hybrid allocator: one page size for every KV
    group, each group's block size chosen so a block fills a page). When the widths do not divide, a block
    leaves the end of its page unused: page_fill says how much of it a model uses. page_bytes_for picks the
    page that gives the widest model `block_size` tokens (page 16 x 46,080 B: SmolLM2 f32 sees 16-token blocks,
    f16 32-token blocks). Models take pages from the same free queue and a fresh allocation evicts the least
    recently freed cached page of whichever model, so memory moves to the model that needs it. Prefix hashes
    carry the model and dtype, so pages are never shared across models.
    """

    def __init__(self, budget_bytes: int, page_bytes: int) -> None:
        for name, v in (("budget_bytes", budget_bytes), ("page_bytes", page_bytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if budget_bytes < page_bytes:
            raise ValueError(f"budget of {budget_bytes} B holds no page of {page_bytes} B")
        self.budget_bytes = budget_bytes
        self.page_bytes = page_bytes
        self.pool = BlockPool(budget_bytes // page_bytes)
        self.managers: dict[str, KVCacheManager] = {}
        self._bpt: dict[str, int] = {}

    @staticmethod
    def page_bytes_for(bytes_per_token: list[int], block_size: int = 16, align: int = 1) -> int:
        """The page giving the widest model (most bytes per token) blocks of `block_size` tokens, rounded up to
        a multiple of `align` (a CPU backend's per-layer block bytes, so its pools stay views of the pages)."""
        if not bytes_per_token:
            raise ValueError("no model to size a page for")
        page = block_size * max(bytes_per_token)
        return -(-page // align) * align

    @staticmethod
    def block_size_in(page_bytes: int, bytes_per_token: int, name: str = "a model") -> int:
        """The largest block size of ALLOWED_BLOCK_SIZES whose tokens fit a page; ValueError when none does."""
        fitting = [bs for bs in ALLOWED_BLOCK_SIZES if bs * bytes_per_token <= page_bytes]
        if not fitting:
            raise ValueError(f"a page of {page_bytes:,} B holds {page_bytes // bytes_per_token} {name} tokens "
                             f"({bytes_per_token:,} B each); pick page_bytes so it holds at least "
                             f"{ALLOWED_BLOCK_SIZES[0]} (e.g. {16 * bytes_per_token:,} B)")
        return max(fitting)

    def add_model(self, name: str, spec: KVSpec, bytes_per_token: int | None = None,
                  groups: KVGroups | None = None) -> KVCacheManager:
        """A cache manager for model `name` (KV as `spec`, whose block size the page decides) that allocates
        from the shared pages. bytes_per_token: what a token takes where the pages live, in every layer
        (default the spec's; a CPU backend keeps f32 whatever the dtype). groups: the model's KV groups when it
        has window layers (groups.py): a page then holds one group's layers, so its blocks hold more tokens,
        and the model reserves one null page of the pool (KVCacheManager)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a model sharing the budget needs a non-empty name (it namespaces prefix hashes), "
                             f"got {name!r}")
        key = f"{name}/{spec.dtype}"
        if key in self.managers:
            raise ValueError(f"{key} already has a manager")
        hybrid = groups is not None and groups.is_hybrid
        if hybrid and groups.num_layers != spec.num_layers:
            raise ValueError(f"{key}: its KV groups hold {groups.num_layers} layers, its spec {spec.num_layers}")
        bpt = (bytes_per_token or spec.bytes_per_token) // spec.num_layers * (
            groups.group_size if hybrid else spec.num_layers)  # a token's bytes in one page
        block_size = self.block_size_in(self.page_bytes, bpt, key)
        cfg = CacheConfig(num_blocks=self.pool.num_blocks, block_size=block_size)
        self.managers[key] = KVCacheManager(cfg, namespace=key, pool=self.pool, groups=groups if hybrid else None)
        self._bpt[key] = bpt
        return self.managers[key]

    def page_fill(self) -> dict[str, float]:
        """The share of a page each model's block uses (1.0 when its width divides the page)."""
        return {k: m.block_size * self._bpt[k] / self.page_bytes for k, m in self.managers.items()}

    def used_bytes(self) -> dict[str, int]:
        """Bytes of pages held by each model's running sequences."""
        return {k: kv_stats(m).used_blocks * self.page_bytes for k, m in self.managers.items()}

    def session_bytes(self) -> dict[str, int]:
        """Bytes of distinct pages each session holds, summed over models."""
        out: dict[str, int] = {}
        for m in self.managers.values():
            for session, n in kv_stats(m).per_session_blocks.items():
                out[session] = out.get(session, 0) + n * self.page_bytes
        return dict(sorted(out.items()))


def block_map(manager: KVCacheManager, others: tuple[KVCacheManager, ...] = ()) -> dict:
    """Plain data of the GPU block pool for the memory panel: `cells`, one character per physical block (so
    thousands of blocks cross to the page as one string): "f" free, "c" cached (free but holding a prefix),
    "s" shared by several sequences, or chr(0x100 + k) for a block the session `owners[k]` alone holds; then
    the pool's usage (kv_stats of `manager`). others: the managers of other models on the same pool (one budget):
    their sessions are owners too, `owner_of[k]` says whose (0: manager's, i: others[i - 1]'s), and
    `used_blocks` and `per_chat_blocks` count every model's."""
    pool = manager.pool
    cells = ["c" if b.block_hash is not None else "f" for b in pool.block_states()]
    owners: list[str] = []
    owner_of: list[int] = []
    for k, m in enumerate((manager, *others)):
        for seq in m.live.values():
            if seq.status is not SequenceStatus.RUNNING:
                continue
            if seq.session not in owners:
                owners.append(seq.session)
                owner_of.append(k)
            mark = chr(0x100 + owners.index(seq.session))
            for bid in m.held_blocks(seq):
                cells[bid] = mark if pool.ref_count(bid) == 1 else "s"
    stats = kv_stats(manager)
    used, per_chat = stats.used_blocks, dict(stats.per_session_blocks)
    for m in others:
        other = kv_stats(m)
        used += other.used_blocks
        per_chat.update(other.per_session_blocks)
    snap = {
        "block_size": manager.block_size, "cells": "".join(cells), "owners": owners,
        "total_blocks": stats.total_blocks, "used_blocks": used,
        "free_blocks": stats.free_blocks, "cached_blocks": stats.cached_blocks,
        "utilization": stats.utilization, "slot_efficiency": stats.slot_efficiency,
        "sharing_factor": stats.sharing_factor, "tokens_stored": stats.physical_tokens,
        "per_chat_blocks": per_chat, "prefix_hit_rate": manager.prefix_hit_rate,
        # KV groups (kv/groups.py): each group's label and the blocks its tables hold (the first model's)
        "groups": manager.groups.describe() if manager.groups is not None else ["full"],
        "group_used_blocks": list(stats.group_used_blocks),
    }
    if manager.null_block is not None:
        snap["null_block"] = manager.null_block  # reserved: the placeholder of released window entries
    if others:
        snap["owner_of"] = owner_of
    return snap
