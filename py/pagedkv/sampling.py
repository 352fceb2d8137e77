"""Token sampling: greedy, temperature, top-k, top-p, min-p, penalties, logit bias, seeds, stop conditions.

A Sampler belongs to one request; its numpy Generator is seeded from the
request's seed, so the same seed and the same logits give the same tokens.
The order is vLLM's (v1 sampler): logit bias, repetition penalty (prompt and
output ids), frequency and presence penalties (output ids), then temperature,
min-p, top-k, top-p; greedy takes the argmax after the penalties and the bias.
Sorting is stable, so ties are broken towards the lower token id everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .grammar import Grammar, GrammarMatcher

# Logits are f32 (|x| < 3.5e38). Scaled by at most 1e12 (1 / MIN_TEMPERATURE times the largest penalty
# factor) they stay far below float64's 1.8e308, so the softmax has finite terms summing to >= 1 and every
# probability is finite. Smaller temperatures or wider penalties overflow to inf and NaN (1e-320 made every
# draw the last id); a temperature that small is greedy in effect, and 0 asks for greedy exactly.
MIN_TEMPERATURE = 1e-6
REPETITION_PENALTY_RANGE = (1e-6, 1e6)
PENALTY_RANGE = (-2.0, 2.0)  # presence / frequency penalty, OpenAI's range
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's
MAX_LOGIT_BIAS = 300  # entries of one logit_bias map (OpenAI's limit; the device kernel's per-row list)
MAX_LOGPROBS = 20  # alternatives a token's log-probs may list (OpenAI's top_logprobs limit)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    repetition_penalty: float = 1.0  # 1.0: none; >1 discourages tokens already in prompt or output
    seed: int | None = None  # None: fresh entropy per request
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1  # parallel samples of one prompt; sample i is seeded with seed + i (see for_sample)
    presence_penalty: float = 0.0  # subtracted from the logit of every id the output holds already
    frequency_penalty: float = 0.0  # subtracted once per time the output holds the id
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the raw logits, ids ascending
    min_p: float = 0.0  # 0: off; keeps the ids whose probability is >= min_p * the best one's
    logprobs: int | None = None  # None: none; N: each token's log-prob and the N best (log_softmax of raw logits)
    grammar: Grammar | None = None  # constrained decoding (pagedkv.grammar): each sample's reply stays inside it

    def __post_init__(self) -> None:
        if not (self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature < np.inf):
            raise ValueError(f"temperature must be a finite number >= 0: 0 for greedy, else at least "
                             f"{MIN_TEMPERATURE:g}, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise ValueError(f"repetition_penalty must be a finite number in [{low:g}, {high:g}] (1: none), "
                             f"got {self.repetition_penalty}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative int or None, got {self.seed!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n (parallel samples) must be an int >= 1, got {self.n!r}")
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            if not low <= getattr(self, name) <= high:
                raise ValueError(f"{name} must be a number in [{low:g}, {high:g}] (0: none), got {getattr(self, name)}")
        _check_logit_bias(self.logit_bias)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0: off), got {self.min_p}")
        if self.logprobs is not None and (type(self.logprobs) is not int or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise ValueError(f"grammar must be a pagedkv.grammar.Grammar or None, got {self.grammar!r}")

    @property
    def greedy(self) -> bool:
        """True when the argmax is taken (temperature 0)."""
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        """True when the logits change before the argmax or the draw (a penalty or a bias)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or bool(self.logit_bias))

    @property
    def output_penalised(self) -> bool:
        """True when the logits depend on the ids this sample has generated (presence / frequency)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def for_sample(self, index: int) -> "SamplingParams":
        """The params of parallel sample `index` (0..n-1): n=1 and seed + index, so sample i draws
        exactly what a lone request with that seed would (None stays None: fresh entropy each)."""
        if not 0 <= index < self.n:
            raise ValueError(f"sample index must be in [0, {self.n}), got {index}")
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index)


def apply_repetition_penalty(logits: np.ndarray, previous_ids: Sequence[int], penalty: float) -> np.ndarray:
    """Divide positive / multiply negative logits of every id in previous_ids by penalty (CTRL / HF rule)."""
    out = np.array(logits, dtype=np.float64)  # (vocab,)
    if penalty == 1.0 or len(previous_ids) == 0:
        return out
    ids = np.unique(np.asarray(previous_ids, dtype=np.int64))
    seen = out[ids]
    out[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
    return out


def _check_logit_bias(bias) -> None:
    if not isinstance(bias, tuple) or len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias must be a tuple of at most {MAX_LOGIT_BIAS} (token id, bias) pairs, got "
                         f"{bias!r:.80}")
    low, high = LOGIT_BIAS_RANGE
    previous = -1
    for pair in bias:
        if not (isinstance(pair, tuple) and len(pair) == 2 and type(pair[0]) is int and pair[0] > previous
                and isinstance(pair[1], (int, float)) and not isinstance(pair[1], bool) and low <= pair[1] <= high):
            raise ValueError(f"logit_bias holds (token id, bias) pairs, ids ascending and distinct, each bias in "
                             f"[{low:g}, {high:g}]; got {pair!r}")
        previous = pair[0]


def apply_penalties(logits: np.ndarray, params: SamplingParams, previous_ids: Sequence[int],
                    output_ids: Sequence[int]) -> np.ndarray:
    """The logits (vocab,) f64 that greedy and the draw read: logit bias, then the repetition penalty over
    previous_ids (prompt + output), then logit[t] -= presence * (count[t] > 0) + frequency * count[t] with the
    counts over output_ids (vLLM's order and rule)."""
    out = np.array(logits, dtype=np.float64)  # (vocab,)
    if params.logit_bias:
        ids, bias = zip(*params.logit_bias)
        if ids[-1] >= len(out):
            raise ValueError(f"logit_bias names token id {ids[-1]}, outside the vocabulary ({len(out)})")
        out[list(ids)] += bias
    out = apply_repetition_penalty(out, previous_ids, params.repetition_penalty)
    if params.output_penalised and len(output_ids):
        counts = np.bincount(np.asarray(output_ids, dtype=np.intp), minlength=len(out))[:len(out)]  # (vocab,)
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return out


def filtered_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
                   min_p: float = 0.0) -> np.ndarray:
    """Probabilities (vocab,) after temperature, min-p, top-k and top-p; filtered-out ids get exactly 0.
    min-p keeps the ids whose probability is at least min_p times the best one's (over the whole vocabulary,
    as vLLM's min-p reads them before top-k / top-p); it and top-k keep prefixes of the sorted order, so
    their order does not matter; top-p then reads the probabilities renormalised over what they kept."""
    scaled = np.asarray(logits, dtype=np.float64) / temperature  # (vocab,)
    order = np.argsort(-scaled, kind="stable")  # (vocab,) best first, lower id first on ties
    keep = len(order) if top_k == 0 else min(top_k, len(order))
    if min_p > 0.0:
        # p / p_max = exp(s - s_max), non-increasing along `order`: the kept ids are a prefix.
        ratio = np.exp(scaled[order[:keep]] - scaled[order[0]])  # (keep,)
        keep = int(np.count_nonzero(ratio >= min_p))
    sorted_logits = scaled[order[:keep]]  # (keep,)
    probs = np.exp(sorted_logits - sorted_logits[0])
    probs /= probs.sum()
    if top_p < 1.0:
        # Smallest prefix whose mass reaches top_p (at least one token).
        cutoff = int(np.searchsorted(np.cumsum(probs), top_p, side="left")) + 1
        probs = probs[:cutoff] / probs[:cutoff].sum()
        keep = len(probs)
    out = np.zeros(len(scaled), dtype=np.float64)
    out[order[:keep]] = probs
    return out


class Sampler:
    """Picks the next token of one request."""

    def __init__(self, params: SamplingParams, matcher: GrammarMatcher | None = None) -> None:
        """A sampler whose random stream starts from params.seed; `matcher` (params.grammar's, for this sequence)
        masks the logits before each draw and advances by the token drawn."""
        if (matcher is None) != (params.grammar is None):
            raise ValueError("a Sampler takes a GrammarMatcher exactly when its params have a grammar")
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.matcher = matcher

    def sample(self, logits: np.ndarray, previous_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> int:
        """Next token id from logits (vocab,); previous_ids (prompt + output) feed the repetition penalty,
        output_ids (what this sample generated so far) the presence and frequency penalties."""
        if self.matcher is None:
            return self._draw(logits, previous_ids, output_ids)
        token = self._draw(self.matcher.mask(logits), previous_ids, output_ids)  # the grammar's refusals at -inf
        self.matcher.advance(token)
        return token

    def _draw(self, logits: np.ndarray, previous_ids: Sequence[int], output_ids: Sequence[int]) -> int:
        if logits.ndim != 1:
            raise ValueError(f"logits must be 1-D (vocab,), got shape {logits.shape}")
        p = self.params
        penalised = apply_penalties(logits, p, previous_ids, output_ids)
        if p.greedy:
            return int(np.argmax(penalised))
        probs = filtered_probs(penalised, p.temperature, p.top_k, p.top_p, p.min_p)  # (vocab,)
        cdf = np.cumsum(probs)
        return int(min(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"), len(cdf) - 1))

    @property
    def argmax_only(self) -> bool:
        """True when the argmax of the logits is all this sampler needs (the backend may return ids only)."""
        p = self.params
        return p.greedy and not p.penalised and p.logprobs is None and self.matcher is None

    @property
    def on_device(self) -> bool:
        """True when a backend that samples on the device may draw this sampler's tokens (shaders/sample.wgsl,
        after sample_shape.wgsl for top-k, min-p, presence / frequency penalties, logit bias and log-probs:
        device_draws.py): no repetition penalty, which reads the prompt's ids too, and no grammar (its mask is
        made on the host)."""
        return self.params.repetition_penalty == 1.0 and self.matcher is None

    def device_draw(self) -> tuple[float, float, float]:
        """(temperature, top_p, u) of the next draw for a backend that samples on the device: u is the
        rng.random() that sample() would take now (none for greedy), so the stream and the tokens are the same."""
        p = self.params
        return (0.0, 1.0, 0.0) if p.greedy else (p.temperature, p.top_p, float(self.rng.random()))

    def finish_reason(self, token_id: int, num_generated: int) -> str | None:
        """"stop" if token_id is a stop token, "length" once num_generated reaches max_tokens, else None."""
        if token_id in self.params.stop_token_ids:
            return "stop"
        if num_generated >= self.params.max_tokens:
            return "length"
        return None


class ForcedSampler(Sampler):
    """Teacher forcing: emits `forced_ids` in order, then continues greedily.

    For each forced token it records log p(token) under the logits it was forced against and that row's
    argmax, so a benchmark scores a known continuation (perplexity, greedy agreement) through the engine's
    normal decode path. It needs every row of logits: the backend never returns argmax ids only for it.
    """

    def __init__(self, forced_ids: Sequence[int]) -> None:
        """A sampler that will emit `forced_ids` (non-negative ints) before any greedy token."""
        if not all(isinstance(t, (int, np.integer)) and t >= 0 for t in forced_ids):
            raise ValueError("forced_ids must be non-negative token ids")
        super().__init__(SamplingParams())
        self.forced_ids = [int(t) for t in forced_ids]
        self.logprobs: list[float] = []  # log p(forced_ids[i]) for each forced token so far
        self.argmax_ids: list[int] = []  # the greedy choice of each of those rows

    @property
    def argmax_only(self) -> bool:
        return False

    @property
    def on_device(self) -> bool:
        return False  # it records log-probs of every row

    def sample(self, logits: np.ndarray, previous_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> int:
        """The next forced token (its log-prob recorded), or the argmax once they are used up."""
        if logits.ndim != 1:
            raise ValueError(f"logits must be 1-D (vocab,), got shape {logits.shape}")
        i = len(self.logprobs)
        if i >= len(self.forced_ids):
            return int(np.argmax(logits))
        token = self.forced_ids[i]
        if token >= logits.shape[0]:
            raise ValueError(f"forced token {token} is outside the vocabulary ({logits.shape[0]})")
        from pagedkv.beam_search import log_softmax

        self.logprobs.append(float(log_softmax(logits)[token]))
        self.argmax_ids.append(int(np.argmax(logits)))
        return token
