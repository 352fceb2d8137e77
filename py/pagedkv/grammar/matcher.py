"""One sample's position in its grammar: the mask it puts on the logits and the token it then advances by.

Stop tokens (EOS, <|im_end|>, a request's stop_token_ids) are allowed exactly when the grammar is complete
(the automaton accepts), and are then the only tokens left when nothing else may follow; before that they are
masked like any token the grammar refuses.
"""
from __future__ import annotations

import numpy as np

from .automaton import DEAD, Automaton
from .grammar import Grammar
from .masks import TokenMasks
from .vocabulary import MAX_CACHED_GRAMMARS, TokenVocabulary

__all__ = ["GrammarMatcher", "grammar_matcher"]


class GrammarMatcher:
    """The automaton state of one sequence; `mask` before each draw, `advance` after it."""

    def __init__(self, masks: TokenMasks, stop_ids: frozenset[int]) -> None:
        self.masks = masks
        self.stop_ids = np.array(sorted(stop_ids), np.int64)  # (stops,)
        self.state = masks.automaton.start

    @property
    def is_accepting(self) -> bool:
        """The text so far is a complete value of the grammar."""
        return bool(self.masks.automaton.accepting[self.state])

    def allowed(self) -> np.ndarray:
        """(vocab,) bool: the tokens that may come next."""
        allowed = self.masks.allowed(self.state)  # a fresh array: the cache keeps packed bits
        stops = self.stop_ids[self.stop_ids < len(allowed)]
        allowed[stops] = self.is_accepting
        if not allowed.any():  # a vocabulary that cannot spell what must follow: end rather than break the text
            allowed[stops] = True
        return allowed

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """`logits` (vocab,) with every token the grammar refuses at -inf (a copy)."""
        allowed = self.allowed()
        if len(logits) > len(allowed):  # the model's padded rows past the tokenizer's ids
            allowed = np.concatenate([allowed, np.zeros(len(logits) - len(allowed), bool)])
        return np.where(allowed[:len(logits)], logits, -np.inf)

    def advance(self, token: int) -> None:
        """Move past `token` (a stop token ends the text and leaves the state as it is)."""
        if token in self.stop_ids:
            return
        data = self.masks.vocab.token_bytes[token] if token < self.masks.vocab.vocab_size else None
        state = DEAD if data is None else self.masks.automaton.step(self.state, data)
        if state == DEAD:
            raise ValueError(f"token {token} ({data!r}) does not continue the grammar here; it was not masked")
        self.state = state


def token_masks(grammar: Grammar, vocab: TokenVocabulary) -> TokenMasks:
    """The (cached) masks of `grammar` over `vocab`: a second request with the same grammar reuses its states."""
    found = vocab.grammars.get(grammar)
    if found is None:
        found = vocab.grammars[grammar] = TokenMasks(Automaton(grammar.term), vocab)
        if len(vocab.grammars) > MAX_CACHED_GRAMMARS:
            vocab.grammars.popitem(last=False)
    vocab.grammars.move_to_end(grammar)
    return found


def grammar_matcher(grammar: Grammar, tokenizer, stop_ids: frozenset[int]) -> GrammarMatcher:
    """A fresh matcher of `grammar` for a sequence of `tokenizer`'s model ending at any of `stop_ids`."""
    return GrammarMatcher(token_masks(grammar, TokenVocabulary.of(tokenizer)), stop_ids)
