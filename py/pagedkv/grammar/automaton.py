"""A lazily built DFA over bytes: the states are a grammar's derivatives (terms.py), numbered as they are met.

State 0 is dead (nothing can follow), state 1 the start. `table` holds one row of 256 next states per state,
filled the first time a row is needed (`expand`), so a grammar with counted repetitions (a string of at most 500
characters) never builds the states no reply reaches. The token masks (masks.py) gather from `table` with numpy.
"""
from __future__ import annotations

import numpy as np

from .terms import EMPTY, Term, byte_classes, class_indices, derive

__all__ = ["Automaton", "DEAD"]

DEAD = 0


class Automaton:
    """The DFA of one grammar's root term."""

    def __init__(self, root: Term) -> None:
        self.terms: list[Term] = []
        self._ids: dict[Term, int] = {}
        self.table = np.zeros((64, 256), np.int32)  # (capacity, 256) next state; rows not expanded are zero
        self.expanded = np.zeros(64, bool)  # (capacity,)
        self.accepting = np.zeros(64, bool)  # (capacity,) the grammar may end here
        self._state_of(EMPTY)
        self.expanded[DEAD] = True
        self.start = self._state_of(root)

    @property
    def num_states(self) -> int:
        return len(self.terms)

    def _state_of(self, term: Term) -> int:
        found = self._ids.get(term)
        if found is not None:
            return found
        state = len(self.terms)
        if state == len(self.expanded):
            grow = len(self.expanded)
            self.table = np.concatenate([self.table, np.zeros((grow, 256), np.int32)])
            self.expanded = np.concatenate([self.expanded, np.zeros(grow, bool)])
            self.accepting = np.concatenate([self.accepting, np.zeros(grow, bool)])
        self.terms.append(term)
        self._ids[term] = state
        self.accepting[state] = term.nullable
        return state

    def expand(self, state: int) -> None:
        """Fill `table[state]` (once)."""
        if self.expanded[state]:
            return
        term = self.terms[state]
        row = np.zeros(256, np.int32)
        for c in byte_classes(term):
            indices = class_indices(c)
            row[indices] = self._state_of(derive(term, int(indices[0])))
        self.table[state] = row  # after _state_of, which may have replaced the table
        self.expanded[state] = True

    def expand_all(self, states: np.ndarray) -> None:
        """Expand every state in `states` (an int array, repeats allowed) not expanded yet."""
        todo = states[~self.expanded[states]]
        for state in np.unique(todo).tolist():
            self.expand(state)

    def step(self, state: int, data: bytes) -> int:
        """The state after `data` (DEAD once a byte is refused)."""
        for byte in data:
            if state == DEAD:
                return DEAD
            self.expand(state)
            state = int(self.table[state, byte])
        return state

    def is_final(self, state: int) -> bool:
        """Accepting and nothing may follow: only end-of-sequence remains."""
        self.expand(state)
        return bool(self.accepting[state]) and not self.table[state].any()

    def matches(self, data: bytes | str) -> bool:
        """Whether the whole of `data` is in the grammar's language."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        state = self.step(self.start, raw)  # first: stepping may grow (replace) the arrays
        return bool(self.accepting[state])
