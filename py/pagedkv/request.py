"""One generation request: its sequence, priority and output so far.

The scheduler orders requests; the cache manager owns their sequences' blocks;
the engine samples into them. A preempted-by-recompute request gets a fresh
Sequence holding the same token ids (its old one was freed). Parallel samples and
beams are requests too, forked from the one that prefilled the prompt.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from .kv_retention import KVRetention
from .sequence import Sequence

_arrivals = itertools.count()


class RequestStatus(enum.Enum):
    WAITING = "waiting"        # queued; no KV slots yet (or preempted by recompute)
    RUNNING = "running"        # holds GPU blocks, scheduled every step
    SWAPPED = "swapped"        # preempted; its KV waits in the CPU pool
    FINISHED = "finished"      # done: stop token, length, abort, or error


@dataclass(eq=False)
class Request:
    """A request's scheduling state. `priority`: higher runs first (the conversation in view)."""

    request_id: str
    seq: Sequence
    num_prompt_tokens: int
    max_tokens: int
    priority: int = 0
    arrival: int = field(default_factory=lambda: next(_arrivals))
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_cached_prompt_tokens: int = 0
    index: int = 0  # which parallel sample (0..n-1) or beam this is; 0 for a plain request
    # The n parallel samples of this prompt in index order (this request first), filled when the prompt's
    # prefill completes and the samples fork from it; empty for n = 1 and on the samples themselves.
    samples: list["Request"] = field(default_factory=list)
    retention: KVRetention | None = None  # sliding window / importance eviction (None: keep all KV)

    @property
    def num_tokens_to_compute(self) -> int:
        """Token ids whose KV is not written yet (prefill remainder, or the one new decode token)."""
        return self.seq.num_tokens - self.seq.num_computed_tokens

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_tokens

    def sort_key(self) -> tuple[int, int]:
        """Scheduling order: higher priority first, then first come first served."""
        return (-self.priority, self.arrival)
