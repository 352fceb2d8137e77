"""bench/two_models.py on a small pool: SmolLM2 (23,040 B/token) and a 1.5B-class model (49,152 B/token) in 40 pages
of 786,432 B (16 tokens of the 1.5B, 32 of SmolLM2), short conversations (at most 512 tokens: 32 pages of the 1.5B,
so every turn fits the pool alone)."""
import pytest

import bench.two_models as two_models
from bench.kv_sim import Replay, WorkloadConfig, cached_blocks_of, make_workload
from bench.two_models import ROWS, Model, PairReplay, choose_budget, split_bytes
from pagedkv.kv.accounting import kv_stats
from pagedkv.kv.spec import SMOLLM2_135M, KVSpec

MODELS = [Model("SmolLM2-135M-Instruct", SMOLLM2_135M.with_(dtype="f16"), 0),
          Model("synthetic-1.5b", KVSpec(24, 8, 64, dtype="f16"), 1)]
PAGE = 16 * 49_152
KV_BYTES = 40 * PAGE + 1_000  # the 1,000 B past the last page are no page
CFG = WorkloadConfig(num_sessions=8, mean_arrival_gap_s=2.0, system_prompt_lens=(20, 60), user_median=20,
                     user_range=(4, 100), answer_median=60, answer_range=(8, 200), mean_think_s=5.0,
                     model_context=512, warmup_s=0, vocab=1000)


def pair(row: str) -> PairReplay:
    plans = [make_workload(CFG, m.seed) for m in MODELS]
    return PairReplay(ROWS[row], MODELS, plans, CFG, KV_BYTES, max_context=128)


def test_split_bytes_gives_the_same_tokens_or_the_same_bytes():
    tokens = KV_BYTES // (23_040 + 49_152)
    assert tokens == 435
    assert split_bytes(KV_BYTES, [23_040, 49_152], "tokens") == [435 * 23_040, 435 * 49_152] == [10_022_400, 21_381_120]
    assert split_bytes(KV_BYTES, [23_040, 49_152], "bytes") == [15_729_140, 15_729_140]
    with pytest.raises(ValueError, match="split must be one of"):
        split_bytes(KV_BYTES, [1, 2], "pages")


@pytest.mark.parametrize("row, shares, slots", [
    ("contiguous", [10_022_400, 21_381_120], [435, 435]),
    ("contiguous_equal_bytes", [15_729_140, 15_729_140], [682, 320]),  # 682.6 and 320.0 tokens
])
def test_the_contiguous_side_splits_the_bytes(row, shares, slots):
    p = pair(row)
    assert p.shares == shares and sum(shares) <= KV_BYTES
    assert [r.alloc.arena.num_slots for r in p.replays] == slots
    while not p.done:
        p.tick()
        assert p.now < 5_000, "the replay did not end"
        for r, n in zip(p.replays, slots):  # each model reserves within its own arena only
            assert r.alloc.stats().used_blocks <= n
    result = p.result()
    assert [v["kv_bytes_share"] for v in result["models"].values()] == shares
    assert result["pair"]["turns_failed"] > 0  # 128-token reservations: 3 sessions at a time per model
    assert result["pair"]["peak_used_bytes"] <= KV_BYTES


def test_the_shared_pool_stays_in_budget_and_serves_every_turn_that_fits():
    p = pair("paged_shared")
    pool = p.shared.pool
    assert (p.page_bytes, pool.num_blocks) == (PAGE, 40)
    assert [r.alloc.block_size for r in p.replays] == [32, 16]  # as SharedKVBudget gives: 32 x 23,040 <= a page
    assert p.shared.page_fill() == {"SmolLM2-135M-Instruct/f16": 32 * 23_040 / PAGE, "synthetic-1.5b/f16": 1.0}
    both_held_pages = 0
    while not p.done:
        p.tick()
        assert p.now < 5_000, "the replay did not end"
        used = [kv_stats(r.alloc).used_blocks for r in p.replays]
        assert sum(used) == pool.num_used  # no page is held by both models
        assert sum(h[0] for h in p.held_bytes()) == pool.num_used * PAGE <= KV_BYTES
        assert sum(cached_blocks_of(r.alloc) for r in p.replays) == pool.num_cached
        both_held_pages += all(used)
    assert both_held_pages > 0  # the two models really drew from the one pool at the same time
    result = p.result()
    for v in result["models"].values():
        assert v["turns"] > 0 and v["turns_failed"] == 0 and v["oom_rate"] == 0.0
    # the pool was short: turns waited or were preempted rather than failing
    assert result["pair"]["deferred_ticks"] + result["pair"]["preemptions"] > 0
    assert result["pair"]["peak_used_bytes"] == 40 * PAGE


def test_without_waiting_the_same_shared_pool_fails_turns():
    result = pair("paged_shared_no_wait").run()
    assert result["pair"]["turns_failed"] > 0 and result["pair"]["preemptions"] == 0
    assert result["pair"]["oom_rate"] == result["pair"]["turns_failed"] / result["pair"]["turns"]


def test_a_replay_on_a_given_manager_must_be_paged():
    p = pair("paged_shared")
    with pytest.raises(ValueError, match="paged allocator"):
        Replay("contiguous", [], CFG, KV_BYTES, 49_152, manager=p.replays[0].alloc)


def plan(budget_bytes: int, pages: int) -> dict:
    return {"budget_bytes": budget_bytes, "fixed_bytes": 1_032_632_864, "kv_bytes": pages * PAGE,
            "num_pages": pages, "widest_model_tokens": pages * 16}


@pytest.mark.parametrize("pages, runs_at", [(128, 1 << 30), (127, 3 << 29)])
def test_a_budget_leaving_less_than_one_2048_token_session_moves_to_1_5_gib(monkeypatch, pages, runs_at):
    monkeypatch.setattr(two_models, "pair_plan",
                        lambda budget, files: plan(budget, pages if budget == 1 << 30 else 734))
    ran, note, requested = choose_budget(1 << 30, {})
    assert ran["budget_bytes"] == runs_at
    if runs_at == 1 << 30:
        assert (note, requested) == (None, None)
    else:
        assert requested["num_pages"] == 127
        assert note == ("at 1 GiB the two models' weights, scratch and staging (1,032,632,864 B) leave "
                        "99,876,864 B of KV: 127 pages of 16 synthetic-1.5b tokens = 2,032 tokens, fewer than one "
                        "2,048-token session; ran at 1.5 GiB instead")
