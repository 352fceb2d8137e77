"""Structured output by constrained decoding: grammars over bytes, JSON Schema compiled to them, and the token
masks that keep a model's reply inside one (docs/api.md, "Structured output").

terms.py is the character-level machine (byte regular expressions and their derivatives), automaton.py its
lazily built DFA, numbers.py and json_terms.py JSON's pieces, schema.py the schema compiler, grammar.py the
Grammar value and OpenAI's response_format, vocabulary.py a tokenizer's token bytes as a trie, masks.py the
per-state token masks and matcher.py one sample's position in its grammar.
"""
from .grammar import Grammar, compile_response_format, compile_response_format_slices
from .matcher import GrammarMatcher, grammar_matcher
from .schema import SchemaError

__all__ = ["Grammar", "SchemaError", "compile_response_format", "compile_response_format_slices", "GrammarMatcher",
           "grammar_matcher"]
