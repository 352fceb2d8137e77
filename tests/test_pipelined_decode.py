"""The pipelined decode's bookkeeping (pagedkv/decode_chain.py) under CPython: a numpy backend that keeps the
WebGPU backend's submit contract (feed=True: the step's token ids are the ids the previous submit drew),
so the engine chains its decode steps here as on a GPU. The GPU half (the ids copied on the device, the
queue order) is tests/browser/test_decode_chain.py, on both emulators."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from model_fixtures import reference_greedy, tiny_dir, tiny_model, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

PROMPTS = [list(range(3 + 60 * i, 3 + 60 * i + n)) for i, n in enumerate((5, 23, 40, 17))]


class FeedingCpuBackend(CpuBackend):
    """CpuBackend with Backend.submit: greedy ids only; a fed step's token ids are the last submit's ids."""

    pipelines = True
    samples_on_device = False

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.fed: list[bool] = []
        self.last_ids: np.ndarray | None = None

    async def submit(self, batch, *, greedy=False, draws=None, feed=False):
        assert draws is None and greedy
        if feed:
            assert self.last_ids is not None and self.last_ids.shape == batch.token_ids.shape
            assert (batch.token_ids == 0).all()  # the placeholders the feed overwrites
            batch = replace(batch, token_ids=self.last_ids.copy())
        ids = await self.forward(batch, greedy=True)
        self.last_ids, self.fed = ids, self.fed + [feed]

        async def landing():
            return ids

        return landing()


@pytest.fixture(scope="module")
def tokenizer(tiny_weights):
    return Tokenizer.from_manifest(tiny_weights.manifest)


def engine_on(weights, tokenizer, num_blocks=64, pipeline=True, **kw):
    backend = FeedingCpuBackend(weights, num_blocks=num_blocks, block_size=16)
    return LLMEngine(backend, tokenizer, EngineConfig(pipeline_decode=pipeline, **kw))


def drain(engine, on_step=None) -> int:
    steps = 0
    while engine.has_unfinished or engine.lane().in_flight is not None:
        run_sync(engine.step())
        steps += 1
        if on_step is not None:
            on_step(steps)
    return steps


def params(max_tokens=12, stop=10_000):
    return SamplingParams(max_tokens=max_tokens, stop_token_ids=(stop,))


def test_chained_steps_generate_the_reference_and_free_every_block(tiny_weights, tiny_model, tokenizer):
    engine = engine_on(tiny_weights, tokenizer)
    reqs = [engine.request(engine.add_request(p, params())) for p in PROMPTS]
    drain(engine)
    assert [r.output_ids for r in reqs] == [reference_greedy(tiny_model, p, 12) for p in PROMPTS]
    assert sum(engine.backend.fed) >= 8  # most decode steps were submitted before the last one's ids were read
    assert engine.stats()["used_blocks"] == 0
    assert all(r.seq.token_ids[len(p):] == r.output_ids for r, p in zip(reqs, PROMPTS))


def test_a_stop_seen_one_step_late_leaves_the_pool_as_without_the_chain(tiny_weights, tiny_model, tokenizer):
    """Request 2 (40 prompt tokens) stops on the id it draws at position 48, whose slot opens a fourth block:
    the chained engine ran a step for it that the plain one did not, and releases that slot and block."""
    ref = reference_greedy(tiny_model, PROMPTS[2], 12)
    stop = ref[8]  # output 8 sits at position 48
    assert stop not in ref[:8]
    ends = {}
    for pipeline in (False, True):
        engine = engine_on(tiny_weights, tokenizer, pipeline=pipeline)
        req = engine.request(engine.add_request(PROMPTS[2], params(stop=stop)))
        drain(engine)
        pool = engine.kv.pool
        ends[pipeline] = (req.output_ids, req.finish_reason, req.seq.token_ids, pool.num_free, pool.num_cached)
    assert ends[True] == ends[False]
    assert ends[True][0] == ref[:9] and ends[True][1] == "stop"
    assert ends[True][4] == 3  # the three full blocks (48 tokens) stay cached, no fourth


def test_a_new_request_ends_the_chain_and_is_served(tiny_weights, tiny_model, tokenizer):
    engine = engine_on(tiny_weights, tokenizer)
    first = engine.request(engine.add_request(PROMPTS[0], params()))
    late = []

    def arrive(step):
        if step == 4:
            assert engine.lane().in_flight is not None
            late.append(engine.request(engine.add_request(PROMPTS[3], params())))

    drain(engine, arrive)
    assert first.output_ids == reference_greedy(tiny_model, PROMPTS[0], 12)
    assert late[0].output_ids == reference_greedy(tiny_model, PROMPTS[3], 12)
    assert engine.stats()["used_blocks"] == 0


def test_a_pool_short_of_a_block_reads_the_step_and_schedules_as_usual(tiny_weights, tiny_model, tokenizer):
    """Six blocks for two 40-token prompts that grow to 52: at position 48 the chain finds no block for the
    next slot, so the step's ids are read and the scheduler preempts as it would without the chain."""
    engine = engine_on(tiny_weights, tokenizer, num_blocks=7)
    prompts = [PROMPTS[2], [t + 1 for t in PROMPTS[2]]]
    reqs = [engine.request(engine.add_request(p, params())) for p in prompts]
    drain(engine)
    assert [r.output_ids for r in reqs] == [reference_greedy(tiny_model, p, 12) for p in prompts]
    assert engine.stats()["used_blocks"] == 0 and sum(engine.stats()["preemptions"].values()) >= 1


def test_rebuild_and_abort_with_a_step_in_flight_keep_exact_histories(tiny_weights, tiny_model, tokenizer):
    engine = engine_on(tiny_weights, tokenizer)
    reqs = [engine.request(engine.add_request(p, params())) for p in PROMPTS[:3]]
    for _ in range(5):
        run_sync(engine.step())
    assert engine.lane().in_flight is not None
    engine.abort(reqs[1].request_id)
    assert reqs[1].seq.token_ids[len(PROMPTS[1]):] == reqs[1].output_ids  # its placeholder is gone
    engine.rebuild(FeedingCpuBackend(tiny_weights, num_blocks=32, block_size=16))
    assert engine.lane().in_flight is None
    assert all(r.seq.token_ids[len(p):] == r.output_ids for r, p in zip(reqs, PROMPTS))
    drain(engine)
    for i in (0, 2):
        assert reqs[i].output_ids == reference_greedy(tiny_model, PROMPTS[i], 12)
    assert engine.stats()["used_blocks"] == 0


def test_pipeline_decode_must_be_a_bool():
    with pytest.raises(ValueError, match="pipeline_decode must be a bool"):
        EngineConfig(pipeline_decode="yes")
