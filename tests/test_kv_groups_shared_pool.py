"""A model with window KV groups in a pool several models share (kv/manager.py, SharedKVBudget, LLMEngine's
add_model, CpuBackend(pages=...)), and the prefix cache keeping its blocks there after a sequence ends.

A tiny random Gemma 3 (12 layers: 5 and 11 global, the rest a 32-token window; groups of 2 layers, one full and
five window groups) shares one page buffer and one BlockPool with the tiny SmolLM2-shaped llama (2 layers). Both
take 512 f32 bytes a token in a page (two layers each), so both get 16-token blocks in 8 KiB pages. Checked with
exact page counts: a page holds one Gemma group's 2 layers; at every step the pool's used pages are the two
models' held pages plus Gemma's one reserved null page; each model's greedy ids are the numpy reference's while
the other runs, also when a pool too small for both preempts across models; a regenerate, a follow-up and n
alternatives reuse Gemma's released blocks from the cache; the other model's allocations evict them oldest
released first; unloading Gemma gives back its null page and forgets its cached pages in every group.
The prompts (token ids 24..123 and 30..229 / 50..119) are the ones test_kv_groups.py holds to the reference
and have no near ties there.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from model_fixtures import gemma_dir, gemma_weights, reference_greedy, tiny_dir, tiny_weights  # noqa: F401  (fixtures)

from pagedkv.backends.cpu import CpuBackend, allocate_pages, plan_pages
from pagedkv.backends.numpy_ref import NumpyModel
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.accounting import SharedKVBudget, kv_stats
from pagedkv.kv.block_pool import BlockPool
from pagedkv.kv.groups import KVGroups
from pagedkv.kv.spec import SMOLLM2_135M, KVSpec
from pagedkv.model.tiny import tiny_config
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=24, stop_token_ids=(10_000,))  # no token stops it: 24 ids every run
GEMMA_PROMPT = list(range(24, 124))  # 100 tokens: past three 32-token windows
LLAMA_PROMPT = list(range(50, 120))  # 70 tokens
LONG_LLAMA_PROMPT = list(range(30, 230))  # 200 tokens: 14 pages with its 24 new ones


@pytest.fixture(scope="module")
def references(gemma_weights, tiny_weights):  # noqa: F811
    gemma, llama = NumpyModel(gemma_weights), NumpyModel(tiny_weights)
    return {"gemma": reference_greedy(gemma, GEMMA_PROMPT, 24), "llama": reference_greedy(llama, LLAMA_PROMPT, 24),
            "long_llama": reference_greedy(llama, LONG_LLAMA_PROMPT, 24), "model": gemma}


def shared(gemma, llama, num_pages: int, attention=None) -> LLMEngine:
    """attention: the Gemma backend's (None: the reference's; PointerTwin: the tab's wasm kernels' twin)."""
    page, (bs_gemma, bs_llama) = plan_pages([gemma.config, llama.config])
    assert (page, bs_gemma, bs_llama) == (8192, 16, 16)
    pages = allocate_pages(num_pages, page)
    engine = LLMEngine(CpuBackend(gemma, num_pages, bs_gemma, pages=pages, attention=attention),
                       Tokenizer.from_manifest(gemma.manifest),
                       EngineConfig(max_num_batched_tokens=32), model="gemma", pool=BlockPool(num_pages))
    engine.add_model("llama", CpuBackend(llama, num_pages, bs_llama, pages=pages),
                     Tokenizer.from_manifest(llama.manifest))
    return engine


def run(engine: LLMEngine, work: list[tuple[str, list[int]]], priorities=None):
    """Each (model, prompt) greedily to 24 ids; returns their ids and, per step, (Gemma's pages per group, the
    llama's pages, the pool's used pages), checking the pool's count against what the models hold."""
    rids = [engine.add_request(p, GREEDY, model=m, priority=(priorities or [0] * len(work))[i])
            for i, (m, p) in enumerate(work)]
    reqs = [engine.request(r) for r in rids]
    trace = []
    while engine.has_unfinished:
        run_sync(engine.step())
        gemma, llama = engine.lane("gemma"), engine.lane("llama")
        assert engine.pool.num_used == gemma.held_blocks + llama.held_blocks + 1  # + Gemma's null page
        trace.append((kv_stats(gemma.kv).group_used_blocks, llama.held_blocks, engine.pool.num_used))
    return [r.output_ids for r in reqs], trace


def test_a_gemma_shaped_and_a_smollm2_shaped_model_share_one_pool_with_window_groups(gemma_weights, tiny_weights,  # noqa: F811
                                                                                    references):
    engine = shared(gemma_weights, tiny_weights, 64)
    gemma, llama = engine.lane("gemma"), engine.lane("llama")
    assert (gemma.kv.num_groups, gemma.kv.null_block, llama.kv.num_groups) == (6, 0, 1)
    a, b = gemma.backend.kv, llama.backend.kv
    assert (len(a.k), len(b.k)) == (2, 2)  # Gemma: one pool per slot of a 2-layer group, not 12 layers
    assert np.shares_memory(a.k[0], b.k[0]) and a.k[1].base is b.v[0].base
    (g_ids, l_ids), trace = run(engine, [("gemma", GEMMA_PROMPT), ("llama", LLAMA_PROMPT)])
    assert (g_ids, l_ids) == (references["gemma"], references["llama"])
    # Prefill in 32-token chunks: the window groups stop growing at 4 pages, then release as the window slides.
    assert trace[:4] == [((2,) * 6, 2, 15), ((4,) * 6, 4, 29), ((6,) + (4,) * 5, 5, 32), ((7,) + (3,) * 5, 5, 28)]
    assert max(max(groups[1:]) for groups, _, _ in trace) == 4 and trace[-1] == ((0,) * 6, 0, 1)
    assert engine.pool_stats()["models"]["gemma"] == {"kv_pages": 0, "weights_pages": 0, "null_pages": 1,
                                                      "block_size": 16}
    assert engine.pool_stats()["reserved_pages"] == 1


def test_the_tabs_attention_kernels_read_window_groups_in_shared_pages(gemma_weights, tiny_weights,  # noqa: F811
                                                                        references):
    """The tab's wasm attention (its CPython twin) steps through a page view whose blocks lie a page apart, one
    group slot's block in each: Gemma's one-token steps run it while the llama shares the pages."""
    from pagedkv.backends.cpu_attention import PointerTwin

    engine = shared(gemma_weights, tiny_weights, 64, attention=PointerTwin())
    (g_ids, l_ids), _ = run(engine, [("gemma", GEMMA_PROMPT), ("llama", LLAMA_PROMPT)])
    assert (g_ids, l_ids) == (references["gemma"], references["llama"])


def test_a_pool_too_small_for_both_preempts_across_models_and_both_keep_their_ids(gemma_weights, tiny_weights,  # noqa: F811
                                                                                 references):
    # 34 pages less the null page: Gemma's request may need 33 (8 full + 5 x 5 window pages), the llama's 14.
    for first, (gemma_rank, llama_rank) in (("llama", (0, 1)), ("gemma", (1, 0))):
        engine = shared(gemma_weights, tiny_weights, 34)
        ids, trace = run(engine, [("gemma", GEMMA_PROMPT), ("llama", LONG_LLAMA_PROMPT)], [gemma_rank, llama_rank])
        assert ids == [references["gemma"], references["long_llama"]]
        assert max(used for _, _, used in trace) == 33  # every page but the null one held at the peak
        loser = "gemma" if first == "llama" else "llama"
        assert engine.stats(loser)["preemptions"]["recompute"] >= 1
        assert engine.stats(first)["preemptions"] == {"swap": 0, "recompute": 0}


def test_released_window_blocks_serve_a_regenerate_a_follow_up_and_alternatives(gemma_weights, tiny_weights,  # noqa: F811
                                                                               references):
    engine = shared(gemma_weights, tiny_weights, 64)
    kv = engine.lane("gemma").kv
    prefilled = lambda: engine.stats("gemma")["prefill_tokens"]  # noqa: E731
    (out,), _ = run(engine, [("gemma", GEMMA_PROMPT)])
    # Full group: the prompt's 6 full pages; each window group: the 2 pages a query at token 96 sees.
    tables = kv.cached_tables(GEMMA_PROMPT)
    assert [len(t) for t in tables] == [6] * 6 and all(t[:4] == [0] * 4 for t in tables[1:])
    before = prefilled()
    (again,), _ = run(engine, [("gemma", GEMMA_PROMPT)])  # regenerate: 96 tokens from the cache
    assert (again, prefilled() - before) == (out, 4)
    follow_up = GEMMA_PROMPT + out + [7, 8, 9]
    before = prefilled()
    (second,), _ = run(engine, [("gemma", follow_up)])
    assert prefilled() - before == len(follow_up) - 112  # 7 pages a group from the cache
    assert second == reference_greedy(references["model"], follow_up, 24)
    before = prefilled()
    alternatives = run_sync(engine.generate(GEMMA_PROMPT, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=24,
                                                                         stop_token_ids=(10_000,)), model="gemma"))
    assert prefilled() - before == 4 and [len(s.output_ids) for s in alternatives.samples] == [24] * 3
    assert engine.pool.num_used == 1  # every sample's pages back in the pool; the null page stays reserved


@pytest.mark.parametrize("num_pages, evicted, regenerate_prefill", [(40, 8, 4), (36, 8, 100)])
def test_the_other_models_allocations_evict_released_window_blocks_oldest_first(gemma_weights, tiny_weights,  # noqa: F811
                                                                               num_pages, evicted,
                                                                               regenerate_prefill):
    """After Gemma's request the pool has 6 free pages; the llama's 14 take them and evict 8 cached pages,
    the oldest released first: window pages that left early in the decode. With 40 pages those are pages no
    hit on the prompt needs, and a regenerate still reads 96 tokens from the cache; with 36, Gemma's own
    allocations had already evicted the oldest during its run, so the 8 include window group 1's page 4, which
    a hit at token 96 (and, its earlier pages gone, every shorter one) needs: the regenerate misses."""
    engine = shared(gemma_weights, tiny_weights, num_pages)
    (out,), _ = run(engine, [("gemma", GEMMA_PROMPT)])
    free, cached = engine.pool.num_free, engine.pool.num_cached
    assert free == 6
    run(engine, [("llama", LONG_LLAMA_PROMPT)])
    assert engine.pool.num_cached == cached - evicted + 13  # the llama's 13 full pages (223 tokens computed)
    before = engine.stats("gemma")["prefill_tokens"]
    (again,), _ = run(engine, [("gemma", GEMMA_PROMPT)])
    assert (again, engine.stats("gemma")["prefill_tokens"] - before) == (out, regenerate_prefill)


def test_unloading_a_model_with_window_groups_returns_its_null_page_and_every_groups_cache(gemma_weights,  # noqa: F811
                                                                                          tiny_weights):
    engine = shared(gemma_weights, tiny_weights, 64)
    run(engine, [("gemma", GEMMA_PROMPT), ("llama", LLAMA_PROMPT)])
    llama_cached = engine.pool.num_cached - sum(1 for b in engine.pool.block_states()
                                                if b.block_hash is not None and b.salt.startswith("gemma/"))
    assert engine.pool.num_cached > llama_cached > 0
    assert engine.remove_model("gemma") == []
    assert (engine.pool.num_reserved, engine.pool.num_used, engine.pool.num_cached) == (0, 0, llama_cached)
    assert engine.pool_stats()["models"] == {"llama": {"kv_pages": 0, "weights_pages": 0, "null_pages": 0,
                                                       "block_size": 16}}


def test_a_byte_budget_gives_gemma_3_270m_blocks_of_one_groups_layers():
    """Gemma 3 270M (18 layers, 1 KV head of 256) in pages sized for SmolLM2-135M f16 (16 tokens of 30 layers x
    3 KV heads x 64: 368,640 B): a token of one 3-layer group takes 3,072 B, so its blocks hold 64 tokens
    (every layer: 18,432 B, 16 tokens); it reserves one null page of the budget."""
    page = 16 * SMOLLM2_135M.bytes_per_token
    budget = SharedKVBudget(10 * page, page)
    gemma_spec = KVSpec(18, 1, 256)
    groups = KVGroups.of(replace(tiny_config(), architecture="gemma3", n_layers=18, sliding_window=512,
                                 n_heads=4, n_kv_heads=1, head_dim=256))
    smol = budget.add_model("smollm2", SMOLLM2_135M)
    flat = budget.add_model("gemma-flat", gemma_spec)
    gemma = budget.add_model("gemma", gemma_spec, groups=groups)
    assert (smol.block_size, flat.block_size, gemma.block_size) == (16, 16, 64)
    assert (gemma.num_groups, gemma.null_block, budget.pool.num_reserved) == (6, 0, 1)
    assert budget.page_fill()["gemma/f16"] == 64 * 3072 / page
    with pytest.raises(ValueError, match="its KV groups hold 18 layers, its spec 12"):
        budget.add_model("short", KVSpec(12, 1, 256), groups=groups)
