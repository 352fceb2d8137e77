"""Teacher forcing through an LLMEngine, on whatever backend it runs: in CPython (the CPU backend, wgpu-py on
lavapipe) and in the page's worker, where tests install this file (BootedPage.install) and run it on the tab's
own engine (its CPU path or WebGPU on SwiftShader). Imports only pagedkv and numpy, which the page has.

For llama.cpp's greedy ids after a prompt, each row is what we would pick given llama.cpp's history: our argmax
and our margin between it and llama.cpp's id (0 where they agree), from the engine's own logits through its
scheduler, KV groups and decode path. llama_reference.forced_differences judges them under the near-tie rule.
"""
from __future__ import annotations

import numpy as np

from pagedkv.sampling import ForcedSampler, SamplingParams

NO_STOP = 10**6  # no token id stops a forced run: it makes every row


class MarginSampler(ForcedSampler):
    """ForcedSampler that also keeps, per forced row, (our argmax, our logit margin over the forced id)."""

    def __init__(self, forced_ids) -> None:
        super().__init__(forced_ids)
        self.rows: list[tuple[int, float]] = []

    def sample(self, logits: np.ndarray, previous_ids=(), output_ids=()) -> int:
        i = len(self.logprobs)
        if i < len(self.forced_ids):
            ours = int(np.argmax(logits))
            self.rows.append((ours, float(logits[ours] - logits[self.forced_ids[i]])))
        return super().sample(logits, previous_ids, output_ids)


async def forced_rows(engine, cases: list[tuple[list[int], list[int]]], model: str | None = None) -> list:
    """[(argmax, margin) per forced id] per (prompt_ids, forced_ids) case, the cases run one after another."""
    out = []
    for prompt, forced in cases:
        sampler = MarginSampler(forced)
        kw = {} if model is None else {"model": model}
        engine.add_request(list(prompt), SamplingParams(max_tokens=len(forced), stop_token_ids=(NO_STOP,)),
                           sampler=sampler, **kw)
        while engine.has_unfinished:
            await engine.step()
        out.append(sampler.rows)
    return out
