"""Per-token log-probabilities: what a request with SamplingParams.logprobs gets for each token it generates,
and their OpenAI shapes (a chat's `logprobs.content`, a legacy completion's `tokens` / `token_logprobs` /
`top_logprobs` / `text_offset`).

The values are log_softmax of the model's raw logits (vLLM's default, logprobs_mode "raw_logprobs"): before the
penalties, the bias, the temperature and the filters, so they say what the model thought, not what the
sampler drew from. The best ones are listed by log-prob, descending, lower id first on ties.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .beam_search import log_softmax

__all__ = ["TokenLogprob", "token_logprob", "chat_logprobs", "legacy_logprobs", "join_logprobs"]


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-prob and the `top` best ids of its row as (id, log-prob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: np.ndarray, token_id: int, top_n: int) -> TokenLogprob:
    """`token_id`'s log-prob under the raw `logits` (vocab,) and the `top_n` best ids of that row."""
    logp = log_softmax(logits)
    best = np.argsort(-logp, kind="stable")[:top_n]  # lower id first on ties
    return TokenLogprob(int(token_id), float(logp[token_id]), tuple((int(t), float(logp[t])) for t in best))


def _text(tokenizer, token_id: int) -> str:
    """A token's text: its raw bytes as UTF-8, a partial character shown as U+FFFD."""
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def _chat_entry(tokenizer, token_id: int, logprob: float) -> dict:
    return {"token": _text(tokenizer, token_id), "logprob": logprob, "bytes": list(tokenizer.token_bytes(token_id))}


def chat_logprobs(entries: list[TokenLogprob], tokenizer) -> dict:
    """A chat choice's (or chunk's) `logprobs`: {content: [{token, logprob, bytes, top_logprobs}], refusal}."""
    return {"content": [_chat_entry(tokenizer, e.token_id, e.logprob)
                        | {"top_logprobs": [_chat_entry(tokenizer, t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


def legacy_logprobs(entries: list[TokenLogprob], tokenizer, offset: int = 0) -> dict:
    """A legacy completion choice's `logprobs` for `entries`: {tokens, token_logprobs, top_logprobs (a dict of
    the best ones' text to log-prob each), text_offset (each token's character offset in the completion text,
    the first at `offset`)}."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        text = _text(tokenizer, e.token_id)
        tokens.append(text)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{_text(tokenizer, t): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets}


def join_logprobs(parts: list[dict], legacy: bool) -> dict:
    """One choice's `logprobs` from those of its streamed pieces (chat_logprobs' or legacy_logprobs' shapes)."""
    if legacy:
        return {key: [v for part in parts for v in part[key]]
                for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    return {"content": [entry for part in parts for entry in part["content"]], "refusal": None}
