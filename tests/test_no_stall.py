"""No request stalls another stream for more than one step (issue 49): a long prompt's prefill is cut into chunks
that fit the step's token budget beside the running streams, so a decoding stream gets its token at every step
while the prefill runs, and no step computes more than the budget. Measured on the engine's own events (each
step's outputs, each forward's batch), not on a clock."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from model_fixtures import reference_greedy, tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

BUDGET = 32  # tokens one step computes at most (max_num_batched_tokens)
# SHORT decodes 12 greedy tokens equal to the numpy reference, in mixed batches too (test_abort_during_step).
SHORT = list(range(3, 8))
GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(10_000,))  # a stop id the tiny vocab never emits
LONG = [50 + (7 * i) % 400 for i in range(200)]  # 200 tokens: ceil(200 / 31) = 7 chunks beside the decoding stream


def run_alone(coro):
    """asyncio.run in a thread of its own: when the browser tests ran first, Playwright's sync API keeps a loop
    running in this thread, where asyncio.run refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class CountingBackend(CpuBackend):
    """Records the tokens of each forward's batch."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.batches: list[int] = []

    async def forward(self, batch, *, greedy=False, attention_mass=None):
        self.batches.append(len(batch.token_ids))
        return await super().forward(batch, greedy=greedy, attention_mass=attention_mass)


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):  # noqa: F811
    return Tokenizer.from_manifest(tiny_weights.manifest)


def test_a_long_prefill_never_costs_a_decoding_stream_a_step(tiny_weights, tiny_model, tokenizer):  # noqa: F811
    backend = CountingBackend(tiny_weights, num_blocks=64, block_size=16)
    engine = LLMEngine(backend, tokenizer, EngineConfig(max_num_batched_tokens=BUDGET))

    async def run() -> tuple[str, str, list[dict[str, int]]]:
        steps = []  # per step: tokens each request got
        a = engine.add_request(SHORT, GREEDY)
        steps.append({o.request_id: len(o.token_ids) for o in await engine.step()})
        b = engine.add_request(LONG, SamplingParams(max_tokens=2, stop_token_ids=(10_000,)))
        while engine.is_unfinished(b):
            steps.append({o.request_id: len(o.token_ids) for o in await engine.step()})
        return a, b, steps

    a, b, steps = run_alone(run())
    arrived = steps[1:]
    # While b's 200 prompt tokens are computed (7 steps of at most 31 beside a's one), a gets a token every step;
    # b's first token comes with its last chunk, its second a step later.
    assert [s.get(a) for s in arrived] == [1] * 8
    assert [s.get(b) for s in arrived] == [0] * 6 + [1, 1]
    assert backend.batches == [5] + [32] * 6 + [1 + 200 - 6 * 31, 2]
    assert max(backend.batches) <= BUDGET
    assert engine.request(a).output_ids[:9] == reference_greedy(tiny_model, SHORT, 12)[:9]
