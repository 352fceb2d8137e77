"""The token mask's cost, the same code in CPython and in the tab's Pyodide worker (bench/structured.py).

`replay(tokenizer, schema, replies)` builds the vocabulary's trie afresh, compiles the schema, then walks each
reply's tokens through a GrammarMatcher twice: `cold` (each reply with a fresh automaton: every state's row
derived and its mask walked; the interned terms keep the derivatives a process took before, as a running engine
does after its first request with the schema) and `cached` (the same states again: each mask a lookup). Times
are per token, in ms.
"""
from __future__ import annotations

import time

import numpy as np

from pagedkv.grammar import Grammar
from pagedkv.grammar.automaton import Automaton
from pagedkv.grammar.masks import TokenMasks
from pagedkv.grammar.matcher import GrammarMatcher
from pagedkv.grammar.vocabulary import TokenVocabulary


def percentiles(values: list[float]) -> dict:
    ms = np.array(values) * 1000
    return {"median": round(float(np.median(ms)), 3), "p95": round(float(np.percentile(ms, 95)), 3),
            "max": round(float(ms.max()), 3), "n": len(values)}


def replay(tokenizer, schema: dict, replies: list[str]) -> dict:
    t0 = time.perf_counter()
    vocab = TokenVocabulary([None if tokenizer.is_special(i) else tokenizer.token_bytes(i) or None
                             for i in range(tokenizer.vocab_size)])  # built afresh, as for a new tokenizer
    vocabulary_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = Grammar.json_schema(schema)
    compile_ms = (time.perf_counter() - t0) * 1000
    masks = [TokenMasks(Automaton(grammar.term), vocab) for _ in replies]
    stops = frozenset({tokenizer.eos_token_id, tokenizer.im_end_id})
    runs: dict[str, list[float]] = {"cold": [], "cached": []}
    for phase in runs:
        for reply, reply_masks in zip(replies, masks):
            matcher = GrammarMatcher(reply_masks, stops)
            for token in tokenizer.encode(reply) + [tokenizer.im_end_id]:
                t0 = time.perf_counter()
                allowed = matcher.allowed()
                runs[phase].append(time.perf_counter() - t0)
                if not allowed[token]:  # the encoder may split a reply otherwise than the model did: stop there
                    break
                matcher.advance(token)
    return {"vocabulary_s": round(vocabulary_s, 3), "compile_ms": round(compile_ms, 3),
            "trie_nodes": vocab.num_nodes, "states": [m.automaton.num_states for m in masks],
            "mask_ms": {phase: percentiles(v) for phase, v in runs.items()}}
