"""Beam search policy: which continuations of which beams survive a step (no KV, no engine).

Each step every live beam offers every token; a candidate's score is its beam's
cumulative log-probability plus the token's. Candidates are ranked best first
(ties: earlier beam, then lower token id) and the top 2 x width are walked in
order: a stop token among the first `width` candidates finishes a hypothesis;
any other candidate becomes a live beam until `width` are chosen. A beam whose
output reaches max_tokens finishes too ("length"). The search ends once `width`
hypotheses finished (early stopping) or no beam is left; the result is the
finished and live beams ranked by cum_logprob / len(output) ** length_penalty.

The engine (engine.py) keeps one Request per live beam: a surviving beam keeps
its parent's request, a second continuation of the same parent forks its blocks,
and a parent with no continuation is freed at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BeamSearchParams:
    """width: live beams kept per step; length_penalty: exponent of the output length that divides a
    hypothesis's log-probability (0: none, >0 favours longer outputs); stop_token_ids: empty means the
    engine's default stop ids (end of turn / eos)."""

    width: int = 3
    max_tokens: int = 16
    length_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (isinstance(self.length_penalty, (int, float)) and np.isfinite(self.length_penalty)):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")


@dataclass(frozen=True)
class Hypothesis:
    """One finished (or, at the end, still live) beam: its generated ids and their summed log-probability."""

    token_ids: tuple[int, ...]
    cum_logprob: float
    finish_reason: str  # "stop", "length", or "live" (ranked when the search ended early)

    def score(self, length_penalty: float) -> float:
        return self.cum_logprob / len(self.token_ids) ** length_penalty


@dataclass(frozen=True)
class Choice:
    """A surviving continuation: live beam `parent` (its index this step) extended by `token`."""

    parent: int
    token: int
    cum_logprob: float


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(vocab,) logits -> (vocab,) float64 log-probabilities."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def select(outputs: list[tuple[int, ...]], cum_logprobs: list[float], logprobs: list[np.ndarray],
           params: BeamSearchParams, stop_ids: frozenset[int]) -> tuple[list[Choice], list[Hypothesis]]:
    """One step over the live beams (their outputs so far, cumulative log-probs and (vocab,) log-probs
    of the next token): the surviving choices in rank order, and the hypotheses that finished."""
    k = params.width
    scores = np.asarray(cum_logprobs, dtype=np.float64)[:, None] + np.stack(logprobs)  # (beams, vocab)
    vocab = scores.shape[1]
    flat = scores.reshape(-1)  # beam-major, so a stable sort breaks ties by (beam, token)
    top = np.argsort(-flat, kind="stable")[: 2 * k]
    choices: list[Choice] = []
    finished: list[Hypothesis] = []
    for rank, idx in enumerate(top):
        parent, token, score = int(idx) // vocab, int(idx) % vocab, float(flat[idx])
        output = outputs[parent] + (token,)
        if token in stop_ids:
            if rank < k:
                finished.append(Hypothesis(output, score, "stop"))
            continue
        if len(output) >= params.max_tokens:
            finished.append(Hypothesis(output, score, "length"))
        else:
            choices.append(Choice(parent, token, score))
        if len(choices) + sum(h.finish_reason == "length" for h in finished) >= k:
            break
    return choices, finished


def rank(hypotheses: list[Hypothesis], params: BeamSearchParams) -> list[Hypothesis]:
    """The best `width` hypotheses, best first (stable: earlier ones win ties)."""
    return sorted(hypotheses, key=lambda h: -h.score(params.length_penalty))[: params.width]


class BeamGroup:
    """One beam search in flight: its live beams (engine requests, rank order), their cumulative
    log-probs, the next-token log-probs gathered so far this step, and the finished hypotheses."""

    def __init__(self, group_id: str, params: BeamSearchParams, stop_ids: frozenset[int], root) -> None:
        self.group_id = group_id
        self.params = params
        self.stop_ids = stop_ids
        self.beams: list = [root]            # live Requests, best first
        self.cum_logprobs: list[float] = [0.0]
        self.pending: dict[int, np.ndarray] = {}  # id(request) -> (vocab,) log-probs of its next token
        self.finished: list[Hypothesis] = []
        self.results: list[Hypothesis] | None = None  # set when the search ends

    def offer(self, request, logits: np.ndarray) -> None:
        """The logits of `request`'s next token arrived (a beam may wait for its siblings' logits)."""
        self.pending[id(request)] = log_softmax(logits)

    @property
    def ready(self) -> bool:
        """Every live beam has its next-token log-probs: the step can be taken."""
        return all(id(b) in self.pending for b in self.beams)

    def advance(self) -> list[Choice]:
        """Take the step: record finished hypotheses, return the survivors (rank order). Ends the search
        (sets results) when `width` hypotheses finished or nothing survives."""
        outputs = [tuple(b.output_ids) for b in self.beams]
        choices, done = select(outputs, self.cum_logprobs, [self.pending[id(b)] for b in self.beams],
                               self.params, self.stop_ids)
        self.pending.clear()
        self.finished.extend(done)
        if len(self.finished) >= self.params.width or not choices:
            live = [Hypothesis(outputs[c.parent] + (c.token,), c.cum_logprob, "live") for c in choices]
            self.results = rank(self.finished + live, self.params)
        return choices
