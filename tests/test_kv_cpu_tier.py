"""The CPU tier of the prefix cache: GPU eviction demotes to the CPU pool, a GPU miss promotes from it (exact
block ids, LRU order, dedup across tiers), and an engine over it replies exactly as one without it."""
from __future__ import annotations

import random

import pytest

from kv_invariants import KVWorld, random_tokens
from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.config import CacheConfig
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kv.manager import CopyOp, KVCacheManager
from pagedkv.kv.prefix import chain_digests
from pagedkv.sampling import SamplingParams
from pagedkv.sequence import Sequence, SequenceStatus
from pagedkv.tokenizer import Tokenizer

A = list(range(17))  # two full blocks of 8 and one token


def make(num_blocks=4, num_cpu_blocks=4):
    kv = KVCacheManager(CacheConfig(num_blocks=num_blocks, block_size=8, num_cpu_blocks=num_cpu_blocks,
                                    demote_to_cpu=True), namespace="m")
    return kv, kv.cpu


def run(kv, tokens):
    seq = Sequence(tokens)
    kv.allocate_slots(seq, len(tokens))
    kv.mark_computed(seq, seq.num_kv_tokens - seq.num_computed_tokens)
    return seq


def test_chain_digest_covers_the_prefix_and_namespace():
    d = chain_digests(A, 2, 8, "m")
    assert len(d) == 2 and len(d[0]) == 16
    assert chain_digests(A[:8] + [99] * 8, 2, 8, "m")[0] == d[0]
    assert chain_digests([99] + A[1:16], 2, 8, "m")[1] != d[1]  # same block, other prefix
    assert chain_digests(A, 2, 8, "other")[0] != d[0]


def test_evicted_gpu_blocks_go_to_cpu_and_come_back_on_a_gpu_miss():
    kv, tier = make()
    kv.free(run(kv, A))  # GPU: 0, 1 cached; 2 (partial) free at the head
    assert kv.pool.free_queue_ids() == [2, 3, 1, 0]
    b = run(kv, list(range(100, 132)))  # 4 blocks: evicts 1 then 0 (the tail before its prefix)
    assert b.block_table == [2, 3, 1, 0]
    assert tier.take_demotions() == [CopyOp(1, 0), CopyOp(0, 1)]  # GPU 1 -> CPU 0, GPU 0 -> CPU 1
    assert (kv.cpu_pool.num_cached, kv.cpu_pool.free_queue_ids(), tier.num_demoted) == (2, [2, 3, 0, 1], 2)
    assert kv.lookup_prefix(A) == (0, [])
    kv.free(b)
    assert kv.pool.free_queue_ids() == [0, 1, 3, 2]
    # A's prefix misses the GPU: CPU 1 (block 0) and CPU 0 (block 1) are copied into GPU 0 and 1, whose B
    # blocks are demoted first (to CPU 2 and 3): the demotions run before the copies that overwrite them.
    assert kv.promote_from_cpu(A[:16]) == [CopyOp(1, 0), CopyOp(0, 1)]
    assert tier.take_demotions() == [CopyOp(0, 2), CopyOp(1, 3)]
    assert kv.lookup_prefix(A) == (16, [0, 1])
    assert kv.cpu_pool.free_queue_ids() == [2, 3, 0, 1]  # promoted: used now, block 0's at the recent end
    c = Sequence(A)
    kv.allocate_slots(c, 17)
    assert (c.block_table, c.num_computed_tokens) == ([0, 1, 3], 16)
    assert kv.num_hit_tokens == 16


def test_lru_order_in_the_cpu_pool_and_full_cpu_pool():
    kv, tier = make(num_blocks=2, num_cpu_blocks=2)
    # Each chat: 2 full blocks; the next one evicts it from the GPU to the CPU pool, whose least recently used
    # blocks (the chat before) make room.
    for base, moves in ((0, []), (100, [CopyOp(1, 0), CopyOp(0, 1)]), (200, [CopyOp(0, 0), CopyOp(1, 1)])):
        kv.free(run(kv, list(range(base, base + 16))))
        assert tier.take_demotions() == moves
        assert kv.cpu_pool.free_queue_ids() == [0, 1]
    assert kv.promote_from_cpu(list(range(16))) == []
    assert kv.promote_from_cpu(list(range(100, 116))) == [CopyOp(1, 1), CopyOp(0, 0)]
    assert tier.take_demotions() == []  # chat 200 leaves the GPU, but both CPU blocks are being read
    # No GPU block to give: a used pool promotes nothing.
    kv2, _ = make(num_blocks=2, num_cpu_blocks=2)
    kv2.free(run(kv2, list(range(16))))
    held = run(kv2, list(range(50, 66)))
    assert kv2.promote_from_cpu(list(range(16))) == [] and held.block_table == [1, 0]


def test_swapped_out_blocks_are_found_by_content_and_not_demoted_twice():
    kv, tier = make(num_blocks=4, num_cpu_blocks=4)
    a = run(kv, A)
    assert kv.swap_out(a) == [CopyOp(0, 0), CopyOp(1, 1), CopyOp(2, 2)]
    d = chain_digests(A, 2, 8, "m")
    assert [kv.cpu_pool.cached_block(x).block_id for x in d] == [0, 1]
    run(kv, list(range(100, 132)))  # evicts A's GPU blocks: the CPU pool holds them already
    assert tier.take_demotions() == [] and tier.num_demoted == 0
    kv.free(a)  # while swapped: its full blocks stay in the CPU pool as cached blocks
    assert (kv.cpu_pool.num_cached, kv.cpu_pool.free_queue_ids()) == (2, [2, 3, 1, 0])
    # A shared prefix is one block per tier: a second chat with A's first block swaps out a copy that stays
    # unaddressable, and promoting finds the first one.
    kv2, _ = make(num_blocks=6, num_cpu_blocks=6)
    x, y = run(kv2, A), run(kv2, A[:8] + list(range(50, 59)))
    kv2.swap_out(x)
    kv2.swap_out(y)
    assert kv2.cpu_pool.cached_block(d[0]).block_id == 0
    assert kv2.cpu_pool.block(3).block_hash is None and kv2.cpu_pool.block(4).block_hash is not None

    assert kv.cpu.forget(A, keep_tokens=8) == 1  # a deleted chat: its blocks past the shared 8 tokens go
    assert (kv.cpu_pool.num_cached, kv.cpu_pool.free_queue_ids()) == (1, [1, 2, 3, 0])
    assert kv2.cpu.forget(A) == 0 and kv2.cpu_pool.num_used == 6  # swapped chats hold theirs: they stay

def test_swap_in_holds_its_cpu_blocks_until_the_moves_are_taken():
    kv, tier = make(num_blocks=4, num_cpu_blocks=4)
    a = run(kv, A)
    kv.swap_out(a)
    kv.free(run(kv, list(range(100, 132))))  # A's GPU blocks evicted; CPU 0, 1 hold its prefix
    assert kv.pool.free_queue_ids() == [0, 1, 3, 2]
    assert kv.swap_in(a) == [CopyOp(0, 0), CopyOp(1, 1), CopyOp(2, 3)]
    # B's blocks 3, 2, 1 (GPU 0, 1, 3) each took CPU 3, the one CPU block not being read, evicting the one before:
    # only the last copy is left to run.
    assert tier.held_reads == [2, 1, 0] and kv.cpu_pool.num_available == 1
    assert tier.take_demotions() == [CopyOp(3, 3)]
    assert kv.cpu_pool.free_queue_ids() == [2, 3, 1, 0] and tier.held_reads == []
    assert a.status is SequenceStatus.RUNNING


def test_a_demoted_block_a_swap_out_takes_back_in_the_same_step_is_not_copied():
    kv, tier = make(num_blocks=3, num_cpu_blocks=2)
    kv.free(run(kv, A[:16]))
    r = run(kv, list(range(100, 109)))  # evicts A's second block (GPU 1): demoted to CPU 0, copy pending
    assert r.block_table == [2, 1] and kv.cpu_pool.free_queue_ids() == [1, 0]
    assert kv.swap_out(r) == [CopyOp(2, 1), CopyOp(1, 0)]  # a preemption in the same step takes CPU 0 back
    # Run after the swap-out, the pending copy would overwrite r's block: it is dropped.
    assert tier.take_demotions() == []
    assert kv.cpu_pool.cached_block(chain_digests(A, 2, 8, "m")[1]) is None

def test_a_block_whose_parent_left_the_gpu_keeps_its_digest_while_it_is_remembered():
    kv, tier = make(num_blocks=3, num_cpu_blocks=4)
    kv.free(run(kv, A))
    parent, child = kv.pool.block(0), kv.pool.block(1)
    d = chain_digests(A, 2, 8, "m")
    assert tier.gpu_digest(child) == d[1]
    kv.pool.touch([1])  # the child is held, the parent is evicted first
    run(kv, list(range(100, 116)))
    assert tier.take_demotions() == [CopyOp(0, 0)] and kv.pool.block(0).epoch != parent.epoch
    # The parent's link still names the digest it had: the child (computed after it) can still be demoted.
    assert tier.gpu_digest(child) == d[1]
    tier._gpu_digests.clear()  # forgotten: the walk up meets the parent's new epoch
    assert tier.gpu_digest(child) is None


class TieredWorld(KVWorld):
    """KVWorld with the CPU tier on: demotions are applied to the shadow right after each manager call (before
    the world writes or copies into the evicted blocks), every lookup promotes first, and the sequences' KV
    counts as computed."""

    def __init__(self) -> None:
        super().__init__(num_blocks=12, block_size=8, num_cpu_blocks=8, demote_to_cpu=True)
        self.tier = self.mgr.cpu

    def _after_call(self) -> None:
        moves = self.mgr.take_demotions()
        self._copy(moves, self.gpu, self.cpu)
        self.counts["demoted"] = self.counts.get("demoted", 0) + len(moves)

    def _write(self, seq, start):
        super()._write(seq, start)
        self.mgr.mark_computed(seq, seq.num_kv_tokens - seq.num_computed_tokens)

    def lookup(self, token_ids):
        ops = self.mgr.promote_from_cpu(token_ids)
        self._after_call()
        self._copy(ops, self.cpu, self.gpu)
        self.counts["promoted"] = self.counts.get("promoted", 0) + len(ops)
        super().lookup(token_ids)

    def check(self):
        assert self.tier.take_demotions() == []
        super().check()


@pytest.mark.parametrize("seed", range(3))
def test_random_workload_keeps_every_tier_consistent(seed):
    rng = random.Random(seed)
    world = TieredWorld()
    for _ in range(300):
        op = rng.random()
        live = [i for i, s in enumerate(world.seqs) if s.status is SequenceStatus.RUNNING]
        swapped = [i for i, s in enumerate(world.seqs) if s.status is SequenceStatus.SWAPPED]
        if not live or op < 0.25:
            world.new(random_tokens(rng))
        elif op < 0.45:
            world.append(rng.choice(live), [rng.randrange(64) for _ in range(rng.choice((1, 3, 5)))])
        elif op < 0.65:
            world.free(rng.choice(live + swapped))
        elif op < 0.8:
            world.lookup(random_tokens(rng, 20))
        elif op < 0.9:
            world.swap_out(rng.choice(live))
        elif swapped:
            world.swap_in(rng.choice(swapped))
        world.check()
    world.free_all_and_check_no_leak()
    assert world.counts["demoted"] > 0 and world.counts["promoted"] > 0 and world.counts["swap_in"] > 0


GREEDY = SamplingParams(max_tokens=12, stop_token_ids=(10_000,))  # a stop id the tiny vocab never emits


def test_engine_restores_a_demoted_prefix_from_the_cpu_pool(tiny_weights):
    tok = Tokenizer.from_manifest(tiny_weights.manifest)

    def engine(num_cpu_blocks):
        return LLMEngine(CpuBackend(tiny_weights, num_blocks=6, block_size=16, num_cpu_blocks=num_cpu_blocks),
                         tok, EngineConfig())

    def chat(e):
        out1 = run_sync(e.generate(list(range(3, 43)), GREEDY)).output_ids  # 52 tokens: 3 full blocks
        run_sync(e.generate(list(range(200, 260)), GREEDY))  # 72 tokens: evicts 2 of the first chat's
        return run_sync(e.generate(list(range(3, 43)) + out1 + list(range(100, 120)), GREEDY)).output_ids

    tiered, plain = engine(8), engine(0)
    assert chat(tiered) == chat(plain)
    s, p = tiered.stats(), plain.stats()
    # 2 of the first chat's 3 full blocks left for the second chat, then the second chat's 4 for the third; the
    # third finds block 0 on the GPU and blocks 1 and 2 in the CPU pool.
    assert (s["cpu_demoted_blocks"], s["cpu_restored_tokens"]) == (6, 32)
    assert p["prefill_tokens"] - s["prefill_tokens"] == 32
    assert (s["cpu_used_blocks"], s["cpu_cached_blocks"]) == (0, s["cpu_demoted_blocks"])


def test_many_chats_over_small_pools_reply_as_without_a_cpu_tier(tiny_weights):
    # Two rounds of 8 chats sharing a 32-token prefix over a 12-block GPU pool: swap preemptions, demotions
    # and promotions happen in the same steps; greedy replies must not change with the CPU tier.
    tok = Tokenizer.from_manifest(tiny_weights.manifest)
    rng = random.Random(5)
    system = list(range(3, 35))
    prompts = [system + [rng.randrange(3, 200) for _ in range(rng.randrange(5, 40))] for _ in range(8)]

    def replies(num_cpu_blocks):
        e = LLMEngine(CpuBackend(tiny_weights, num_blocks=12, block_size=16, num_cpu_blocks=num_cpu_blocks),
                      tok, EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, preemption="swap"))
        outs = []
        for turn in range(2):
            asks = [p + outs[i] + [7, 8, 9] if turn else p for i, p in enumerate(prompts)]
            ids = [e.add_request(a, GREEDY) for a in asks]
            reqs = [e.request(r) for r in ids]
            while e.has_unfinished:
                run_sync(e.step())
            outs = [r.output_ids for r in reqs]
        return outs, e.stats()

    (tiered, s), (plain, p) = replies(10), replies(0)
    assert tiered == plain
    assert p["cpu_demoted_blocks"] == p["cpu_restored_tokens"] == p["preemptions"]["swap"] == 0
    # 35 blocks demoted, 13 promoted back; the plain engine recomputes its 2 preempted chats instead of swapping.
    assert (s["cpu_demoted_blocks"], s["cpu_restored_tokens"], s["preemptions"]["swap"]) == (35, 208, 4)
    assert (s["prefill_tokens"], p["prefill_tokens"], p["preemptions"]["recompute"]) == (470, 506, 2)
