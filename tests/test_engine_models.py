"""Several models in one LLMEngine, one pool of pages (engine.add_model, lanes.py, CpuBackend(pages=...)).

Two tiny random models of different KV widths (the tiny model: 512 f32 bytes a token, 64-token blocks in a
32 KiB page; the mixed model: 2,048 bytes, 16-token blocks) share one page buffer and one BlockPool. Checked:
each model's greedy tokens are exactly what it generates alone while the other runs; a pool too small for
both at once serves both to the end (preempting across models, nothing refused); the pages weights reserve,
the numbers when they cannot be had; unloading a model gives its pages back.
"""
from __future__ import annotations

import numpy as np
import pytest
from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)

from pagedkv.backends.cpu import CpuBackend, allocate_pages, plan_pages
from pagedkv.engine import EngineConfig, LLMEngine, NeverFits, run_sync
from pagedkv.kv.block_pool import BlockPool
from pagedkv.model.tiny import mixed_config, write_tiny_model
from pagedkv.model.weights import ModelWeights
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[10**6])  # no token stops it: every run makes max_tokens


@pytest.fixture(scope="module")
def mixed_weights(tmp_path_factory) -> ModelWeights:
    path = tmp_path_factory.mktemp("models") / "mixed-random"
    write_tiny_model(path, seed=1, config=mixed_config())
    return ModelWeights.load(path)


def _tok(weights: ModelWeights) -> Tokenizer:
    return Tokenizer.from_manifest(weights.manifest)


def shared(tiny, mixed, num_pages: int, config: EngineConfig = EngineConfig()) -> LLMEngine:
    page, (bs_tiny, bs_mixed) = plan_pages([tiny.config, mixed.config])
    pages = allocate_pages(num_pages, page)
    engine = LLMEngine(CpuBackend(tiny, num_pages, bs_tiny, pages=pages), _tok(tiny), config, model="tiny",
                       pool=BlockPool(num_pages))
    engine.add_model("mixed", CpuBackend(mixed, num_pages, bs_mixed, pages=pages), _tok(mixed))
    return engine


def alone(weights, prompt: list[int]) -> list[int]:
    engine = LLMEngine(CpuBackend(weights, 64, 16), _tok(weights))
    return run_sync(engine.generate(prompt, GREEDY)).output_ids


def drive(engine: LLMEngine) -> None:
    while engine.has_unfinished:
        run_sync(engine.step())


def test_pages_give_each_model_its_block_and_one_buffer_holds_both(tiny_weights, mixed_weights):  # noqa: F811
    engine = shared(tiny_weights, mixed_weights, 8)
    assert engine.models == ["tiny", "mixed"]
    assert (engine.lane("tiny").kv.block_size, engine.lane("mixed").kv.block_size) == (64, 16)
    a, b = engine.lane("tiny").backend.kv, engine.lane("mixed").backend.kv
    assert np.shares_memory(a.k[0], b.k[0]) and a.k[0].base is b.v[1].base and a.k[0].shape[0] == b.k[0].shape[0] == 8
    with pytest.raises(ValueError, match=r"no model 'other' is loaded; loaded: \['tiny', 'mixed'\]"):
        engine.add_request([1, 2], GREEDY, model="other")


def test_each_model_generates_what_it_generates_alone_while_the_other_runs(tiny_weights, mixed_weights):  # noqa: F811
    rng = np.random.default_rng(0)
    p_tiny, p_mixed = ([int(t) for t in rng.integers(3, 500, n)] for n in (40, 70))
    engine = shared(tiny_weights, mixed_weights, 16)
    r_tiny = engine.add_request(p_tiny, GREEDY, model="tiny")
    r_mixed = engine.add_request(p_mixed, GREEDY, model="mixed")
    assert r_tiny != r_mixed and engine.model_of(r_mixed) == "mixed"
    reqs = engine.request(r_tiny), engine.request(r_mixed)
    drive(engine)
    assert reqs[0].output_ids == alone(tiny_weights, p_tiny)
    assert reqs[1].output_ids == alone(mixed_weights, p_mixed)
    assert engine.stats("tiny")["steps"] == engine.stats("mixed")["steps"] == 24  # one forward each per step


def test_a_pool_too_small_for_both_serves_both_by_preempting_across_models(tiny_weights, mixed_weights):  # noqa: F811
    # 6 pages: the tiny model's 100 tokens take 2 (64-token blocks), the mixed model's 80 take 5 (16-token
    # blocks); each fits alone, both at once do not: one waits or is preempted, none is refused.
    rng = np.random.default_rng(1)
    params = SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[10**6])
    p_tiny, p_mixed = [int(t) for t in rng.integers(3, 500, 80)], [int(t) for t in rng.integers(3, 500, 60)]
    engine = shared(tiny_weights, mixed_weights, 6, EngineConfig(max_num_batched_tokens=64))
    r_mixed = engine.add_request(p_mixed, params, model="mixed")
    r_tiny = engine.add_request(p_tiny, params, model="tiny", priority=1)  # ranks first: it may preempt mixed
    reqs = engine.request(r_tiny), engine.request(r_mixed)
    peak = 0
    while engine.has_unfinished:
        run_sync(engine.step())
        peak = max(peak, engine.pool.num_used)
        assert engine.pool.num_used <= 6
    assert [r.finish_reason for r in reqs] == ["length", "length"]
    assert reqs[0].output_ids == _alone_params(tiny_weights, p_tiny, params)
    assert reqs[1].output_ids == _alone_params(mixed_weights, p_mixed, params)
    assert engine.stats("mixed")["preemptions"]["recompute"] >= 1 and peak == 6
    with pytest.raises(NeverFits, match=r"needs up to 120 tokens .* = 8 blocks of 16, but the KV pool only has 6"):
        engine.add_request(p_mixed, SamplingParams(max_tokens=60), model="mixed")


def _alone_params(weights, prompt, params) -> list[int]:
    engine = LLMEngine(CpuBackend(weights, 64, 16), _tok(weights))
    return run_sync(engine.generate(prompt, params)).output_ids


def test_weights_reserve_pages_with_the_numbers_and_unloading_returns_them(tiny_weights, mixed_weights):  # noqa: F811
    page, (bs_tiny, bs_mixed) = plan_pages([tiny_weights.config, mixed_weights.config])
    pages = allocate_pages(10, page)
    engine = LLMEngine(CpuBackend(tiny_weights, 10, bs_tiny, pages=pages), _tok(tiny_weights), model="tiny",
                       pool=BlockPool(10))
    engine.reserve_for("tiny", 3)
    rid = engine.add_request(list(range(3, 103)), SamplingParams(max_tokens=150), model="tiny")  # 4 pages of 64
    run_sync(engine.step())  # its prompt holds 2 pages
    mixed = CpuBackend(mixed_weights, 10, bs_mixed, pages=pages)
    with pytest.raises(NeverFits, match=r"mixed needs 6 pages of the budget; 5 of 10 are free or cached "
                                        r"\(3 hold other models' weights, 2 running requests' KV\)"):
        engine.add_model("mixed", mixed, _tok(mixed_weights), reserve_blocks=6)
    with pytest.raises(NeverFits, match=r"then tiny's request req-0 \(4 pages\) would no longer fit the 3 left"):
        engine.add_model("mixed", mixed, _tok(mixed_weights), reserve_blocks=4)
    assert engine.models == ["tiny"] and engine.pool.num_reserved == 3  # nothing half-loaded
    engine.abort(rid)
    engine.add_model("mixed", mixed, _tok(mixed_weights), reserve_blocks=4)
    assert engine.pool.capacity == 3 and engine.pool_stats()["models"]["mixed"]["weights_pages"] == 4
    r_mixed = engine.add_request(list(range(3, 40)), SamplingParams(max_tokens=4), model="mixed")
    run_sync(engine.step())
    assert engine.remove_model("mixed") == [r_mixed]
    assert (engine.models, engine.pool.num_reserved, engine.pool.num_used, engine.pool.num_cached) == (["tiny"], 3, 3, 0)
    with pytest.raises(ValueError, match="tiny is the engine's only model"):
        engine.remove_model("tiny")


def test_the_memory_panel_colours_every_models_chats_and_the_weights(tiny_weights, mixed_weights):  # noqa: F811
    engine = shared(tiny_weights, mixed_weights, 12)
    engine.reserve_for("tiny", 1)
    engine.reserve_for("mixed", 2)
    engine.add_request(list(range(3, 40)), SamplingParams(max_tokens=4), model="mixed", session="m")  # 3 pages
    engine.add_request(list(range(3, 70)), SamplingParams(max_tokens=4), model="tiny", session="t")  # 2 pages
    run_sync(engine.step())
    snap = engine.kv_snapshot()
    assert sorted(snap["cells"]) == sorted("www" + chr(0x100) * 2 + chr(0x101) * 3 + "f" * 4)
    assert (snap["owners"], snap["owner_models"], snap["per_chat_blocks"]) == (["t", "m"], ["tiny", "mixed"],
                                                                             {"t": 2, "m": 3})
    assert snap["models"]["mixed"] == {"kv_pages": 3, "weights_pages": 2, "null_pages": 0,
                                       "block_size": 16}
    assert snap["models"]["tiny"] == {"kv_pages": 2, "weights_pages": 1, "null_pages": 0,
                                      "block_size": 64}


def test_pages_past_the_buffer_hold_weights_only(tiny_weights, mixed_weights):  # noqa: F811
    """A budget of 10 pages whose buffer has memory for 6 (the weights' 4 never hold K/V): no KV block is ever
    handed out past the buffer, weights take those pages first, and unloading leaves them spare again."""
    page, (bs_tiny, bs_mixed) = plan_pages([tiny_weights.config, mixed_weights.config])
    pages = allocate_pages(6, page)
    engine = LLMEngine(CpuBackend(tiny_weights, 10, bs_tiny, pages=pages), _tok(tiny_weights), model="tiny",
                       pool=10, backed_pages=6)
    assert (engine.pool_stats()["spare_pages"], engine.pool.capacity) == (4, 6)
    engine.reserve_for("tiny", 1)
    assert (engine.pool_stats()["spare_pages"], engine.pool.capacity, engine.lane("tiny").reserved_blocks) == (3, 6, [6])
    engine.add_model("mixed", CpuBackend(mixed_weights, 10, bs_mixed, pages=pages), _tok(mixed_weights),
                     reserve_blocks=5)  # the 3 spare pages, then 2 of the buffer's
    assert engine.pool.capacity == 4 and engine.pool_stats()["reserved_pages"] == 6
    ids = [engine.add_request(list(range(3, 60)), SamplingParams(max_tokens=3), model=m) for m in ("tiny", "mixed")]
    tables = []
    while engine.has_unfinished:
        run_sync(engine.step())
        tables += [b for lane in engine.lanes.values() for r in lane.scheduler.running for b in r.seq.block_table]
    assert tables and max(tables) < 6 and len(ids) == 2
    engine.remove_model("mixed")
    assert (engine.pool_stats()["spare_pages"], engine.pool.capacity) == (3, 6)
    with pytest.raises(ValueError, match="shared pages but the pool has"):
        CpuBackend(mixed_weights, 5, bs_mixed, pages=pages)


def _open_disks(engine: LLMEngine, store, tiny, mixed, budget: int = 1 << 30) -> None:
    run_sync(engine.open_disk_tier(store, tiny.manifest, budget, model="tiny"))
    run_sync(engine.open_disk_tier(store, mixed.manifest, budget, model="mixed"))


def test_every_model_has_the_disk_tier_and_a_reload_restores_both(tiny_weights, mixed_weights):  # noqa: F811
    """Both models' blocks go to one store under one budget (the second tier shares the first's LRU); a fresh
    engine over the same store ("a reload") restores each model's prefix from disk and replies the same."""
    from pagedkv.kv.disk_tier import MemoryStore

    store = MemoryStore()
    prompts = {"tiny": list(range(3, 140)), "mixed": list(range(5, 60))}
    first = shared(tiny_weights, mixed_weights, 16)
    _open_disks(first, store, tiny_weights, mixed_weights)
    assert first.lane("mixed").disk.tier.budget_bytes == first.lane("tiny").disk.tier.budget_bytes
    out = {m: first.request(first.add_request(p, GREEDY, model=m)) for m, p in prompts.items()}
    drive(first)
    assert run_sync(first.flush_disk()) == 0  # write-behind stored every full block already
    written = {m: first.lane(m).stats()["disk_written_blocks"] for m in prompts}
    assert written == {"tiny": 2, "mixed": 4}  # 137 + 23 tokens in 64-token blocks, 55 + 23 in 16-token ones
    again = shared(tiny_weights, mixed_weights, 16)
    _open_disks(again, store, tiny_weights, mixed_weights)
    replies = {m: again.request(again.add_request(prompts[m], GREEDY, model=m)) for m in prompts}
    drive(again)
    for m in prompts:
        assert replies[m].output_ids == out[m].output_ids
        assert again.lane(m).stats()["disk_restored_tokens"] == {"tiny": 128, "mixed": 48}[m]
    assert run_sync(again.forget_owner("nobody")) == 0


def test_one_budget_evicts_the_least_recently_used_block_of_either_model(tiny_weights, mixed_weights):  # noqa: F811
    from pagedkv.kv.disk_tier import MemoryStore

    store = MemoryStore()
    engine = shared(tiny_weights, mixed_weights, 16)
    _open_disks(engine, store, tiny_weights, mixed_weights)
    tiny_tier, mixed_tier = engine.lane("tiny").disk.tier, engine.lane("mixed").disk.tier
    drive_one = lambda m, p: (engine.add_request(p, GREEDY, model=m), drive(engine))  # noqa: E731
    drive_one("tiny", list(range(3, 140)))  # 2 tiny block files
    tiny_file = tiny_tier.key.file_bytes
    run_sync(tiny_tier.set_budget(2 * tiny_file + 2 * mixed_tier.key.file_bytes))  # both tiers see the new budget
    assert mixed_tier.budget_bytes == tiny_tier.budget_bytes
    drive_one("mixed", list(range(5, 60)))  # 4 mixed files: the oldest go first, the tiny ones
    assert mixed_tier.num_bytes <= mixed_tier.budget_bytes
    assert tiny_tier.num_blocks == 0 and mixed_tier.num_blocks >= 2
