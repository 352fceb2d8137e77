"""Typed reads of a GGUF's metadata for the converter.

Every value is checked for its type and range as it is read, so a malformed file is a ValueError naming the
file, the key, the value and what was expected ("m.gguf: llama.attention.head_count is 'four' (a string);
expected a positive integer"), never a TypeError or ZeroDivisionError from deep inside the conversion.
Works over gguf_reader.GGUFFile or anything with its `fields[key].contents()`.
"""

from __future__ import annotations

import math
import numbers

MISSING = object()  # no default: the key must be in the file


def describe(value) -> str:
    """A value as an error message shows it: a short repr and its kind ("5 (an integer)", "[...] (an array of 9)")."""
    if isinstance(value, list):
        shown = repr(value[:3])[:-1] + (", ...]" if len(value) > 3 else "]")
        kind = f"an array of {len(value):,}"
    else:
        shown = f"{value:,}" if _is_int(value) else repr(value)
        kind = ("a string" if isinstance(value, str) else "a boolean" if isinstance(value, bool) else
                "an integer" if isinstance(value, numbers.Integral) else
                "a number" if isinstance(value, numbers.Real) else type(value).__name__)
    return f"{shown if len(shown) <= 60 else shown[:57] + '...'} ({kind})"


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


class GGUFMetadata:
    """The metadata of GGUF `reader`, read with types checked; errors start with `file` (the file's name)."""

    def __init__(self, reader, file: str) -> None:
        self.reader, self.file = reader, file

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def error(self, key: str, value, expected: str) -> ValueError:
        return ValueError(f"{self.file}: {key} is {describe(value)}; expected {expected}")

    def value(self, key: str, default=MISSING, expected: str = "a value"):
        """The raw value of `key`; `default` when the file lacks it (an error naming the key without one)."""
        field = self.reader.fields.get(key)
        if field is None:
            if default is MISSING:
                raise ValueError(f"{self.file}: the metadata has no key {key!r} ({expected} expected)")
            return default
        return field.contents()

    def positive_int(self, key: str, default=MISSING, *, at_most: int | None = None) -> int:
        expected = "a positive integer" + (f" of at most {at_most:,}" if at_most is not None else "")
        value = self.value(key, default, expected)
        if not _is_int(value) or value < 1 or (at_most is not None and value > at_most):
            raise self.error(key, value, expected)
        return int(value)

    def positive_number(self, key: str, default=MISSING) -> float:
        value = self.value(key, default, "a positive finite number")
        if not _is_number(value) or value <= 0:
            raise self.error(key, value, "a positive finite number")
        return float(value)

    def string(self, key: str, default=MISSING) -> str:
        value = self.value(key, default, "a string")
        if not isinstance(value, str):
            raise self.error(key, value, "a string")
        return value

    def flag(self, key: str) -> bool:
        value = self.value(key, expected="a boolean")
        if not isinstance(value, bool) and value not in (0, 1):
            raise self.error(key, value, "a boolean")
        return bool(value)

    def token_id(self, key: str, vocab: int) -> int | None:
        """A token id below `vocab`, or None when the file lacks it (or says -1, as some converters write)."""
        expected = f"a token id below the vocabulary size {vocab:,}"
        value = self.value(key, -1, expected)
        if _is_int(value) and value == -1:
            return None
        if not _is_int(value) or not 0 <= value < vocab:
            raise self.error(key, value, expected)
        return int(value)

    def strings(self, key: str, default=MISSING, *, length: int | None = None) -> list[str]:
        return self._array(key, default, length, lambda v: isinstance(v, str), "strings")

    def ints(self, key: str, default=MISSING, *, length: int | None = None) -> list[int]:
        return [int(v) for v in self._array(key, default, length, _is_int, "integers")]

    def numbers(self, key: str, default=MISSING, *, length: int | None = None) -> list[float]:
        return [float(v) for v in self._array(key, default, length, _is_number, "finite numbers")]

    def _array(self, key: str, default, length: int | None, ok, items: str) -> list:
        expected = f"an array of {length:,} {items}" if length is not None else f"an array of {items}"
        value = self.value(key, default, expected)
        if not isinstance(value, list) or (length is not None and len(value) != length):
            raise self.error(key, value, expected)
        for i, item in enumerate(value):
            if not ok(item):
                raise ValueError(f"{self.file}: item {i:,} of {key} is {describe(item)}; expected {expected}")
        return value
