"""JSON numbers as byte terms, with bounds honoured digit by digit.

An integer range [lo, hi] becomes the usual digit-range expression (per length, per leading digit). A
decimal range compares the integer part first and then the fraction's digits left to right, so
`minimum: 0.5, exclusiveMaximum: 2` is exact, not rounded. Numbers are written without exponent when
bounded (an exponent would make the comparison a different machine), and with at most MAX_INT_DIGITS
integer and MAX_FRACTION_DIGITS fraction digits: a small model can otherwise write digits until
max_tokens, and 16 digits hold every integer a float64 holds exactly (2**53 = 9007199254740992).
"""
from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from functools import lru_cache

from .terms import EMPTY, EPS, Term, alt, byte_set, literal, rep, seq

__all__ = ["MAX_INT_DIGITS", "MAX_FRACTION_DIGITS", "integer_range", "number_range", "integer_bounds"]

MAX_INT_DIGITS = 16
MAX_FRACTION_DIGITS = 16
INT_LIMIT = 10 ** MAX_INT_DIGITS - 1

DIGIT = byte_set(range(0x30, 0x3A))


def _digits(lo: int, hi: int) -> Term:
    return byte_set(range(0x30 + lo, 0x30 + hi + 1)) if lo <= hi else EMPTY


@lru_cache(maxsize=4096)
def _same_length(lo: str, hi: str) -> Term:
    """Digit strings of len(lo) == len(hi) between lo and hi (both included), compared as strings."""
    if not lo:
        return EPS
    rest = len(lo) - 1
    if lo == "0" * len(lo) and hi == "9" * len(hi):
        return rep(DIGIT, rest + 1, rest + 1)
    a, b = int(lo[0]), int(hi[0])
    if a == b:
        return seq(_digits(a, a), _same_length(lo[1:], hi[1:]))
    return alt(seq(_digits(a, a), _same_length(lo[1:], "9" * rest)),
               seq(_digits(a + 1, b - 1), rep(DIGIT, rest, rest)),
               seq(_digits(b, b), _same_length("0" * rest, hi[1:])))


def _natural_range(lo: int, hi: int) -> Term:
    """Canonical decimals (no leading zero) of the integers lo..hi, 0 <= lo."""
    if lo > hi:
        return EMPTY
    options = []
    for length in range(len(str(lo)), len(str(hi)) + 1):
        first = 0 if length == 1 else 10 ** (length - 1)
        a, b = max(lo, first), min(hi, 10 ** length - 1)
        if a <= b:
            options.append(_same_length(str(a), str(b)))
    return alt(*options)


def integer_range(lo: int | None, hi: int | None) -> Term:
    """JSON integers in [lo, hi] (None: the MAX_INT_DIGITS limit); "-0" is not written."""
    lo = -INT_LIMIT if lo is None else max(lo, -INT_LIMIT)
    hi = INT_LIMIT if hi is None else min(hi, INT_LIMIT)
    negative = seq(literal("-"), _natural_range(max(1, -hi), -lo)) if lo < 0 else EMPTY
    return alt(negative, _natural_range(max(lo, 0), hi) if hi >= 0 else EMPTY)


@lru_cache(maxsize=4096)
def _fraction(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool, budget: int) -> tuple[Term, bool]:
    """(the non-empty digit strings s of at most `budget` digits with lo <= 0.s <= hi, whether 0 itself is
    in the bounds): each bound is the digit string of a fraction (None: none; strict excludes equality)."""
    zeros_ok = (lo is None or (not lo.strip("0") and not lo_strict)) and \
        (hi is None or not hi_strict or bool(hi.strip("0")))
    if lo is not None and not lo.strip("0") and not lo_strict:
        lo = None  # >= 0.000... holds for every fraction
    if budget == 0:
        return EMPTY, zeros_ok
    groups: dict[tuple, list[int]] = {}
    for d in range(10):
        if lo is None:
            lo_rest: tuple = (None, False)
        else:
            lo_d = int(lo[0]) if lo else 0
            if d < lo_d:
                continue
            lo_rest = (lo[1:], lo_strict) if d == lo_d else (None, False)
        if hi is None:
            hi_rest: tuple = (None, False)
        else:
            hi_d = int(hi[0]) if hi else 0
            if d > hi_d:
                continue
            hi_rest = (hi[1:], hi_strict) if d == hi_d else (None, False)
        groups.setdefault(lo_rest + hi_rest, []).append(d)
    options = []
    for (lr, ls, hr, hs), ds in groups.items():
        rest, rest_zero = _fraction(lr, ls, hr, hs, budget - 1)
        options.append(seq(byte_set(0x30 + d for d in ds), alt(rest, EPS if rest_zero else EMPTY)))
    return alt(*options), zeros_ok


def _fraction_part(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> Term:
    """'.' and digits, or nothing (the value .0), for a fraction in the bounds ("1." is not JSON)."""
    digits, zero_ok = _fraction(lo, lo_strict, hi, hi_strict, MAX_FRACTION_DIGITS)
    return alt(EPS if zero_ok else EMPTY, seq(literal("."), digits))


def _split(value: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits) of value >= 0."""
    whole = int(value.to_integral_value(rounding=ROUND_FLOOR))
    frac = value - whole
    digits = format(frac, "f").partition(".")[2].rstrip("0") if frac else ""
    return whole, digits


def _nonnegative(lo: Decimal, lo_strict: bool, hi: Decimal | None, hi_strict: bool) -> Term:
    """Plain decimals (no sign, no exponent) of the values in the bounds, 0 <= lo."""
    lo_int, lo_frac = _split(lo)
    if hi is None:
        hi_int, hi_frac = INT_LIMIT, None
    else:
        hi_int, hi_frac = _split(hi)
        if hi_int > INT_LIMIT:
            hi_int, hi_frac, hi_strict = INT_LIMIT, None, False
    if lo_int > hi_int:
        return EMPTY
    if lo_int == hi_int:
        return seq(_natural_range(lo_int, lo_int), _fraction_part(lo_frac, lo_strict, hi_frac, hi_strict))
    return alt(seq(_natural_range(lo_int, lo_int), _fraction_part(lo_frac, lo_strict, None, False)),
               seq(_natural_range(lo_int + 1, hi_int - 1), _fraction_part(None, False, None, False)),
               seq(_natural_range(hi_int, hi_int), _fraction_part(None, False, hi_frac, hi_strict)))


def number_range(lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool) -> Term:
    """JSON numbers x with lo <= x <= hi (strict: <), no exponent; "-0" is not written."""
    options = []
    if lo is None or lo < 0:
        # x < 0 written as "-" y with y = -x > 0: y's bounds are the mirror of x's.
        if hi is None or hi >= 0:
            y_lo, y_lo_strict = Decimal(0), True
        else:
            y_lo, y_lo_strict = -hi, hi_strict
        options.append(seq(literal("-"), _nonnegative(y_lo, y_lo_strict, None if lo is None else -lo, lo_strict)))
    if hi is None or hi >= 0:
        if lo is None or lo < 0:
            options.append(_nonnegative(Decimal(0), False, hi, hi_strict))
        else:
            options.append(_nonnegative(lo, lo_strict, hi, hi_strict))
    return alt(*options)


def integer_bounds(lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool) -> tuple:
    """Inclusive integer bounds (None: open) of lo <(=) n <(=) hi."""
    low = None
    if lo is not None:
        low = int(lo.to_integral_value(rounding=ROUND_CEILING))
        if lo_strict and low == lo:
            low += 1
    high = None
    if hi is not None:
        high = int(hi.to_integral_value(rounding=ROUND_FLOOR))
        if hi_strict and high == hi:
            high -= 1
    return low, high
