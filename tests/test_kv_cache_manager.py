"""Exact-value tests of the KV cache manager on a tiny pool (10 GPU blocks of 16, 4 CPU)."""

import hashlib

import pytest

from kv_invariants import snapshot
from pagedkv.kv.block_pool import OutOfBlocks
from pagedkv.config import CacheConfig
from pagedkv.kv.accounting import SharedKVBudget, kv_stats
from pagedkv.kv.spec import SMOLLM2_135M, KVSpec
from pagedkv.kv.manager import (CopyOp, DoubleFree, KVCacheManager, NeverFits,
                                      SequenceFreed, default_block_hash)
from pagedkv.sequence import Sequence, SequenceStatus


def make(num_blocks=10, cpu=4, **kw):
    return KVCacheManager(CacheConfig(num_blocks=num_blocks, block_size=16, num_cpu_blocks=cpu),
                          namespace="m", **kw)


def new_seq(mgr, tokens, session="default"):
    seq = Sequence(tokens, session=session)
    ops = mgr.allocate_slots(seq, len(tokens))
    assert ops == []
    return seq


def test_new_block_only_every_block_size_tokens():
    mgr = make()
    seq = new_seq(mgr, list(range(20)))
    assert seq.block_table == [0, 1] and seq.num_kv_tokens == 20
    for t in range(20, 32):
        assert mgr.append_tokens(seq, [t]) == []
    assert seq.block_table == [0, 1]
    mgr.append_tokens(seq, [32])
    assert seq.block_table == [0, 1, 2] and seq.num_kv_tokens == 33
    assert mgr.pool.free_queue_ids() == [3, 4, 5, 6, 7, 8, 9]


def test_prefix_hit_after_free_reuses_exact_blocks():
    mgr = make()
    a = new_seq(mgr, list(range(40)))
    assert a.block_table == [0, 1, 2]
    assert mgr.lookup_prefix(list(range(40))) == (32, [0, 1])
    assert mgr.lookup_prefix(list(range(20)) + [99] * 20) == (16, [0])
    assert mgr.lookup_prefix([7] + list(range(1, 40))) == (0, [])
    mgr.free(a)
    assert mgr.pool.free_queue_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    b = Sequence(list(range(40)))
    assert mgr.can_allocate(b, 40)
    mgr.allocate_slots(b, 40)
    assert b.block_table == [0, 1, 2] and b.num_computed_tokens == 32
    assert mgr.pool.free_queue_ids() == [3, 4, 5, 6, 7, 8, 9]
    assert mgr.prefix_hit_rate == 32 / 80


def test_full_prompt_hit_leaves_the_last_token_to_compute():
    mgr = make()
    mgr.free(new_seq(mgr, list(range(32))))     # blocks 0 and 1 cached
    b = new_seq(mgr, list(range(32)))
    # Only block 0 is shared: the model must still run the last token for its logits.
    assert b.block_table == [0, 2] and b.num_computed_tokens == 16


def test_hit_blocks_verify_their_parent_even_when_hashes_ignore_it():
    def parentless(parent, token_ids, ns):     # a deliberately broken chain hash
        return hashlib.sha256(repr(token_ids).encode()).digest()
    mgr = make(hash_fn=parentless)
    w, x, y = [100] * 16, [200] * 16, [300] * 16
    c = new_seq(mgr, w + y + [1])               # registers W at 0, Y (parent W) at 1
    a = new_seq(mgr, x + y + [1])               # X at 3; its Y collides with block 1
    assert (c.block_table, a.block_table) == ([0, 1, 2], [3, 4, 5])
    assert a.block_links[1] is None and mgr.pool.block(4).block_hash is None
    # Y's cached KV was computed after W, not X: it must not be handed out.
    assert mgr.lookup_prefix(x + y) == (16, [3])
    assert mgr.lookup_prefix(w + y) == (32, [0, 1])


def test_constant_hash_never_returns_other_tokens():
    mgr = make(hash_fn=lambda parent, token_ids, ns: b"same")
    new_seq(mgr, [1] * 16 + [2] * 16)
    assert mgr.lookup_prefix([1] * 16 + [2] * 16) == (16, [0])
    assert mgr.lookup_prefix([2] * 16) == (0, [])


def test_namespace_separates_prefix_hashes():
    t = tuple(range(16))
    assert default_block_hash(None, t, "model-a") != default_block_hash(None, t, "model-b")
    assert default_block_hash(None, t, "model-a") == default_block_hash(None, t, "model-a")


def test_fork_shares_and_copy_on_write_returns_exact_ops():
    mgr = make()
    a = new_seq(mgr, list(range(20)), session="alice")
    child = mgr.fork(a, session="bob")
    assert child.block_table == [0, 1] and child.seq_id != a.seq_id
    assert (mgr.pool.ref_count(0), mgr.pool.ref_count(1)) == (2, 2)
    assert mgr.append_tokens(child, [500]) == [CopyOp(src=1, dst=2)]
    assert child.block_table == [0, 2] and a.block_table == [0, 1]
    assert [mgr.pool.ref_count(i) for i in (0, 1, 2)] == [2, 1, 1]
    assert mgr.append_tokens(a, [600]) == []    # sole owner again: write in place
    s = kv_stats(mgr)
    assert (s.used_blocks, s.logical_tokens, s.physical_tokens) == (3, 42, 16 + 5 + 5)
    assert s.per_session_blocks == {"alice": 2, "bob": 2}


def test_fork_at_block_boundary_needs_no_copy():
    mgr = make()
    a = new_seq(mgr, list(range(32)))
    child = mgr.fork(a)
    assert mgr.append_tokens(child, [1]) == []
    assert child.block_table == [0, 1, 2]


def test_stats_sharing_and_slot_efficiency():
    mgr = make()
    a = new_seq(mgr, list(range(20)))
    mgr.fork(a)
    s = kv_stats(mgr)
    assert (s.total_blocks, s.used_blocks, s.free_blocks, s.cached_blocks) == (10, 2, 8, 0)
    assert (s.utilization, s.slot_efficiency, s.sharing_factor) == (0.2, 20 / 32, 2.0)
    mgr.free(a)
    s = kv_stats(mgr)
    assert (s.used_blocks, s.cached_blocks, s.sharing_factor) == (2, 0, 1.0)


def test_truncate_frees_tail_and_copies_a_cached_block_before_overwriting():
    mgr = make()
    a = new_seq(mgr, list(range(40)))
    mgr.truncate(a, 20)
    assert a.block_table == [0, 1] and a.num_kv_tokens == 20 and a.token_ids == list(range(20))
    assert mgr.pool.free_queue_ids() == [2, 3, 4, 5, 6, 7, 8, 9]
    # Block 1 is registered (tokens 16..31): writing token 20 in place would corrupt the cache.
    assert mgr.append_tokens(a, [999]) == [CopyOp(src=1, dst=2)]
    assert a.block_table == [0, 2]
    assert mgr.pool.free_queue_ids() == [3, 4, 5, 6, 7, 8, 9, 1]
    assert mgr.lookup_prefix(list(range(32))) == (32, [0, 1])


def test_swap_out_and_in_plans():
    mgr = make()
    a = new_seq(mgr, list(range(40)))
    assert mgr.swap_out(a) == [CopyOp(0, 0), CopyOp(1, 1), CopyOp(2, 2)]
    assert a.status is SequenceStatus.SWAPPED and a.block_table == [0, 1, 2]
    assert mgr.pool.free_queue_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    assert mgr.cpu_pool.free_queue_ids() == [3]
    # Blocks 0 and 1 are still in the GPU prefix cache: only CPU block 2 is copied back.
    assert mgr.swap_in(a) == [CopyOp(2, 2)]
    assert a.block_table == [0, 1, 2] and a.status is SequenceStatus.RUNNING
    assert mgr.cpu_pool.free_queue_ids() == [0, 1, 2, 3]  # unhashed: back at the head


def test_swap_in_after_eviction_copies_everything_and_waits_for_room():
    mgr = make()
    a = new_seq(mgr, list(range(40)))
    mgr.swap_out(a)
    b = new_seq(mgr, [7] * 150)                 # takes all 10 GPU blocks, evicting 0 and 1
    assert b.block_table == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    before = snapshot(mgr, [a, b])
    with pytest.raises(OutOfBlocks, match="needs 3 GPU blocks, 0 free"):
        mgr.swap_in(a)
    assert snapshot(mgr, [a, b]) == before
    mgr.free(b)                                 # 0 (partial) to the head, the rest cached
    assert mgr.pool.free_queue_ids() == [0, 1, 9, 8, 7, 6, 5, 4, 3, 2]
    assert mgr.swap_in(a) == [CopyOp(0, 0), CopyOp(1, 1), CopyOp(2, 9)]


def test_out_of_blocks_and_never_fits_leave_state_unchanged():
    mgr = make()
    a = new_seq(mgr, list(range(150)))
    b = Sequence([1])
    assert not mgr.can_allocate(b, 1)
    before = snapshot(mgr, [a, b])
    with pytest.raises(OutOfBlocks, match="needs 1 blocks, 0 free or cached"):
        mgr.allocate_slots(b, 1)
    assert snapshot(mgr, [a, b]) == before
    c = Sequence(list(range(161)))
    assert not mgr.can_allocate(c, 161)
    with pytest.raises(NeverFits, match="needs 11 blocks .* pool only has 10"):
        mgr.allocate_slots(c, 161)
    with pytest.raises(NeverFits):
        mgr.append_tokens(a, list(range(11)))
    assert a.token_ids == list(range(150))      # appended ids rolled back
    assert snapshot(mgr, [a, b]) == before


def test_freed_sequence_rejects_everything_state_unchanged():
    mgr = make()
    a = new_seq(mgr, list(range(20)))
    mgr.free(a)
    assert a.status is SequenceStatus.FINISHED
    before = snapshot(mgr, [a])
    with pytest.raises(DoubleFree, match="already freed"):
        mgr.free(a)
    with pytest.raises(SequenceFreed, match="cannot append to sequence .* it was freed"):
        mgr.append_tokens(a, [1])
    with pytest.raises(SequenceFreed):
        mgr.fork(a)
    with pytest.raises(SequenceFreed):
        mgr.swap_out(a)
    assert snapshot(mgr, [a]) == before


@pytest.mark.parametrize("call, msg", [
    (lambda m, s: m.allocate_slots(s, -1), "non-negative int"),
    (lambda m, s: m.allocate_slots(s, 25), "append the token ids"),
    (lambda m, s: m.truncate(s, 21), r"num_tokens must be in \[0, 20\]"),
    (lambda m, s: m.truncate(s, -1), r"num_tokens must be in \[0, 20\]"),
    (lambda m, s: m.append_tokens(s, [-5]), "non-negative ints"),
    (lambda m, s: m.swap_in(s), "needs swapped"),
])
def test_bad_input_is_rejected_with_state_unchanged(call, msg):
    mgr = make()
    s = new_seq(mgr, list(range(20)))
    before = snapshot(mgr, [s])
    with pytest.raises(ValueError, match=msg):
        call(mgr, s)
    assert snapshot(mgr, [s]) == before


def test_swap_needs_a_cpu_pool():
    mgr = make(cpu=0)
    s = new_seq(mgr, [1, 2, 3])
    with pytest.raises(ValueError, match="num_cpu_blocks > 0"):
        mgr.swap_out(s)
    for bad in ([1, -2], [1, True], [1, 2.0], ["a"]):
        with pytest.raises(ValueError, match="non-negative ints, got"):
            Sequence(bad)


def test_bytes_per_token():
    assert SMOLLM2_135M.bytes_per_token == 23040
    assert SMOLLM2_135M.with_(dtype="f32").bytes_per_token == 46080
    assert SMOLLM2_135M.with_(dtype="f32").bytes_per_block == 16 * 46080
    assert KVSpec(28, 2, 128, dtype="bf16").bytes_per_token == 28672
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        SMOLLM2_135M.with_(dtype="f8")
    with pytest.raises(ValueError, match="head_dim must be a positive int"):
        KVSpec(2, 2, 0)


SMOL = "SmolLM2-135M-Instruct"
PAGE = 16 * 46080   # 737,280 B: 16 SmolLM2 f32 tokens or 32 f16 tokens


def test_two_models_share_one_byte_budget_and_evict_each_other():
    budget = SharedKVBudget(10 * PAGE + 5, PAGE)
    f16 = budget.add_model(SMOL, SMOLLM2_135M)
    f32 = budget.add_model(SMOL, SMOLLM2_135M.with_(dtype="f32"))
    assert (budget.pool.num_blocks, f16.block_size, f32.block_size) == (10, 32, 16)
    a = new_seq(f16, list(range(40)), session="alice")     # 2 pages of 32 tokens
    b = new_seq(f32, list(range(20)), session="bob")       # 2 pages of 16 tokens
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    assert budget.used_bytes() == {f"{SMOL}/f16": 2 * PAGE,
                                   f"{SMOL}/f32": 2 * PAGE}
    assert budget.session_bytes() == {"alice": 2 * PAGE, "bob": 2 * PAGE}
    # Same tokens, other model: the namespace keeps its KV apart.
    assert f32.lookup_prefix(list(range(40))) == (16, [2])
    assert f16.lookup_prefix(list(range(40))) == (32, [0])
    f16.free(a)                                             # page 0 cached, page 1 free
    assert budget.pool.free_queue_ids() == [1, 4, 5, 6, 7, 8, 9, 0]
    c = new_seq(f32, list(range(100, 220)), session="carol")  # 8 pages: evicts f16's page 0
    assert c.block_table == [1, 4, 5, 6, 7, 8, 9, 0]
    assert f16.lookup_prefix(list(range(40))) == (0, [])
    assert budget.used_bytes()[f"{SMOL}/f32"] == 10 * PAGE
    with pytest.raises(OutOfBlocks):
        f16.allocate_slots(Sequence([1]), 1)


def test_shared_budget_rejects_pages_that_do_not_fit_a_model():
    with pytest.raises(ValueError, match="holds no page"):
        SharedKVBudget(100, PAGE)
    budget = SharedKVBudget(10 * PAGE, PAGE)
    odd = budget.add_model("odd", KVSpec(3, 1, 7))   # 84 B/token: 8,777 tokens a page, 64 a block
    assert odd.block_size == 64 and budget.page_fill()["odd/f16"] == pytest.approx(64 * 84 / PAGE)
    with pytest.raises(ValueError, match=r"holds 4 .* tokens .* at least 8"):
        budget.add_model("wide", KVSpec(30, 12, 64, dtype="f32"))   # 184,320 B/token
    budget.add_model(SMOL, SMOLLM2_135M)
    with pytest.raises(ValueError, match="needs a non-empty name"):
        budget.add_model("", SMOLLM2_135M)
    with pytest.raises(ValueError, match="already has a manager"):
        budget.add_model(SMOL, SMOLLM2_135M)
    with pytest.raises(ValueError, match="shared pool has 10 blocks"):
        KVCacheManager(CacheConfig(num_blocks=9), pool=budget.pool)


def test_evict_prefix_frees_cached_blocks_keeps_held_and_kept_ones():
    mgr = KVCacheManager(CacheConfig(num_blocks=10, block_size=16))
    tokens = list(range(100, 148))  # 3 full blocks
    seq = Sequence(tokens)
    mgr.allocate_slots(seq, 48)
    other = Sequence(tokens[:16] + [7] * 16)
    mgr.allocate_slots(other, 32)  # shares block 0 through the prefix cache and holds it
    mgr.free(seq)
    assert mgr.pool.num_cached == 2  # blocks 1 and 2; block 0 is still held by `other`
    assert mgr.evict_prefix(tokens, keep_tokens=0) == 2
    # Evicted blocks go to the head of the free ring (reused first): 1 then 2 pushed -> 2, 1.
    assert mgr.pool.num_cached == 0 and mgr.pool.free_queue_ids()[:2] == [2, 1]
    assert mgr.lookup_prefix(tokens)[0] == 16  # block 0 (held by `other`) still answers
    mgr.free(other)
    assert mgr.evict_prefix(tokens, keep_tokens=16) == 0  # keep_tokens protects the first block
    assert mgr.lookup_prefix(tokens)[0] == 16


def test_shared_page_fits_the_widest_model_and_pads_the_other():
    smol, wide = SMOLLM2_135M, KVSpec(24, 8, 64)            # f16: 23,040 and 49,152 B/token
    page = SharedKVBudget.page_bytes_for([smol.bytes_per_token, wide.bytes_per_token])
    assert page == 16 * 49152
    budget = SharedKVBudget(100 * page, page)
    a, b = budget.add_model(SMOL, smol), budget.add_model("wide", wide)
    assert (a.block_size, b.block_size) == (32, 16)         # 34.1 SmolLM2 tokens a page: a block of 32
    assert budget.page_fill() == {f"{SMOL}/f16": pytest.approx(32 * 23040 / page), "wide/f16": 1.0}
    assert SharedKVBudget.page_bytes_for([100, 60], block_size=16, align=768) == 2304
