"""What a backend that samples on the device (Backend.samples_on_device) is handed for each step's rows, and the
per-request state it keeps there.

Every row gets Sampler.device_draw's (temperature, top_p, u). A step holding a row whose sampler is `shaped`
(top-k, min-p, presence / frequency penalties, logit bias or log-probs: SamplingParams) also gets a Shaping:
per row its settings for shaders/sample_shape.wgsl, the rows' logit-bias pairs, and the token counts of the
requests whose penalties read them. Those counts live on the device, one slot (a vocab-wide row of u32) per
request, and the kernel that picks a token (sample_post.wgsl) adds it there: a pipelined step (decode_chain.py)
reads the count of the token drawn by the step before it, which the host has not seen yet. A request gets a
slot on its first shaped draw, its counts written from its output ids then (it is never in a pipelined step
then: a chain keeps the rows of the step before it); a slot goes back when its request is finished, or to a
row of a later step when every slot is taken (the request it leaves gets one again, its counts rewritten).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .logprobs import TokenLogprob
from .sampling import MAX_LOGPROBS, Sampler
from .sequence import SequenceStatus

__all__ = ["DeviceDraws", "DrawnTokens", "Shaping", "LP_STRIDE", "NONE"]

NONE = 0xFFFFFFFF  # a row field that is off (no counts slot, no log-probs)
LP_STRIDE = 2 + 2 * MAX_LOGPROBS  # a row's log-prob words: the chosen's, lse, MAX_LOGPROBS ids, their log-probs


@dataclass(frozen=True)
class Shaping:
    """A shaped step's rows for sample_shape.wgsl."""

    rows: np.ndarray  # (S, 8) u32: top_k, min_p, presence, frequency (f32 bits), counts slot, bias start, len, top_n
    bias: np.ndarray  # (pairs, 2) u32: token id, bias (f32 bits); one unused pair when no row has a bias
    counts: tuple[tuple[int, np.ndarray], ...]  # (slot, (vocab,) u32 counts) to write before the step

    @property
    def logprobs(self) -> bool:
        """True when some row asks for log-probs (they come back with the ids)."""
        return bool((self.rows[:, 7] != NONE).any())


@dataclass(frozen=True)
class DrawnTokens:
    """The ids of a shaped step and, where asked for, their log-prob rows."""

    ids: np.ndarray  # (S,) int32
    logprobs: np.ndarray | None  # (S, LP_STRIDE) u32 words (sample_shape.wgsl / sample_post.wgsl)

    def __len__(self) -> int:
        return len(self.ids)

    def entry(self, i: int, top_n: int) -> TokenLogprob:
        """Row i's token and log-prob with its top_n best ids, as logprobs.token_logprob gives them."""
        words = self.logprobs[i]
        f32 = words.view(np.float32)
        top = tuple((int(words[2 + k]), float(f32[2 + MAX_LOGPROBS + k])) for k in range(top_n))
        return TokenLogprob(int(self.ids[i]), float(f32[0]), top)


def shaped(sampler: Sampler) -> bool:
    """True when a sampler's draw needs sample_shape.wgsl before sample.wgsl."""
    p = sampler.params
    return bool(p.top_k or p.min_p or p.output_penalised or p.logit_bias or p.logprobs is not None)


class DeviceDraws:
    """The draws of a lane whose backend samples on the device, and its requests' counts slots (module
    docstring). num_slots: the backend's counts slots (at least its rows a step); vocab: the logits' width."""

    def __init__(self, num_slots: int, vocab: int) -> None:
        self.vocab = vocab
        self.slots: dict[int, tuple[object, int]] = {}  # id(request) -> (request, slot)
        self.free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first

    def draws(self, rows: list[tuple[object, Sampler, bool]]) -> tuple[np.ndarray, Shaping | None]:
        """(S, 4) f32 draws and the Shaping (None when no row is shaped) of rows (request, sampler, whether it
        samples this step: a prefill chunk's row draws nothing and counts nothing)."""
        draws = np.zeros((len(rows), 4), np.float32)  # (S, 4); rows still in prefill: argmax, unused
        for i, (_, sampler, sampling) in enumerate(rows):
            if sampling:
                draws[i, :3] = sampler.device_draw()
        if not any(shaped(s) for _, s, _ in rows):
            return draws, None
        table = np.zeros((len(rows), 8), np.uint32)  # (S, 8)
        f32 = table.view(np.float32)
        bias: list[tuple[int, float]] = []
        counts: list[tuple[int, np.ndarray]] = []
        step = {id(req) for req, _, _ in rows}
        for i, (req, sampler, sampling) in enumerate(rows):
            p = sampler.params
            table[i, 0] = p.top_k
            f32[i, 1:4] = (p.min_p, p.presence_penalty, p.frequency_penalty)
            table[i, 4] = self._slot(req, step, counts) if sampling and p.output_penalised else NONE
            table[i, 5:7] = (len(bias), len(p.logit_bias))
            table[i, 7] = NONE if p.logprobs is None or not sampling else p.logprobs
            bias.extend(p.logit_bias)
        pairs = np.zeros((max(len(bias), 1), 2), np.uint32)  # (pairs, 2)
        if bias:
            pairs[:, 0] = [t for t, _ in bias]
            pairs[:, 1] = np.array([b for _, b in bias], np.float32).view(np.uint32)
        return draws, Shaping(table, pairs, tuple(counts))

    def _slot(self, req, step: set[int], counts: list) -> int:
        """req's counts slot; a new one gets its counts (from its output ids) appended to `counts`."""
        held = self.slots.get(id(req))
        if held is not None:
            return held[1]
        if not self.free:
            self._reclaim(step)
        slot = self.free.pop()
        self.slots[id(req)] = (req, slot)
        ids = np.asarray(req.output_ids, np.intp)  # bincount takes intp (32 bits under Pyodide)
        counts.append((slot, np.bincount(ids, minlength=self.vocab)[:self.vocab].astype(np.uint32)))
        return slot

    def _reclaim(self, step: set[int]) -> None:
        """Free the slots of finished requests, else one of a request outside this step."""
        done = [key for key, (req, _) in self.slots.items() if req.status is SequenceStatus.FINISHED]
        others = [key for key in self.slots if key not in step]
        for key in done or others[:1]:
            self.free.append(self.slots.pop(key)[1])
