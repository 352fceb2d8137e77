"""Run a piece of sliced work (pagedkv.slices.Slices) to its end as the event loop would, counting the pauses it
offered: the no-stall tests assert both how often it yields and what it returns."""
from __future__ import annotations

from typing import TypeVar

from pagedkv.slices import Slices

T = TypeVar("T")


def pauses_and_result(work: Slices[T]) -> tuple[int, T]:
    """(the number of times `work` yielded, the value it returned)."""
    pauses = 0
    while True:
        try:
            next(work)
            pauses += 1
        except StopIteration as done:
            return pauses, done.value
