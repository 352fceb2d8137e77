"""Work done in slices between which the event loop runs: preparing a request (rendering its messages,
tokenizing them) is linear in its size, but a 4 MiB body took ~1 s in CPython before its first await, and other
streams stalled that long (issue 49: no request stalls another stream for more than one step's time).

A sliced piece of work is a generator: it `yield`s (None) where it may pause, after about SLICE_CHARS characters
of text rendered or tokenized, SLICE_MESSAGES messages checked or SLICE_SCHEMA_NODES schemas compiled, and
`return`s its result. `run_slices` drives one to its end at once (a CPython
caller, a chat turn that must be checked before the page hears of it); `await_slices` lets the event loop run
(the engine's steps) between two slices.
"""
from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import TypeVar

__all__ = ["SLICE_CHARS", "SLICE_MESSAGES", "SLICE_SCHEMA_NODES", "Slices", "await_slices", "run_slices"]

# Characters of text one slice renders or tokenizes: ~10-20 ms of CPython's BPE on this machine, less than a decode
# step of the smallest model here, and few enough yields that a body of MAX_BODY_CHARS (4 MiB) takes ~130.
SLICE_CHARS = 32_768
# Messages one slice checks (chat.validate_messages_slices): 4,096 took ~13 ms of CPython here, ~0.1 s under load.
SLICE_MESSAGES = 256
# Schemas one slice compiles (grammar.schema.compile_schema_slices): an integer property costs ~0.2 ms of CPython
# (its digit ranges), so a slice is ~6 ms.
SLICE_SCHEMA_NODES = 32

T = TypeVar("T")
Slices = Generator[None, None, T]  # a sliced piece of work whose result is a T


def run_slices(work: Slices[T]) -> T:
    """`work` done to its end without pausing; its result."""
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value


async def await_slices(work: Slices[T]) -> T:
    """`work` done to its end, the event loop running other tasks between two slices; its result."""
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)
