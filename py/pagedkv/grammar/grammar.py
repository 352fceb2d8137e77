"""Grammar: the immutable value a request carries (SamplingParams.grammar), and OpenAI's response_format.

A Grammar wraps one interned byte term (terms.py), so it is hashable and equal grammars built alike are
equal: the per-tokenizer cache of automata and masks (vocabulary.py) keys on it.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..slices import Slices, run_slices
from .json_terms import ANY_OBJECT
from .schema import SchemaError, compile_schema_slices
from .terms import Term, alt, literal, seq

__all__ = ["Grammar", "compile_response_format", "compile_response_format_slices"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for json_schema.name


@dataclass(frozen=True)
class Grammar:
    """The byte strings a reply may be: build with json_object, json_schema, literal, any_of and +."""

    term: Term

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's json_object mode), objects and arrays nested at most MAX_DEPTH deep."""
        return cls(ANY_OBJECT)

    @classmethod
    def json_schema(cls, schema: object, path: str = "schema") -> Grammar:
        """The JSON texts valid under `schema`; SchemaError (param: the keyword's path) for what it cannot honour."""
        return run_slices(cls.json_schema_slices(schema, path))

    @classmethod
    def json_schema_slices(cls, schema: object, path: str = "schema") -> Slices[Grammar]:
        """json_schema in slices (slices.py)."""
        return cls((yield from compile_schema_slices(schema, path)))

    @classmethod
    def literal(cls, text: str | bytes) -> Grammar:
        """Exactly `text`."""
        return cls(literal(text))

    @classmethod
    def any_of(cls, grammars: Iterable[Grammar]) -> Grammar:
        """Any one of `grammars`."""
        terms = [g.term for g in grammars]
        if not terms:
            raise ValueError("any_of needs at least one grammar")
        return cls(alt(*terms))

    def __add__(self, other: Grammar) -> Grammar:
        """This grammar, then `other`."""
        if not isinstance(other, Grammar):
            return NotImplemented
        return Grammar(seq(self.term, other.term))


def compile_response_format(response_format: object) -> Grammar | None:
    """The grammar of an OpenAI response_format: None for {type: "text"}, any object for json_object, the
    schema's for json_schema. SchemaError names the offending field (param starts with "response_format")."""
    return run_slices(compile_response_format_slices(response_format))


def compile_response_format_slices(response_format: object) -> Slices[Grammar | None]:
    """compile_response_format in slices (slices.py): its schema's compiling pauses."""
    where = "response_format"
    if not isinstance(response_format, dict):
        raise SchemaError(where, f"must be an object with a type, got {response_format!r}")
    kind = response_format.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if kind not in allowed:
        raise SchemaError(f"{where}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")
    extra = set(response_format) - allowed[kind]
    if extra:
        raise SchemaError(f"{where}.{sorted(extra)[0]}", f"unknown field for type {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    spec = response_format.get("json_schema")
    where = f"{where}.json_schema"
    if not isinstance(spec, dict):
        raise SchemaError(where, "required: an object with name and schema")
    extra = set(spec) - {"name", "schema", "strict", "description"}
    if extra:
        raise SchemaError(f"{where}.{sorted(extra)[0]}", "unknown field (json_schema holds name, schema, strict, "
                                                        "description)")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SchemaError(f"{where}.name", f"must be 1 to 64 letters, digits, '_' or '-', got {name!r}")
    strict = spec.get("strict", False)
    if strict is not None and not isinstance(strict, bool):
        raise SchemaError(f"{where}.strict", f"must be true or false, got {strict!r}")
    if "schema" not in spec:
        raise SchemaError(f"{where}.schema", "required: the JSON Schema the reply must follow")
    return (yield from Grammar.json_schema_slices(spec["schema"], f"{where}.schema"))
