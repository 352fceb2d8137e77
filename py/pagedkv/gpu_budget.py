"""The GPU memory ledger: every buffer the engine creates is reserved here first.

A tab gets roughly 1-2 GiB of GPU memory and the browser does not stop a page
that asks for more: it loses the device. So the engine never relies on the
browser: it reserves each buffer's bytes in this ledger before creating it,
and a reservation that would exceed the budget raises `BudgetExceeded` while
leaving the ledger unchanged. The KV pool gets what remains after weights,
activations and staging (`kv_blocks_that_fit`).
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20
KINDS = ("weights", "kv", "scratch", "staging")
# WebGPU buffer sizes are rounded up to 4 bytes; we account 16 so uniform buffers are covered too.
BUFFER_GRANULE = 16


class BudgetExceeded(MemoryError):
    """A GPU allocation would exceed the configured budget; nothing was allocated."""


def rounded(nbytes: int) -> int:
    return max(BUFFER_GRANULE, -(-nbytes // BUFFER_GRANULE) * BUFFER_GRANULE)


@dataclass(frozen=True)
class Reservation:
    label: str
    kind: str
    nbytes: int


class GpuLedger:
    """Byte accounting of GPU buffers against a fixed budget."""

    def __init__(self, budget_bytes: int) -> None:
        if not isinstance(budget_bytes, int) or budget_bytes <= 0:
            raise ValueError(f"GPU budget must be a positive number of bytes, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self._live: dict[str, Reservation] = {}
        self._peak = 0

    @property
    def used_bytes(self) -> int:
        return sum(r.nbytes for r in self._live.values())

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.used_bytes

    @property
    def peak_bytes(self) -> int:
        return self._peak

    def reserve(self, label: str, nbytes: int, kind: str) -> Reservation:
        """Account `nbytes` (rounded to the buffer granule) under a unique label, or raise BudgetExceeded."""
        if kind not in KINDS:
            raise ValueError(f"unknown buffer kind {kind!r}; expected one of {KINDS}")
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"buffer {label!r} needs a positive byte size, got {nbytes!r}")
        if label in self._live:
            raise ValueError(f"buffer label {label!r} is already reserved")
        size = rounded(nbytes)
        if size > self.free_bytes:
            raise BudgetExceeded(
                f"GPU buffer {label!r} ({kind}) needs {size:,} bytes but only {self.free_bytes:,} of the "
                f"{self.budget_bytes:,}-byte budget are free ({self.summary_line()})"
            )
        res = Reservation(label, kind, size)
        self._live[label] = res
        self._peak = max(self._peak, self.used_bytes)
        return res

    def release(self, label: str) -> None:
        """Forget a destroyed buffer's bytes."""
        if label not in self._live:
            raise KeyError(f"no live GPU buffer labelled {label!r}")
        del self._live[label]

    def by_kind(self) -> dict[str, int]:
        totals = dict.fromkeys(KINDS, 0)
        for r in self._live.values():
            totals[r.kind] += r.nbytes
        return totals

    def summary_line(self) -> str:
        parts = ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in self.by_kind().items())
        return f"{parts}; used {self.used_bytes / MIB:.1f} of {self.budget_bytes / MIB:.1f} MiB"

    def snapshot(self) -> dict:
        """Plain-data view for the dashboard and tests."""
        return {"budget_bytes": self.budget_bytes, "used_bytes": self.used_bytes, "free_bytes": self.free_bytes,
                "peak_bytes": self.peak_bytes, "by_kind": self.by_kind(), "buffers": len(self._live)}


def kv_blocks_that_fit(free_bytes: int, bytes_per_block: int, max_binding_bytes: int, num_layers: int) -> int:
    """Number of KV blocks that fit in `free_bytes` when each layer's K and V live in their own buffers.

    Each layer holds 2 buffers (K and V) of num_blocks * bytes_per_block / (2 * num_layers) bytes; none may
    exceed the adapter's maxStorageBufferBindingSize.
    """
    if bytes_per_block <= 0 or num_layers <= 0:
        raise ValueError("bytes_per_block and num_layers must be positive")
    per_buffer_per_block = bytes_per_block // (2 * num_layers)
    if per_buffer_per_block * 2 * num_layers != bytes_per_block:
        raise ValueError(f"bytes_per_block {bytes_per_block} is not divisible by 2 x {num_layers} layers")
    by_budget = free_bytes // bytes_per_block
    by_binding = max_binding_bytes // per_buffer_per_block
    return max(0, min(by_budget, by_binding))
