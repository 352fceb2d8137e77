"""Token masks of one grammar over one vocabulary: which tokens may come next in each automaton state.

A mask is the trie (vocabulary.py) walked a level at a time from the state: the frontier holds the live
nodes and their states, one numpy gather (table[state, byte]) moves all of them a byte on, dead ones are
dropped, so a structural position ('{' expected) stops after the first level and a string's body visits
each prefix once. Masks are cached by state, packed to bits (6 KB for 49k tokens), least recently used
dropped first.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .automaton import DEAD, Automaton
from .vocabulary import TokenVocabulary

__all__ = ["TokenMasks"]

MAX_CACHED_MASKS = 4096  # per grammar: 4096 x 6 KB = 24 MB for SmolLM2's vocabulary


class TokenMasks:
    """The masks of `automaton` over `vocab`."""

    def __init__(self, automaton: Automaton, vocab: TokenVocabulary) -> None:
        self.automaton, self.vocab = automaton, vocab
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.hits = self.misses = 0

    def allowed(self, state: int) -> np.ndarray:
        """(vocab,) bool: the tokens after which the grammar can still be completed (stop tokens not included)."""
        packed = self._cache.get(state)
        if packed is not None:
            self.hits += 1
            self._cache.move_to_end(state)
            return np.unpackbits(packed, count=self.vocab.vocab_size).view(bool)
        self.misses += 1
        mask = self._walk(state)
        self._cache[state] = np.packbits(mask)
        if len(self._cache) > MAX_CACHED_MASKS:
            self._cache.popitem(last=False)
        return mask

    def _walk(self, state: int) -> np.ndarray:
        a, v = self.automaton, self.vocab
        node_state = np.zeros(v.num_nodes, np.int32)  # (nodes,) the state after each prefix; DEAD if refused
        if state != DEAD:
            nodes = np.arange(v.child_start[0], v.child_start[0] + v.child_count[0])  # (frontier,) level 1
            states = np.full(len(nodes), state, np.int32)  # (frontier,) the state before each node's byte
            a.expand(state)
            while nodes.size:
                states = a.table[states, v.byte[nodes]]
                live = states != DEAD
                nodes, states = nodes[live], states[live]
                node_state[nodes] = states
                counts = v.child_count[nodes]
                inner = counts > 0
                nodes, states, counts = nodes[inner], states[inner], counts[inner]
                a.expand_all(states)
                # The children of every frontier node, each next to its parent's state.
                ends = np.cumsum(counts)
                total = int(ends[-1]) if ends.size else 0
                first = np.repeat(v.child_start[nodes] - (ends - counts), counts)
                nodes = first + np.arange(total, dtype=np.int32)
                states = np.repeat(states, counts)
        return (node_state[v.token_node] != DEAD) & v.in_trie
