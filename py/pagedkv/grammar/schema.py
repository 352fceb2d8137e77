"""A JSON Schema compiled to a byte term (terms.py): the subset OpenAI's strict structured outputs use.

Honoured: type (one or a list), properties (written in schema order; required ones always, optional ones
may be skipped), required, additionalProperties (false, true or absent: only the listed properties are
written, which is valid under every one of them; a schema with no properties and an additionalProperties
schema is a map of string keys), enum, const, anyOf, allOf of one schema, $ref to #/$defs/... or
#/definitions/... or # (not recursive), items, minItems, maxItems, minLength, maxLength, minimum, maximum,
exclusiveMinimum, exclusiveMaximum (on integers and numbers, exact). Annotations are ignored. Any other
keyword constrains what we cannot promise: SchemaError names it rather than let a reply break the schema.
"""
from __future__ import annotations

import math
from decimal import Decimal

from ..slices import SLICE_SCHEMA_NODES, Slices, run_slices
from .json_terms import ANY_OBJECT, SPACE, any_value, array, comma_list, json_literal, member, obj, string
from .numbers import integer_bounds, integer_range, number_range
from .terms import EMPTY, EPS, Term, alt, literal, seq

__all__ = ["SchemaError", "compile_schema", "compile_schema_slices", "ANNOTATIONS", "KEYWORDS"]

ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated",
                         "readOnly", "writeOnly"})
KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                      "enum", "const", "anyOf", "allOf", "$ref", "$defs", "definitions", "minimum", "maximum",
                      "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength"})
TYPES = ("string", "integer", "number", "boolean", "null", "object", "array")


class SchemaError(ValueError):
    """A schema this engine cannot honour: `param` is the path of the offending keyword (e.g.
    "schema.properties.name.pattern"), `message` says why and what to do."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message


def compile_schema(schema: object, path: str = "schema") -> Term:
    """The term of the JSON texts that validate against `schema` (a dict, or True for any value)."""
    return run_slices(compile_schema_slices(schema, path))


def compile_schema_slices(schema: object, path: str = "schema") -> Slices[Term]:
    """compile_schema in slices (slices.py): a pause after every SLICE_SCHEMA_NODES schemas compiled (a body's
    schema of 6,400 integer properties took 1.2 s of CPython at once)."""
    return (yield from _Compiler(schema, path).compile(schema, path))


class _Compiler:
    def __init__(self, root: object, path: str) -> None:
        self.root, self.root_path = root, path
        self.resolving: list[str] = []  # the $refs being compiled: one seen again is recursive
        self.done: dict[str, Term] = {}
        self.nodes = 0  # schemas compiled so far

    def compile(self, schema: object, path: str) -> Slices[Term]:
        self.nodes += 1
        if self.nodes % SLICE_SCHEMA_NODES == 0:
            yield
        if schema is True:
            return any_value()
        if schema is False:
            raise SchemaError(path, "the schema false allows no value at all")
        if not isinstance(schema, dict):
            raise SchemaError(path, f"a schema must be an object, got {type(schema).__name__}")
        for key in schema:
            if key not in KEYWORDS and key not in ANNOTATIONS:
                raise SchemaError(f"{path}.{key}", f"the keyword {key!r} is not supported by constrained decoding "
                                  f"here (supported: {', '.join(sorted(KEYWORDS))}); drop it or check the reply "
                                  "yourself")
        keys = set(schema) - ANNOTATIONS - {"$defs", "definitions"}
        for combinator in ("$ref", "anyOf", "allOf", "enum", "const"):
            if combinator in keys:
                return (yield from self._combinator(schema, combinator, keys - {combinator}, path))
        kinds = schema.get("type")
        if kinds is None:
            if "properties" in keys or "additionalProperties" in keys or "required" in keys:
                kinds = "object"
            elif "items" in keys or "minItems" in keys or "maxItems" in keys:
                kinds = "array"
            elif not keys:
                return any_value()
            else:
                raise SchemaError(f"{path}.type", f"give a type for the keywords {sorted(keys)}")
        if isinstance(kinds, str):
            kinds = [kinds]
        if not isinstance(kinds, list) or not kinds or not all(k in TYPES for k in kinds):
            raise SchemaError(f"{path}.type", f"type must be one of {', '.join(TYPES)} or a list of them, got "
                                              f"{schema.get('type')!r}")
        terms = []
        for kind in kinds:
            terms.append((yield from self._typed(schema, kind, path)))
        return alt(*terms)

    def _combinator(self, schema: dict, name: str, others: set[str], path: str) -> Slices[Term]:
        value = schema[name]
        where = f"{path}.{name}"
        if name in ("enum", "const"):
            others -= {"type"}  # the listed values are what counts; a type beside them only restates it
        if others:
            raise SchemaError(f"{path}.{sorted(others)[0]}", f"beside {name} only annotations are supported; move "
                                                             f"{sorted(others)} into the {name} branches")
        if name == "$ref":
            return (yield from self._ref(value, where))
        if name == "const":
            return json_literal(value)
        if name == "enum":
            if not isinstance(value, list) or not value:
                raise SchemaError(where, "enum must be a non-empty list of values")
            return alt(*(json_literal(v) for v in value))
        if not isinstance(value, list) or not value:
            raise SchemaError(where, f"{name} must be a non-empty list of schemas")
        if name == "allOf":
            if len(value) != 1:
                raise SchemaError(where, "allOf is supported with one schema only (an intersection of several "
                                         "cannot be written as a grammar here); merge them")
            return (yield from self.compile(value[0], f"{where}[0]"))
        branches = []
        for i, s in enumerate(value):
            branches.append((yield from self.compile(s, f"{where}[{i}]")))
        return alt(*branches)

    def _ref(self, ref: object, where: str) -> Slices[Term]:
        if not isinstance(ref, str):
            raise SchemaError(where, f"$ref must be a string, got {ref!r}")
        if ref in self.done:
            return self.done[ref]
        if ref in self.resolving:
            raise SchemaError(where, f"{ref} refers to itself (a recursive schema); only non-recursive $refs are "
                                     "supported")
        target: object = self.root
        if ref != "#":
            parts = ref.split("/")
            if parts[0] != "#" or len(parts) != 3 or parts[1] not in ("$defs", "definitions"):
                raise SchemaError(where, f"$ref {ref!r} is not supported: only '#', '#/$defs/NAME' and "
                                         "'#/definitions/NAME' in the same schema")
            defs = self.root.get(parts[1]) if isinstance(self.root, dict) else None
            name = parts[2].replace("~1", "/").replace("~0", "~")
            if not isinstance(defs, dict) or name not in defs:
                raise SchemaError(where, f"$ref {ref!r} names no schema in {parts[1]}")
            target = defs[name]
        self.resolving.append(ref)
        term = yield from self.compile(target, f"{self.root_path}{ref[1:].replace('/', '.')}")
        self.resolving.pop()
        self.done[ref] = term
        return term

    def _typed(self, schema: dict, kind: str, path: str) -> Slices[Term]:
        if kind == "string":
            lo = self._count(schema, "minLength", path) or 0
            return string(lo, self._count(schema, "maxLength", path, lo))
        if kind in ("integer", "number"):
            lo, lo_strict = self._bound(schema, "minimum", "exclusiveMinimum", path)
            hi, hi_strict = self._bound(schema, "maximum", "exclusiveMaximum", path)
            if kind == "integer":
                low, high = integer_bounds(lo, lo_strict, hi, hi_strict)
                term = integer_range(low, high) if low is None or high is None or low <= high else EMPTY
            else:
                term = number_range(lo, lo_strict, hi, hi_strict)
            if term is EMPTY:
                raise SchemaError(path, f"no {kind} lies within its minimum/maximum bounds")
            return term
        if kind == "boolean":
            return alt(literal("true"), literal("false"))
        if kind == "null":
            return literal("null")
        if kind == "array":
            lo = self._count(schema, "minItems", path) or 0
            hi = self._count(schema, "maxItems", path, lo)
            items = schema.get("items", True)
            if isinstance(items, list):
                raise SchemaError(f"{path}.items", "items as a list (a tuple) is not supported; give one schema")
            return array((yield from self.compile(items, f"{path}.items")), lo, hi)
        return (yield from self._object(schema, path))

    def _object(self, schema: dict, path: str) -> Slices[Term]:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties")
        if not isinstance(props, dict):
            raise SchemaError(f"{path}.properties", "properties must be an object of schemas")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{path}.required", "required must be a list of property names")
        missing = [r for r in required if r not in props]
        if missing:
            raise SchemaError(f"{path}.required", f"names {missing}, which properties does not define")
        if not props:
            if isinstance(extra, dict):  # a map: any keys, each value by the schema
                value = yield from self.compile(extra, f"{path}.additionalProperties")
                return obj(comma_list(member(string(), value), 0, None))
            return obj(EPS) if extra is False else ANY_OBJECT
        if extra is not None and not isinstance(extra, (bool, dict)):
            raise SchemaError(f"{path}.additionalProperties", "additionalProperties must be a boolean or a schema")
        values = []
        for name, s in props.items():
            values.append(member(json_literal(name), (yield from self.compile(s, f"{path}.properties.{name}"))))
        # rest[need_comma]: the members from i on, right to left; an optional member may be skipped, and a
        # comma goes before a member only when one was written before it.
        rest = {False: EPS, True: EPS}
        for name, value in reversed(list(zip(props, values))):
            written = {c: seq(literal(",") if c else EPS, SPACE if c else EPS, value, rest[True]) for c in rest}
            rest = written if name in required else {c: alt(written[c], rest[c]) for c in rest}
        return obj(rest[False])

    @staticmethod
    def _count(schema: dict, name: str, path: str, at_least: int = 0) -> int | None:
        value = schema.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
            raise SchemaError(f"{path}.{name}", f"{name} must be an integer >= {at_least}, got {value!r}")
        return value

    @staticmethod
    def _bound(schema: dict, inclusive: str, exclusive: str, path: str) -> tuple[Decimal | None, bool]:
        """The tighter of `inclusive` and `exclusive` as (value, strict)."""
        found: list[tuple[Decimal, bool]] = []
        for name, strict in ((inclusive, False), (exclusive, True)):
            value = schema.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    (isinstance(value, float) and not math.isfinite(value)):
                raise SchemaError(f"{path}.{name}", f"{name} must be a finite number, got {value!r}")
            found.append((Decimal(repr(value)) if isinstance(value, float) else Decimal(value), strict))
        if not found:
            return None, False
        # The tighter bound wins; at equal values the strict one is tighter.
        if inclusive == "minimum":
            return max(found, key=lambda b: (b[0], b[1]))
        return min(found, key=lambda b: (b[0], not b[1]))
