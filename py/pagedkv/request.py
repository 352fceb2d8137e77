"""One generation request: its sequence, priority and output so far.

Who changes what: the cache manager owns every KV field of a request's Sequence
and its status (where its KV lives: nowhere yet, GPU, CPU, freed), through its
API; the scheduler owns the queues, hands a preempted-by-recompute request a
fresh Sequence holding the same token ids (its old one was freed) and counts
preemptions; the engine appends sampled tokens (append_token) and sets the
finish reason. Parallel samples and beams are requests too, forked from the one
that prefilled the prompt.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .kv.retention import KVRetention
from .logprobs import TokenLogprob
from .sequence import Sequence, SequenceStatus

_arrivals = itertools.count()


@dataclass(eq=False)
class Request:
    """A request's scheduling state. `priority`: higher runs first (the conversation in view)."""

    request_id: str
    seq: Sequence
    num_prompt_tokens: int
    max_tokens: int
    priority: int = 0
    arrival: int = field(default_factory=lambda: next(_arrivals))
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
    def status(self) -> SequenceStatus:
        """Its sequence's: waiting (queued, no KV slots), running, swapped, or finished (freed)."""
        return self.seq.status

    def append_token(self, token: int) -> None:
        """A sampled token joins the output and the token history (its KV slot comes next step)."""
        self.output_ids.append(token)
        self.seq.token_ids.append(token)

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


@dataclass
class StepOutput:
    """What one request produced in one step (empty token list while its prefill is in progress).

    index: which of the request's parallel samples (or final beams) this is; 0 for a plain request.
    logprobs: one per token of token_ids when the request asked for them (SamplingParams.logprobs), else None."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    index: int = 0
    logprobs: list[TokenLogprob] | None = None
