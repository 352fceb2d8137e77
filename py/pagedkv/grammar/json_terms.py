"""JSON's pieces as byte terms: strings (escapes, whole UTF-8 characters), literals, separators, containers.

Whitespace: none between tokens except one optional space after '{', '[', ',' and ':' (the `{"a": 1, "b": 2}`
that Python's json.dumps writes and small models have read most). No newlines and no runs of blanks, so a
model cannot spend max_tokens on whitespace.
"""
from __future__ import annotations

import json

from .numbers import number_range
from .terms import EMPTY, EPS, Term, alt, byte_set, literal, rep, seq

__all__ = ["SPACE", "string", "json_literal", "comma_list", "obj", "array", "any_value", "ANY_OBJECT",
           "MAX_DEPTH"]

SPACE = rep(literal(" "), 0, 1)  # the one optional blank after { [ , :
MAX_DEPTH = 6  # json_object mode: objects and arrays nest at most this deep (a small model may open "[[[[" forever)

_CONT = byte_set(range(0x80, 0xC0))
# One character of a JSON string, unescaped: printable ASCII but '"' and '\', or a well-formed UTF-8 sequence
# (no overlong forms, no surrogates, nothing past U+10FFFF), so a token ending mid-character is half-way here.
_UTF8 = alt(
    byte_set(set(range(0x20, 0x80)) - {0x22, 0x5C}),
    seq(byte_set(range(0xC2, 0xE0)), _CONT),
    seq(literal(b"\xe0"), byte_set(range(0xA0, 0xC0)), _CONT),
    seq(byte_set(list(range(0xE1, 0xED)) + [0xEE, 0xEF]), _CONT, _CONT),
    seq(literal(b"\xed"), byte_set(range(0x80, 0xA0)), _CONT),
    seq(literal(b"\xf0"), byte_set(range(0x90, 0xC0)), _CONT, _CONT),
    seq(byte_set(range(0xF1, 0xF4)), _CONT, _CONT, _CONT),
    seq(literal(b"\xf4"), byte_set(range(0x80, 0x90)), _CONT, _CONT),
)
_HEX = byte_set(b"0123456789abcdefABCDEF")
_ESCAPE = seq(literal("\\"), alt(byte_set(b'"\\/bfnrt'), seq(literal("u"), _HEX, _HEX, _HEX, _HEX)))
CHAR = alt(_UTF8, _ESCAPE)


def string(min_length: int = 0, max_length: int | None = None) -> Term:
    """A JSON string of min_length..max_length characters (an escape counts as one)."""
    return seq(literal('"'), rep(CHAR, min_length, max_length), literal('"'))


def json_literal(value) -> Term:
    """Exactly the JSON text of `value` as this grammar spells it (', ' and ': ' separators)."""
    return literal(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))


def comma_list(item: Term, lo: int, hi: int | None) -> Term:
    """lo..hi items separated by ',' and an optional space."""
    if hi == 0:
        return EPS
    more = rep(seq(literal(","), SPACE, item), max(lo - 1, 0), None if hi is None else hi - 1)
    some = seq(item, more)
    return alt(EPS, some) if lo == 0 else some


def array(item: Term, lo: int = 0, hi: int | None = None) -> Term:
    return seq(literal("["), SPACE, comma_list(item, lo, hi), literal("]"))


def obj(members: Term) -> Term:
    """'{' members '}' (members: the comma-separated key-value pairs, from object_members or a map)."""
    return seq(literal("{"), SPACE, members, literal("}"))


def member(key: Term, value: Term) -> Term:
    return seq(key, literal(":"), SPACE, value)


_SCALAR = alt(string(), number_range(None, False, None, False),
              literal("true"), literal("false"), literal("null"))


def any_value(depth: int = MAX_DEPTH) -> Term:
    """Any JSON value nesting objects and arrays at most `depth` deep."""
    if depth == 0:
        return _SCALAR
    inner = any_value(depth - 1)
    return alt(_SCALAR, any_object(depth), array(inner))


def any_object(depth: int = MAX_DEPTH) -> Term:
    """Any JSON object whose values nest at most depth - 1 deeper."""
    inner = any_value(depth - 1) if depth > 0 else EMPTY
    return obj(comma_list(member(string(), inner), 0, None))


ANY_OBJECT = any_object()
