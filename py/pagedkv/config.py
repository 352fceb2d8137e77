"""Frozen configuration, validated on construction: KV cache sizing, the scheduler, the engine."""

from __future__ import annotations

from dataclasses import dataclass

from .kv.dtypes import DEFAULT_KV_DTYPE, kv_dtype as lookup_kv_dtype
from .kv.retention import KVRetention

ALLOWED_BLOCK_SIZES = (8, 16, 32, 64)
PREEMPTION_MODES = ("auto", "swap", "recompute")


def _require_int(name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; True blocks would be a silent bug.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class CacheConfig:
    """Shape of one paged KV pool.

    block_size: tokens per physical block; a power of two in ALLOWED_BLOCK_SIZES.
    num_blocks: physical GPU blocks (computed from the byte budget by the caller).
    num_cpu_blocks: blocks of the CPU swap pool (0 disables swapping).
    enable_prefix_caching: keep full blocks addressable by their prefix hash.
    demote_to_cpu: the CPU pool is a tier of the prefix cache: cached GPU blocks a GPU allocation evicts are
        demoted there and promoted back on a GPU miss (kv/cpu_tier.py; the engine turns it on).
    kv_dtype: element type of the KV cache, a name of pagedkv.kv.dtypes (f32, f16, int8, fp8-e4m3, int4, int4-asym).
    """

    num_blocks: int
    block_size: int = 16
    num_cpu_blocks: int = 0
    enable_prefix_caching: bool = True
    kv_dtype: str = DEFAULT_KV_DTYPE
    demote_to_cpu: bool = False

    def __post_init__(self) -> None:
        _require_int("block_size", self.block_size, 1)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.block_size not in ALLOWED_BLOCK_SIZES:
            raise ValueError(
                f"block_size must be one of {ALLOWED_BLOCK_SIZES}, got {self.block_size}")
        _require_int("num_blocks", self.num_blocks, 1)
        _require_int("num_cpu_blocks", self.num_cpu_blocks, 0)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError("enable_prefix_caching must be a bool")
        if not isinstance(self.demote_to_cpu, bool):
            raise ValueError("demote_to_cpu must be a bool")
        lookup_kv_dtype(self.kv_dtype)

    @classmethod
    def from_budget(cls, budget_bytes: int, bytes_per_token: int, block_size: int = 16,
                    num_cpu_blocks: int = 0, enable_prefix_caching: bool = True,
                    kv_dtype: str = DEFAULT_KV_DTYPE) -> "CacheConfig":
        """Largest pool of `block_size`-token blocks that fits in `budget_bytes`."""
        _require_int("budget_bytes", budget_bytes, 1)
        _require_int("bytes_per_token", bytes_per_token, 1)
        _require_int("block_size", block_size, 1)
        num_blocks = budget_bytes // (bytes_per_token * block_size)
        if num_blocks < 1:
            raise ValueError(
                f"budget of {budget_bytes} B holds no block of {block_size} tokens x "
                f"{bytes_per_token} B/token; raise the budget or shrink the block")
        return cls(num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                   enable_prefix_caching=enable_prefix_caching, kv_dtype=kv_dtype)


@dataclass(frozen=True)
class SchedulerConfig:
    """max_num_batched_tokens: token budget of one step; max_num_seqs: sequences per step.

    preemption: "swap", "recompute", or "auto" (swap when the victim holds at most
    swap_max_blocks blocks and the CPU pool has room, else recompute).
    """

    max_num_batched_tokens: int = 256
    max_num_seqs: int = 16
    preemption: str = "auto"
    swap_max_blocks: int = 64

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {self.preemption!r}")
        if not isinstance(self.swap_max_blocks, int) or self.swap_max_blocks < 0:
            raise ValueError(f"swap_max_blocks must be an int >= 0, got {self.swap_max_blocks!r}")


@dataclass(frozen=True)
class EngineConfig(SchedulerConfig):
    """Engine-wide settings: the scheduler's (inherited, so EngineConfig(max_num_seqs=4) works) and these.
    The pool size comes from the backend (it was derived from the GPU budget)."""

    enable_prefix_caching: bool = True
    namespace: str | None = None  # mixed into prefix hashes (e.g. the model id)
    max_context: int | None = None  # tokens per conversation (prompt + reply); None: the model's context
    retention: KVRetention | None = None  # default sliding window / eviction of every request
    kv_dtype: str | None = None  # KV cache dtype the backend must hold (pagedkv.kv.dtypes); None: the backend's
    # Submit decode step n + 1 before reading step n's ids where the backend can (decode_chain.py)
    pipeline_decode: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        if not isinstance(self.pipeline_decode, bool):
            raise ValueError(f"pipeline_decode must be a bool, got {self.pipeline_decode!r}")
        if self.namespace is not None and not isinstance(self.namespace, str):
            raise ValueError(f"namespace must be a str or None, got {self.namespace!r}")
        if self.kv_dtype is not None:
            lookup_kv_dtype(self.kv_dtype)
        if self.max_context is not None and (not isinstance(self.max_context, int) or self.max_context < 2):
            raise ValueError(f"max_context must be an int >= 2 or None, got {self.max_context!r}")
        if self.retention is not None and not isinstance(self.retention, KVRetention):
            raise ValueError(f"retention must be a KVRetention or None, got {self.retention!r}")
