"""pagedkv/evaluate.py: lanes stacked into one forward score exactly what each lane scores alone."""
import numpy as np
import pytest

from model_fixtures import tiny_dir, tiny_model, tiny_weights  # noqa: F401
from pagedkv.model_runner import ForwardBatch
from pagedkv.backends.numpy_ref import PagedKVCache
from pagedkv.evaluate import Lane, log_softmax_at, run_lanes, stack_batches
from pagedkv.kv.retention import KVRetention

BS = 16
POLICIES = {  # name -> (retention, pool blocks, chunk)
    "full": (None, 11, 64),
    "window_32": (KVRetention(window_tokens=32, sink_tokens=0), 3, 64),
    "window_32_sinks": (KVRetention(window_tokens=32, sink_tokens=4), 4, 64),
    "window_32_sinks_original": (KVRetention(window_tokens=32, sink_tokens=4, positions="original"), 4, 64),
    "h2o": (KVRetention(evict=True, sink_tokens=4, recent_tokens=32), 6, BS),
}


def texts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 512, 160).tolist(), rng.integers(0, 512, 150).tolist()]  # tiny vocab: 512


def make_lanes() -> list[Lane]:
    return [Lane(f"{name}/{k}", text, r, pool, chunk, BS)
            for name, (r, pool, chunk) in POLICIES.items() for k, text in enumerate(texts())]


def test_stacked_lanes_match_each_lane_alone(tiny_weights):  # noqa: F811
    stacked = make_lanes()
    run_lanes(tiny_weights, stacked, BS)
    for lane in stacked:
        alone = Lane(lane.name, lane.tokens, lane.req.retention, lane.pool_blocks, lane.chunk, BS)
        run_lanes(tiny_weights, [alone], BS)
        assert alone.greedy.tolist() == lane.greedy.tolist(), lane.name
        np.testing.assert_allclose(lane.logp, alone.logp, atol=1e-4, err_msg=lane.name)
        assert (lane.steps, lane.max_blocks_held, lane.num_evicted_blocks, lane.shifted_blocks) == \
               (alone.steps, alone.max_blocks_held, alone.num_evicted_blocks, alone.shifted_blocks), lane.name


def test_lanes_hold_their_policy_bound_and_full_attention_matches_one_forward(tiny_weights, tiny_model):  # noqa: F811
    lanes = {lane.name: lane for lane in make_lanes()}
    run_lanes(tiny_weights, list(lanes.values()), BS, max_rows=96)  # 96 rows: lanes wait their turn
    for k, text in enumerate(texts()):
        blocks = -(-len(text) // BS)
        assert lanes[f"full/{k}"].max_blocks_held == blocks
        assert lanes[f"window_32/{k}"].max_blocks_held == 3  # W / 16 + 1
        assert lanes[f"window_32_sinks/{k}"].max_blocks_held == 4  # sink block + W / 16 + 1
        assert lanes[f"h2o/{k}"].max_blocks_held == 6  # the whole pool, never more
        assert lanes[f"h2o/{k}"].num_evicted_blocks == blocks - 6  # each block past the 6 in the pool: one eviction
        assert lanes[f"window_32_sinks_original/{k}"].shifted_blocks == 0
        assert lanes[f"window_32_sinks/{k}"].shifted_blocks > 0
        # Full attention: the same scores as one prefill of the whole text on an identity block table.
        n = len(text)
        kv = PagedKVCache.allocate(tiny_model.config, blocks, BS)
        i32 = np.arange(n, dtype=np.int32)
        batch = ForwardBatch(np.asarray(text, np.int32), i32, i32, np.asarray([0, n], np.int32),
                             np.arange(blocks, dtype=np.int32)[None], np.asarray([n], np.int32))
        logits = tiny_model.forward(batch, kv, all_logits=True)  # (n, vocab)
        np.testing.assert_allclose(lanes[f"full/{k}"].logp, log_softmax_at(logits[:-1], np.asarray(text[1:])),
                                   atol=1e-4)
        assert lanes[f"full/{k}"].greedy.tolist() == logits[:-1].argmax(axis=1).tolist()


def test_stack_batches_offsets_slots_and_block_tables():
    def one(table, slots, ctx):
        n = len(slots)
        return ForwardBatch(np.arange(n, dtype=np.int32), np.arange(ctx - n, ctx, dtype=np.int32),
                            np.asarray(slots, np.int32), np.asarray([0, n], np.int32),
                            np.asarray([table], np.int32), np.asarray([ctx], np.int32))

    a = one([1, 0], [1, 2], 19)  # cache indices 17, 18 live in the lane's block 0
    b = one([2], [2 * BS + 5], 6)
    batch = stack_batches([a, b], [0, 3], BS)  # lane b's blocks start at pool block 3
    assert batch.slot_mapping.tolist() == [1, 2, 5 * BS + 5]
    assert batch.block_tables.tolist() == [[1, 0], [5, 0]]
    assert batch.query_start_loc.tolist() == [0, 2, 3]
    assert batch.context_lens.tolist() == [19, 6]


def test_a_lane_needs_two_tokens_and_a_pool_its_policy_fits(tiny_weights):  # noqa: F811
    with pytest.raises(ValueError, match="at least 2 tokens"):
        Lane("short", [5], None, 4, 64, BS)
    with pytest.raises(Exception, match="KV pool only has 2 blocks"):
        Lane("small", texts()[0], KVRetention(window_tokens=32, sink_tokens=4), 2, 64, BS)

