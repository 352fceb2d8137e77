"""Which KV blocks a conversation keeps: sliding window with attention sinks, importance eviction.

Policy only (pure functions over a Sequence); the cache manager frees the blocks.

StreamingLLM window: the first `sink_tokens` tokens (rounded up to whole blocks)
stay forever; of the rest, the blocks of the most recent `window_tokens` tokens
(plus the block being filled) stay, and every block that falls out of the window
goes back to the pool at once. A sequence holds at most
ceil((S + W) / block_size) + 1 blocks, whatever its length, so a conversation
runs past any context limit. Each token sees the sinks plus between W + 1 and
W + block_size of the most recent tokens (itself included).

H2O eviction (block granular): every forward adds each cached block's attention
mass (softmax probability in the last layer, summed over heads and the step's
query tokens) to the sequence's `block_scores` (KVCacheManager.add_attention_mass, their
owner); under pool pressure the scheduler evicts the lowest-scoring blocks that are neither
sinks nor among the last `recent_tokens` tokens, instead of preempting the whole conversation.

Positions (RoPE), documented choice: "shifted" (default) is StreamingLLM's
choice: a token's rotary position is its index in the cache, not in the text;
when blocks drop out of the middle, the cached keys after them are re-rotated by
the number of tokens dropped (RoPE rotations compose: R(p - d) = R(-d) R(p)),
like llama.cpp's context shift. Positions then never exceed the cache length,
which stays inside the model's trained context (and the GPU's RoPE table) in an
endless chat. "original" keeps every token's position in the text: no key is
ever touched, but the query sees sinks at distances the model never trained on
once the chat passes its context, and positions grow past the RoPE table of the
WebGPU backend (which refuses them). bench/kv_quality_window.py measures both.

KV groups (kv/groups.py: a model with sliding-window layers, Gemma 3): the policy binds the full-attention
group, and every group's table loses the same indices (the tables are positional in one cache index space). A
window layer's mask counts cache indices too (in "shifted" mode they are its positions), so it sees the W most
recent cached keys: a request window narrower than the model's window applies to the window layers as well
(they then see the sinks and the request's window), a wider one leaves them their own window. A window group
keeps the leading entries a drop could bring back into its view (pinned_blocks): the sinks under a request
window at most W - 2, every entry under importance eviction (which drops blocks from anywhere in the middle).
Shifted keys are re-rotated per group, each layer with its own rotary base (ShiftOp.group). Eviction's scores
come from the last layer and are kept by the full group's block ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..sequence import Sequence

POSITION_MODES = ("shifted", "original")


class ShiftOp(NamedTuple):
    """Re-rotate every cached key of block `block` by -`delta` positions: every layer of KV group `group` (each
    with its own rotary frequencies; group 0 of a model without window layers is every layer)."""
    block: int
    delta: int
    group: int = 0


def check_shift_groups(ops: list[ShiftOp], num_groups: int) -> None:
    """ValueError unless every op names one of a backend's `num_groups` KV groups (a backend shifts by group)."""
    bad = [op for op in ops if not 0 <= op.group < num_groups]
    if bad:
        raise ValueError(f"{bad[0]} names KV group {bad[0].group}; this backend's pool holds {num_groups} "
                         "group(s): the engine builds shifts from its manager's groups")


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class KVRetention:
    """Per-request (or engine default) retention policy.

    window_tokens: W, most recent tokens kept by the sliding window (None: no window); a multiple of the
        block size, because only whole blocks are freed.
    sink_tokens: S, first tokens never dropped nor evicted (rounded up to whole blocks).
    evict: importance (H2O) eviction of non-sink, non-recent blocks under pool pressure.
    recent_tokens: the most recent tokens eviction never touches (rounded up to whole blocks).
    positions: "shifted" or "original" (see the module docstring).
    """

    window_tokens: int | None = None
    sink_tokens: int = 4
    evict: bool = False
    recent_tokens: int = 64
    positions: str = "shifted"

    def __post_init__(self) -> None:
        _check_int("sink_tokens", self.sink_tokens, 0)
        _check_int("recent_tokens", self.recent_tokens, 1)
        if self.window_tokens is not None:
            _check_int("window_tokens", self.window_tokens, 1)
            if self.window_tokens < self.sink_tokens:
                raise ValueError(f"window_tokens ({self.window_tokens}) is smaller than sink_tokens "
                                 f"({self.sink_tokens}); the window must hold at least the sinks")
        if not isinstance(self.evict, bool):
            raise ValueError(f"evict must be a bool, got {self.evict!r}")
        if self.window_tokens is None and not self.evict:
            raise ValueError("a KVRetention needs window_tokens or evict=True (else keep everything: pass None)")
        if self.positions not in POSITION_MODES:
            raise ValueError(f"positions must be one of {POSITION_MODES}, got {self.positions!r}")

    def check_block_size(self, block_size: int) -> None:
        """Raise ValueError unless the window is a whole number of `block_size`-token blocks."""
        if self.window_tokens is not None and self.window_tokens % block_size:
            lo = self.window_tokens // block_size * block_size
            raise ValueError(f"window_tokens ({self.window_tokens}) must be a multiple of the block size "
                             f"({block_size}): whole blocks are freed; use {lo or block_size} or "
                             f"{lo + block_size}")

    def sink_blocks(self, block_size: int) -> int:
        return -(-self.sink_tokens // block_size)

    def max_blocks(self, block_size: int) -> int | None:
        """Most blocks a windowed sequence ever holds: ceil((S + W) / block_size) + 1 (None: unbounded)."""
        if self.window_tokens is None:
            return None
        return self.sink_blocks(block_size) + self.window_tokens // block_size + 1

    def pinned_blocks(self, window: int, block_size: int) -> int | None:
        """Leading table entries a KV group of sliding window `window` (the model's) never releases for a
        sequence under this policy (None: none released). Dropping blocks moves the entries before them closer
        to the next query in the cache: with a request window at most `window` - 2 the sinks come back into the
        window layers' view after a drop (the first query after one is cache index S + W, and sees keys past
        S + W - window), so they stay; a wider request window never shows them again. Importance eviction
        takes blocks from anywhere in the middle, so any released entry could come back: nothing is released."""
        if self.evict:
            return None
        return self.sink_blocks(block_size) if self.window_tokens <= window - 2 else 0  # type: ignore[operator]

    @property
    def shifts_positions(self) -> bool:
        return self.positions == "shifted"


def window_drops(seq: Sequence, retention: KVRetention, block_size: int) -> list[int]:
    """Block-table indices that have fallen out of the window (oldest first); [] when nothing to drop."""
    if retention.window_tokens is None:
        return []
    sinks = retention.sink_blocks(block_size)
    keep = retention.window_tokens // block_size + (1 if seq.num_kv_tokens % block_size else 0)
    rest = len(seq.block_table) - sinks
    return list(range(sinks, sinks + rest - keep)) if rest > keep else []


def window_chunk(seq: Sequence, retention: KVRetention, block_size: int, num_new_tokens: int) -> int:
    """Cap a step's new tokens so the table (after window_drops) stays within max_blocks."""
    limit = retention.max_blocks(block_size)
    if limit is None:
        return num_new_tokens
    room = seq.num_evicted_tokens + limit * block_size - seq.num_kv_tokens
    return max(0, min(num_new_tokens, room))


def evictable(seq: Sequence, retention: KVRetention, block_size: int) -> list[int]:
    """Block-table indices eviction may take: computed, not a sink, not among the recent tokens; lowest
    accumulated attention mass first (ties: oldest first)."""
    sinks = retention.sink_blocks(block_size)
    recent = -(-retention.recent_tokens // block_size) + (1 if seq.num_kv_tokens % block_size else 0)
    computed = (seq.num_computed_tokens - seq.num_evicted_tokens) // block_size
    middle = range(sinks, min(computed, len(seq.block_table) - recent))
    scores = seq.block_scores
    return sorted(middle, key=lambda i: (scores.get(seq.block_table[i], 0.0), i))


def min_blocks(retention: KVRetention, block_size: int, chunk_tokens: int) -> int | None:
    """Fewest blocks a request under `retention` needs to make progress with `chunk_tokens`-token steps
    (None: no bound, it must fit whole)."""
    if retention.window_tokens is not None:
        return retention.max_blocks(block_size)
    if retention.evict:
        return (retention.sink_blocks(block_size) + -(-retention.recent_tokens // block_size) + 1
                + -(-chunk_tokens // block_size))
    return None
