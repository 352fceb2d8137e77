"""A tokenizer's token byte strings as a trie in breadth-first arrays, built once per tokenizer.

Nodes are the distinct prefixes of the token strings, sorted by (length, bytes): so every level is one
contiguous run and a node's children are contiguous too, and masks.py walks the trie a level at a time
with numpy gathers instead of testing the tokens one by one. Special tokens (control, user-defined,
unknown) and empty ones are left out: a grammar spells text, and stop tokens are added by the matcher.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["TokenVocabulary"]

MAX_CACHED_GRAMMARS = 16  # automata (and their masks) kept per tokenizer, least recently used dropped first

_by_tokenizer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class TokenVocabulary:
    """token_bytes[i]: the bytes of token i, None for a token no grammar produces."""

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        self.token_bytes = list(token_bytes)
        self.vocab_size = len(self.token_bytes)
        prefixes = {b[:i] for b in self.token_bytes if b for i in range(1, len(b) + 1)}
        nodes = sorted(prefixes)
        nodes.sort(key=len)  # stable: by length, then bytes (two C-level sorts, far quicker than a tuple key)
        index = {p: i + 1 for i, p in enumerate(nodes)}  # node 0 is the root (the empty prefix)
        n = len(nodes) + 1
        self.num_nodes = n
        self.byte = np.zeros(n, np.int32)  # (nodes,) the byte that leads into each node
        parent = np.zeros(n, np.int32)  # (nodes,) non-decreasing: children of a node are contiguous
        self.byte[1:] = [p[-1] for p in nodes]
        parent[1:] = [index.get(p[:-1], 0) for p in nodes]
        self.child_count = np.bincount(parent[1:], minlength=n).astype(np.int32)  # (nodes,)
        self.child_start = np.searchsorted(parent[1:], np.arange(n)).astype(np.int32) + 1  # (nodes,)
        self.token_node = np.zeros(self.vocab_size, np.int32)  # (vocab,) 0: not in the trie
        for i, b in enumerate(self.token_bytes):
            if b:
                self.token_node[i] = index[b]
        self.in_trie = self.token_node > 0  # (vocab,)
        self.grammars: OrderedDict = OrderedDict()  # Grammar -> TokenMasks (masks.py)

    @classmethod
    def of(cls, tokenizer) -> TokenVocabulary:
        """The (cached) vocabulary of a pagedkv Tokenizer."""
        found = _by_tokenizer.get(tokenizer)
        if found is None:
            found = _by_tokenizer[tokenizer] = cls(
                [None if tokenizer.is_special(i) else tokenizer.token_bytes(i) or None
                 for i in range(tokenizer.vocab_size)])
        return found
