"""Stop pressed while a step awaits the backend (issue 16, item 3): the aborted request's blocks are freed,
its output of that step is dropped, and every other request keeps every token."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from model_fixtures import reference_greedy, tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(10_000,))  # a stop id the tiny vocab never emits
SHORT, LONG = list(range(3, 8)), list(range(63, 86))  # 5 and 23 tokens, no shared prefix


def run_in_own_loop(coro):
    """asyncio.run in a thread of its own: when the browser tests ran first, Playwright's sync API keeps a loop
    running in this thread, where asyncio.run refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class YieldingBackend(CpuBackend):
    """Gives the event loop a turn inside forward and the block copies, as the WebGPU backend does while the
    GPU works; `awaiting` names the call in progress."""

    awaiting: str | None = None

    async def _turn(self, name: str) -> None:
        self.awaiting = name
        await asyncio.sleep(0)
        self.awaiting = None

    async def forward(self, batch, *, greedy=False, attention_mass=None):
        await self._turn("forward")
        return await super().forward(batch, greedy=greedy, attention_mass=attention_mass)

    async def copy_blocks(self, ops):
        await self._turn("copy_blocks")
        await super().copy_blocks(ops)


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):
    return Tokenizer.from_manifest(tiny_weights.manifest)


async def run_and_abort(engine, victim: str, at_step: int, during: str) -> list:
    """Step until nothing is unfinished; in step `at_step`, abort `victim` while the backend is in `during`."""
    outputs, step = [], 0
    while engine.has_unfinished:
        task = asyncio.ensure_future(engine.step())
        if step == at_step:
            await asyncio.sleep(0)
            assert engine.backend.awaiting == during
            engine.abort(victim)
        outputs.append(await task)
        step += 1
    return outputs


def test_abort_during_the_forward_drops_only_that_requests_output(tiny_weights, tiny_model, tokenizer):
    engine = LLMEngine(YieldingBackend(tiny_weights, num_blocks=16, block_size=16), tokenizer, EngineConfig())
    a, b = engine.add_request(SHORT, GREEDY), engine.add_request(LONG, GREEDY)
    req_a, req_b = engine.request(a), engine.request(b)
    outputs = run_in_own_loop(run_and_abort(engine, a, at_step=2, during="forward"))
    assert [o.request_id for o in outputs[2]] == [b]  # the aborted request's token of that step is dropped
    assert req_a.output_ids == reference_greedy(tiny_model, SHORT, 2) and req_a.finish_reason == "abort"
    assert req_b.output_ids == reference_greedy(tiny_model, LONG, 12) and req_b.finish_reason == "length"
    assert [t for step in outputs for o in step if o.request_id == b for t in o.token_ids] == req_b.output_ids
    s = engine.stats()
    assert (s["used_blocks"], s["free_blocks"] + s["cached_blocks"]) == (0, 16)


def test_abort_during_the_copy_on_write_before_the_forward(tiny_weights, tiny_model, tokenizer):
    # n = 2: the second step's first append into the shared partial prompt block copies it first.
    engine = LLMEngine(YieldingBackend(tiny_weights, num_blocks=16, block_size=16), tokenizer, EngineConfig())
    a, b = engine.add_request(SHORT, replace(GREEDY, n=2)), engine.add_request(LONG, GREEDY)
    req_a, req_b = engine.request(a), engine.request(b)
    outputs = run_in_own_loop(run_and_abort(engine, a, at_step=1, during="copy_blocks"))
    assert [o.request_id for o in outputs[1]] == [b]
    assert [s.output_ids for s in req_a.samples] == [reference_greedy(tiny_model, SHORT, 1)] * 2
    assert {s.finish_reason for s in req_a.samples} == {"abort"}
    assert req_b.output_ids == reference_greedy(tiny_model, LONG, 12)
    s = engine.stats()
    assert (s["used_blocks"], s["free_blocks"] + s["cached_blocks"], s["copy_ops"]) == (0, 16, 1)
