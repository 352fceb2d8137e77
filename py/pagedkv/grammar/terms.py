"""Byte-level regular expressions, interned, with Brzozowski derivatives: the character-level machine.

A grammar is a Term over bytes (UTF-8 text is spelled byte by byte, so a token may end in the middle of a
character and the machine is simply half-way through it). The derivative of a term by a byte is the term
for what may follow that byte; the derivatives of a term are the automaton's states (automaton.py builds
them lazily, one row of 256 bytes at a time). Terms are interned (equal structure, one object), so states
compare by identity, and an Alt is a set, so the derivatives of a regular term are finitely many.

Counted repetition (`rep`) is a term of its own, not an unrolled copy: `"a"{0,500}` is one node, and
its derivatives count down (rep(r, lo - 1, hi - 1)), so a string's maxLength costs no grammar size.
"""
from __future__ import annotations

import weakref

import numpy as np

__all__ = ["Term", "EMPTY", "EPS", "byte_set", "literal", "seq", "alt", "rep", "derive", "byte_classes",
           "class_indices"]

_EMPTY, _EPS, _BYTES, _SEQ, _ALT, _REP = range(6)
_ALL = (1 << 256) - 1


class Term:
    """One interned node: kind, its children or byte set, and whether it matches the empty string."""

    __slots__ = ("kind", "a", "b", "items", "mask", "lo", "hi", "nullable", "_derivs", "_heads", "__weakref__")

    def __repr__(self) -> str:
        if self.kind == _EMPTY:
            return "∅"
        if self.kind == _EPS:
            return "ε"
        if self.kind == _BYTES:
            bs = [i for i in range(256) if self.mask >> i & 1]
            return repr(bytes(bs)) if len(bs) == 1 else f"[{len(bs)} bytes]"
        if self.kind == _SEQ:
            return f"({self.a!r} {self.b!r})"
        if self.kind == _ALT:
            return "(" + " | ".join(sorted(map(repr, self.items))) + ")"
        return f"{self.a!r}{{{self.lo},{'' if self.hi is None else self.hi}}}"


_interned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _make(key: tuple, kind: int, nullable: bool, **fields) -> Term:
    found = _interned.get(key)
    if found is not None:
        return found
    t = Term()
    t.kind, t.nullable, t._derivs, t._heads = kind, nullable, None, None
    t.a = t.b = t.items = t.mask = t.lo = t.hi = None
    for name, value in fields.items():
        setattr(t, name, value)
    _interned[key] = t
    return t


EMPTY = _make((_EMPTY,), _EMPTY, False)  # matches nothing: the dead state
EPS = _make((_EPS,), _EPS, True)  # matches only the empty string


def byte_set(values) -> Term:
    """One byte out of `values` (ints 0..255)."""
    mask = 0
    for v in values:
        mask |= 1 << v
    return _bytes_mask(mask)


def _bytes_mask(mask: int) -> Term:
    if mask == 0:
        return EMPTY
    return _make((_BYTES, mask), _BYTES, False, mask=mask)


def literal(data: bytes | str) -> Term:
    """Exactly these bytes (a str is UTF-8 encoded)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    out = EPS
    for byte in reversed(raw):
        out = seq(_bytes_mask(1 << byte), out)
    return out


def seq(*parts: Term) -> Term:
    """The concatenation of `parts`, kept right-nested so equal languages built alike are one term."""
    out = EPS
    for part in reversed(parts):
        out = _seq2(part, out)
    return out


def _seq2(a: Term, b: Term) -> Term:
    if a is EMPTY or b is EMPTY:
        return EMPTY
    if a is EPS:
        return b
    if b is EPS:
        return a
    if a.kind == _SEQ:
        return _seq2(a.a, _seq2(a.b, b))
    return _make((_SEQ, id(a), id(b)), _SEQ, a.nullable and b.nullable, a=a, b=b)


def alt(*options: Term) -> Term:
    """Any one of `options` (flattened; duplicates and EMPTY dropped)."""
    items: set[Term] = set()
    for option in options:
        if option.kind == _ALT:
            items |= option.items
        elif option is not EMPTY:
            items.add(option)
    if not items:
        return EMPTY
    if len(items) == 1:
        return next(iter(items))
    frozen = frozenset(items)
    return _make((_ALT, frozenset(map(id, frozen))), _ALT, any(t.nullable for t in frozen), items=frozen)


def rep(term: Term, lo: int, hi: int | None) -> Term:
    """`term` repeated lo..hi times (hi None: no upper bound)."""
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"repetition bounds must satisfy 0 <= lo <= hi, got {lo}, {hi}")
    if hi == 0 or term is EPS:
        return EPS
    if term is EMPTY:
        return EPS if lo == 0 else EMPTY
    if lo == 1 and hi == 1:
        return term
    return _make((_REP, id(term), lo, hi), _REP, lo == 0 or term.nullable, a=term, lo=lo, hi=hi)


def derive(t: Term, byte: int) -> Term:
    """What may follow once `t` has read `byte`."""
    memo = t._derivs
    if memo is None:
        memo = t._derivs = {}
    found = memo.get(byte)
    if found is not None:
        return found
    kind = t.kind
    if kind == _BYTES:
        out = EPS if t.mask >> byte & 1 else EMPTY
    elif kind == _SEQ:
        out = _seq2(derive(t.a, byte), t.b)
        if t.a.nullable:
            out = alt(out, derive(t.b, byte))
    elif kind == _ALT:
        out = alt(*(derive(x, byte) for x in t.items))
    elif kind == _REP:
        out = _seq2(derive(t.a, byte), rep(t.a, max(t.lo - 1, 0), None if t.hi is None else t.hi - 1))
    else:
        out = EMPTY
    memo[byte] = out
    return out


def _heads(t: Term) -> tuple[int, ...]:
    """The byte sets that may come first: bytes in none of them lead to EMPTY."""
    if t._heads is not None:
        return t._heads
    kind = t.kind
    if kind == _BYTES:
        out: tuple[int, ...] = (t.mask,)
    elif kind == _SEQ:
        out = _heads(t.a) + (_heads(t.b) if t.a.nullable else ())
    elif kind == _ALT:
        out = tuple({m for x in t.items for m in _heads(x)})
    elif kind == _REP:
        out = _heads(t.a)
    else:
        out = ()
    t._heads = out
    return out


def byte_classes(t: Term) -> list[int]:
    """A partition of the bytes that may follow into sets (256-bit ints) on which `derive(t, .)` is equal:
    the derivative is taken once per set, not 256 times."""
    heads = frozenset(_heads(t))
    found = _partitions.get(heads)
    if found is not None:
        return found
    classes = [_ALL]
    for mask in heads:
        split = []
        for c in classes:
            inside, outside = c & mask, c & ~mask
            split.extend(x for x in (inside, outside) if x)
        classes = split
    reachable = 0
    for mask in heads:
        reachable |= mask
    if len(_partitions) > _MAX_MEMO:  # a long-running server meeting many schemas: start afresh
        _partitions.clear()
    found = _partitions[heads] = [c for c in classes if c & reachable]
    return found


_MAX_MEMO = 1 << 16
_partitions: dict[frozenset[int], list[int]] = {}  # many states share their heads (a string's body, say)
_indices: dict[int, np.ndarray] = {}


def class_indices(c: int) -> np.ndarray:
    """The byte values (int array) of a 256-bit set."""
    found = _indices.get(c)
    if found is None:
        if len(_indices) > _MAX_MEMO:
            _indices.clear()
        bits = np.unpackbits(np.frombuffer(c.to_bytes(32, "little"), np.uint8), bitorder="little")
        found = _indices[c] = np.flatnonzero(bits)
    return found
