"""KV memory accounting: bytes per token, pool metrics, several models under one byte budget."""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import CacheConfig
from .kv_cache_manager import KVCacheManager
from .sequence import SequenceStatus

KV_DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4}


@dataclass(frozen=True)
class KVShape:
    """The part of a model config that sizes its KV cache."""
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for attr in ("num_layers", "num_kv_heads", "head_dim"):
            v = getattr(self, attr)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{attr} must be a positive int, got {v!r}")
        if not self.name:
            raise ValueError("a KVShape needs a non-empty name (it namespaces prefix hashes)")


SMOLLM2_135M = KVShape("SmolLM2-135M-Instruct", num_layers=30, num_kv_heads=3, head_dim=64)


def bytes_per_token(model, kv_dtype: str = "f16") -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per element.
    `model` is anything with num_layers, num_kv_heads and head_dim."""
    if kv_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPE_BYTES)}, got {kv_dtype!r}")
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * KV_DTYPE_BYTES[kv_dtype]


@dataclass(frozen=True)
class KVStats:
    """Snapshot of one pool. Token counts are KV slots, not bytes."""
    total_blocks: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    utilization: float          # used / total
    slot_efficiency: float      # tokens stored in used blocks / slots of used blocks
    sharing_factor: float       # logical tokens over live sequences / physical tokens stored
    logical_tokens: int
    physical_tokens: int
    per_session_blocks: dict[str, int] = field(default_factory=dict)  # distinct blocks per session


def kv_stats(manager: KVCacheManager) -> KVStats:
    """Metrics of `manager`'s GPU pool over its live (GPU-resident) sequences."""
    pool, bs = manager.pool, manager.block_size
    fill: dict[int, int] = {}          # block id -> slots holding a token (max over owners)
    per_session: dict[str, set[int]] = {}
    logical = 0
    for seq in manager.live.values():
        if seq.status is not SequenceStatus.RUNNING:
            continue
        logical += seq.num_kv_tokens
        owned = per_session.setdefault(seq.session, set())
        for i, bid in enumerate(seq.block_table):
            n = min(bs, seq.num_kv_tokens - i * bs)
            if n > fill.get(bid, 0):
                fill[bid] = n
            owned.add(bid)
    physical = sum(fill.values())
    used = pool.num_used
    return KVStats(
        total_blocks=pool.num_blocks, used_blocks=used, free_blocks=pool.num_free,
        cached_blocks=pool.num_cached, utilization=used / pool.num_blocks,
        slot_efficiency=physical / (used * bs) if used else 1.0,
        sharing_factor=logical / physical if physical else 1.0,
        logical_tokens=logical, physical_tokens=physical,
        per_session_blocks={s: len(b) for s, b in sorted(per_session.items())})


class SharedKVBudget:
    """Several models (different bytes per token) carved out of one byte budget.

    Each model gets its own pool (its KV buffers have a different layout), sized
    from its share of the budget; the ledger reports bytes per model and per
    session across models, and never hands out more bytes than the budget.
    The split is fixed when a model is added (no rebalancing between pools).
    """

    def __init__(self, budget_bytes: int, block_size: int = 16) -> None:
        if not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise ValueError(f"budget_bytes must be a positive int, got {budget_bytes!r}")
        CacheConfig(num_blocks=1, block_size=block_size)  # validates block_size
        self.budget_bytes = budget_bytes
        self.block_size = block_size
        self.managers: dict[str, KVCacheManager] = {}
        self.block_bytes: dict[str, int] = {}

    @property
    def reserved_bytes(self) -> int:
        """Bytes of all pools created so far."""
        return sum(self.managers[m].pool.num_blocks * self.block_bytes[m] for m in self.managers)

    def add_model(self, model: KVShape, kv_dtype: str, budget_bytes: int) -> KVCacheManager:
        """Create `model`'s pool with `budget_bytes` of the remaining budget."""
        if model.name in self.managers:
            raise ValueError(f"model {model.name!r} already has a pool")
        remaining = self.budget_bytes - self.reserved_bytes
        if not isinstance(budget_bytes, int) or not 0 < budget_bytes <= remaining:
            raise ValueError(f"budget_bytes for {model.name!r} must be in (0, {remaining}] "
                             f"(what is left of the {self.budget_bytes} B budget), got "
                             f"{budget_bytes!r}")
        bpt = bytes_per_token(model, kv_dtype)
        cfg = CacheConfig.from_budget(budget_bytes, bpt, self.block_size)
        self.managers[model.name] = KVCacheManager(cfg, namespace=f"{model.name}/{kv_dtype}")
        self.block_bytes[model.name] = bpt * self.block_size
        return self.managers[model.name]

    def used_bytes(self) -> dict[str, int]:
        """Bytes in used blocks per model."""
        return {m: mgr.pool.num_used * self.block_bytes[m] for m, mgr in self.managers.items()}

    def session_bytes(self) -> dict[str, int]:
        """Bytes of distinct blocks each session holds, summed over models."""
        out: dict[str, int] = {}
        for m, mgr in self.managers.items():
            for session, n in kv_stats(mgr).per_session_blocks.items():
                out[session] = out.get(session, 0) + n * self.block_bytes[m]
        return dict(sorted(out.items()))
