"""KVSpec: one model's KV geometry and element type, the one place its sizes come from.

Everything that sizes or keys a KV cache reads it from here: the engine's byte figures, the GPU pool's
per-layer buffers, the disk tier's file key, several models sharing one byte budget (accounting.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .dtypes import DEFAULT_KV_DTYPE, KV_DTYPES, KVDtype
from .dtypes import kv_dtype as lookup_kv_dtype

__all__ = ["KVSpec", "PLAIN_ELEMENT_BYTES", "SMOLLM2_135M"]

# Unquantized element sizes, valid for any head_dim; bf16 only sizes other engines' caches (bench/kv_sim.py).
PLAIN_ELEMENT_BYTES = {"f16": 2, "bf16": 2, "f32": 4}


@dataclass(frozen=True)
class KVSpec:
    """The KV cache of one model: layers, KV heads, head dim, tokens per block and element type."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16
    dtype: str = DEFAULT_KV_DTYPE
    # Layers one page (block id) holds: a KV group's (kv/groups.py); None: every layer (one group).
    layers_per_page: int | None = None

    def __post_init__(self) -> None:
        for attr in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            v = getattr(self, attr)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{attr} must be a positive int, got {v!r}")
        if self.dtype not in KV_DTYPES and self.dtype not in PLAIN_ELEMENT_BYTES:
            raise ValueError(f"kv_dtype must be one of {sorted([*KV_DTYPES, 'bf16'])}, got {self.dtype!r}")
        lpp = self.layers_per_page
        if lpp is not None and (not isinstance(lpp, int) or isinstance(lpp, bool) or lpp < 1
                                or self.num_layers % lpp):
            raise ValueError(f"layers_per_page must be None or a positive divisor of {self.num_layers}, got {lpp!r}")

    @classmethod
    def of(cls, config, *, block_size: int = 16, dtype: str = DEFAULT_KV_DTYPE, groups=None) -> KVSpec:
        """The spec of a model config (anything with n_layers, n_kv_heads and head_dim); groups: its
        kv.groups.KVGroups when it has several (a page then holds one group's layers)."""
        lpp = groups.group_size if groups is not None and groups.is_hybrid else None
        return cls(config.n_layers, config.n_kv_heads, config.head_dim, block_size, dtype, lpp)

    def with_(self, **changes) -> KVSpec:
        """This spec with other fields (block_size=, dtype=)."""
        return replace(self, **changes)

    @property
    def element(self) -> KVDtype:
        """The registry entry of dtype (pagedkv.kv.dtypes); ValueError for bf16, which only sizes."""
        return lookup_kv_dtype(self.dtype)

    @property
    def token_u32s(self) -> int:
        """u32 words of one token of one cache (K or V) of one layer: data, scales, padding to 4 words."""
        return self.element.token_u32s(self.num_kv_heads, self.head_dim)

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x the bytes one token of one layer's cache takes: kv_heads x head_dim x bytes
        per element, plus scales and padding for the quantized dtypes."""
        if self.dtype in PLAIN_ELEMENT_BYTES:  # any head_dim (the simulator sizes other engines' models too)
            return 2 * self.num_layers * self.num_kv_heads * self.head_dim * PLAIN_ELEMENT_BYTES[self.dtype]
        return 2 * self.num_layers * self.token_u32s * 4

    @property
    def page_layers(self) -> int:
        """Layers one page holds: layers_per_page, or every layer."""
        return self.layers_per_page or self.num_layers

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one page: K and V of block_size tokens in page_layers layers (every layer with one group)."""
        return self.bytes_per_token * self.page_layers // self.num_layers * self.block_size


SMOLLM2_135M = KVSpec(num_layers=30, num_kv_heads=3, head_dim=64)
