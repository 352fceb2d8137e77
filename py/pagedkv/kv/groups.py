"""KV groups: which layers share a block table (vLLM v1's hybrid allocator, uniform page size).

A model whose layers all see the whole context keeps one block table per sequence for every layer. A model with
sliding-window layers (Gemma 3: a query at position p sees the keys p - k < W in 5 of every 6 layers) need not
hold a window layer's keys once every query has moved past them, so its layers are grouped by attention kind
(full, or each window size) and every group gets a block table of its own in the one shared BlockPool.

One page size serves every group: the groups have EQUAL layer counts (the gcd of the kinds' layer counts; Gemma 3
270M's 3 full + 15 window layers -> 1 full group + 5 window groups of 3), and a page (one block id) holds K and V
of `group_size` layers for block_size tokens. Layer l lives in group g at slot j (its index in g): a backend
keeps `group_size` per-slot pools, not one per layer, and layer l reads and writes slot j of its group's blocks.
A model without windows is one group of all its layers: exactly the layout, the block ids and the byte figures
it had before groups existed. `KVGroups.flat` puts any model in that layout (every layer holds everything).

Full groups come first (group 0 holds the whole context, so `Sequence.block_table` is the full table it always
was), then the window groups by window size; within a kind, layers in order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

__all__ = ["KVGroup", "KVGroups", "first_needed_block"]


def first_needed_block(window: int | None, next_query: int, block_size: int) -> int:
    """Table index of the first block a query at position `next_query` (and every later one) may still read under
    `window`: every key before it has p - k >= W (0 for full attention, window None)."""
    if window is None:
        return 0
    return max(0, (next_query - window + 1) // block_size)


@dataclass(frozen=True)
class KVGroup:
    """The layers sharing one block table; window: None (full attention) or W (a query at p sees p - k < W)."""

    window: int | None
    layers: tuple[int, ...]

    def blocks_needed(self, num_tokens: int, chunk: int, block_size: int) -> int:
        """The most blocks this group holds for a sequence of `num_tokens` computed in chunks of at most `chunk`
        tokens: all of them for full attention; for a window, the blocks a chunk's first query still sees plus
        the chunk's (ceil((W - 1 + chunk) / B) + 1), never more than all."""
        total = -(-num_tokens // block_size)
        if self.window is None:
            return total
        return min(total, -(-(self.window - 1 + chunk) // block_size) + 1)



@dataclass(frozen=True)
class KVGroups:
    """A model's layers in groups of equal size (module docstring)."""

    groups: tuple[KVGroup, ...]

    def __post_init__(self) -> None:
        sizes = {len(g.layers) for g in self.groups}
        if not self.groups or len(sizes) != 1:
            raise ValueError(f"KV groups must be non-empty and of equal layer counts, got {sorted(sizes)}")
        layers = sorted(layer for g in self.groups for layer in g.layers)
        if layers != list(range(len(layers))):
            raise ValueError(f"KV groups must hold every layer once, got {layers}")

    @classmethod
    def of(cls, config) -> KVGroups:
        """The groups of a model config (anything with `layers`, each with attention.window): by attention kind,
        full first, then windows by size, split into groups of the gcd of the kinds' layer counts."""
        kinds: dict[int | None, list[int]] = {}
        for i, layer in enumerate(config.layers):
            kinds.setdefault(layer.attention.window, []).append(i)
        size = math.gcd(*(len(v) for v in kinds.values()))
        order = sorted(kinds, key=lambda w: (w is not None, w or 0))
        return cls(tuple(KVGroup(w, tuple(kinds[w][i:i + size])) for w in order
                         for i in range(0, len(kinds[w]), size)))

    @classmethod
    def flat(cls, num_layers: int) -> KVGroups:
        """One full-attention group of every layer: every layer holds the whole context (today's layout)."""
        return cls((KVGroup(None, tuple(range(num_layers))),))

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def group_size(self) -> int:
        """Layers per group: the layers one page holds."""
        return len(self.groups[0].layers)

    @property
    def num_layers(self) -> int:
        return self.group_size * self.num_groups

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Each group's window (None: full attention)."""
        return tuple(g.window for g in self.groups)

    @property
    def has_windows(self) -> bool:
        """Whether some group holds only a window (its tables then use the null block)."""
        return any(w is not None for w in self.windows)

    @property
    def is_hybrid(self) -> bool:
        """More than one group: what the code that keeps one block table per sequence refuses."""
        return self.num_groups > 1

    def where(self, layer: int) -> tuple[int, int]:
        """(group, slot) of decoder layer `layer`."""
        return self._where[layer]

    @cached_property
    def _where(self) -> dict[int, tuple[int, int]]:
        return {layer: (g, j) for g, group in enumerate(self.groups) for j, layer in enumerate(group.layers)}

    def blocks_needed(self, num_tokens: int, chunk: int, block_size: int) -> int:
        """Pages a sequence of `num_tokens` (computed in chunks of at most `chunk`) holds at most, every group."""
        return sum(g.blocks_needed(num_tokens, chunk, block_size) for g in self.groups)

    def describe(self) -> list[str]:
        """One label per group for the memory panel: "full" or "window 512"."""
        return ["full" if w is None else f"window {w}" for w in self.windows]
