"""Invariant checker and seeded random workload for the paged KV cache.

Pure Python (only `random` + pagedkv): the hypothesis state machine, a plain
pytest test and the in-browser Pyodide test all drive the same KVWorld.

KVWorld keeps a shadow of what the backend would hold in every GPU and CPU
block: it writes each sequence's token ids into its slots and executes every
copy-on-write and swap plan the manager returns. So the checks below catch a
wrong plan (a sibling's write leaking through a shared block, a swap copying
the wrong block), not just inconsistent counters.

With KV groups (KVWorld(groups=...)) every group's table is shadowed: its blocks hold the tokens of their
positions, a window group's entries are the null block only where no later query looks, the null block is
held once (reserved) in each pool, a table's null entries are a leading run before the window of its next
query, and each grow is computed at once (mark_computed), so windows advance.
"""

from __future__ import annotations

import random

from pagedkv.kv.block_pool import OutOfBlocks
from pagedkv.config import CacheConfig
from pagedkv.kv.groups import first_needed_block
from pagedkv.kv.manager import KVCacheManager, NeverFits, SequenceFreed
from pagedkv.sequence import Sequence, SequenceStatus


class InvariantError(AssertionError):
    pass


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise InvariantError(msg)


def snapshot(mgr: KVCacheManager, seqs) -> tuple:
    """Everything a rejected call must leave untouched."""
    def pool_state(pool):
        if pool is None:
            return None
        return (tuple(pool.free_queue_ids()), tuple(b.ref_count for b in pool.block_states()),
                tuple((b.block_hash, b.epoch) for b in pool.block_states()), pool.num_cached)
    return (pool_state(mgr.pool), pool_state(mgr.cpu_pool),
            tuple((s.seq_id, tuple(s.token_ids), s.num_kv_tokens, s.num_computed_tokens,
                   tuple(map(tuple, s.block_tables)), tuple(map(tuple, s.group_hashes)),
                   tuple(map(tuple, s.group_links)), s.status)
                  for s in seqs), tuple(sorted(mgr.live)))


def check_pool(pool, owners: dict[int, int], block_size: int) -> None:
    """One pool: each block in exactly one state, queue consistent, refs == owners."""
    queue = pool.free_queue_ids()
    _require(len(queue) == len(set(queue)), f"free queue repeats a block: {queue}")
    in_queue = set(queue)
    counts = {"used": 0, "free": 0, "cached": 0}
    for b in pool.block_states():
        state = pool.state_of(b.block_id)
        counts[state] += 1
        _require((state == "used") == (b.block_id not in in_queue),
                 f"block {b.block_id} is {state} but in_queue={b.block_id in in_queue}")
        _require(b.ref_count == owners.get(b.block_id, 0),
                 f"block {b.block_id} ref {b.ref_count} != owners {owners.get(b.block_id, 0)}")
        if b.block_hash is not None:
            _require(pool.cached_block(b.block_hash) == b, f"hash map misses block {b.block_id}")
            _require(len(b.token_ids) == block_size, "registered block not full")
    _require(counts["used"] == pool.num_used and counts["free"] == pool.num_free
             and counts["cached"] == pool.num_cached, f"counters drifted: {counts}")
    _require(pool.num_used + pool.num_free + pool.num_cached == pool.num_blocks,
             "free + used + cached != total")
    _require(len(pool._hash_to_block) == sum(b.block_hash is not None for b in pool.block_states()),
             "hash map holds a block that is not registered")


class KVWorld:
    """A manager, its sequences and a shadow of the block contents."""

    def __init__(self, num_blocks: int = 24, block_size: int = 8, num_cpu_blocks: int = 12,
                 hash_fn=None, demote_to_cpu: bool = False, groups=None) -> None:
        cfg = CacheConfig(num_blocks=num_blocks, block_size=block_size,
                          num_cpu_blocks=num_cpu_blocks, demote_to_cpu=demote_to_cpu)
        kw = {"hash_fn": hash_fn} if hash_fn is not None else {}
        self.mgr = KVCacheManager(cfg, namespace="test-model", groups=groups, **kw)
        self.computes = groups is not None  # windows advance only as tokens are computed
        self.bs = block_size
        self.gpu = [[None] * block_size for _ in range(num_blocks)]
        self.cpu = [[None] * block_size for _ in range(num_cpu_blocks)]
        self.seqs: list[Sequence] = []
        self.counts = {"new": 0, "append": 0, "fork": 0, "free": 0, "lookup": 0, "hit_blocks": 0,
                       "swap_out": 0, "swap_in": 0, "truncate": 0, "cow_copies": 0,
                       "out_of_blocks": 0, "never_fits": 0, "rejected_bad_input": 0, "checks": 0}

    # -- shadow backend -----------------------------------------------------
    def _write(self, seq: Sequence, start: int) -> None:
        for table in seq.block_tables:
            for pos in range(start, seq.num_kv_tokens):
                if table[pos // self.bs] != self.mgr.null_block:
                    self.gpu[table[pos // self.bs]][pos % self.bs] = seq.token_ids[pos]

    def _copy(self, ops, src_mem, dst_mem) -> None:
        for src, dst in ops:
            dst_mem[dst] = list(src_mem[src])

    def _after_call(self) -> None:
        """Run right after each manager call that may allocate, before the world copies or writes into the
        blocks it returned (a CPU tier's demotions copy the evicted blocks out here)."""

    def _grow(self, seq: Sequence, call) -> bool:
        old_kv = seq.num_kv_tokens
        try:
            ops = call()
            self._after_call()
        except OutOfBlocks:
            self.counts["out_of_blocks"] += 1
            return False
        except NeverFits:
            self.counts["never_fits"] += 1
            return False
        self.counts["cow_copies"] += len(ops)
        self._copy(ops, self.gpu, self.gpu)
        self._write(seq, old_kv if old_kv else seq.num_computed_tokens)
        if self.computes:
            self.mgr.mark_computed(seq, seq.num_kv_tokens - seq.num_computed_tokens)
        return True

    def _guarded(self, call) -> None:
        """A rejected call must leave every piece of state unchanged."""
        before = snapshot(self.mgr, self.seqs)
        try:
            call()
        except (OutOfBlocks, ValueError):
            _require(snapshot(self.mgr, self.seqs) == before, "rejected call changed state")
            raise

    # -- operations -----------------------------------------------------------
    def new(self, token_ids: list[int]) -> None:
        seq = Sequence(token_ids, session=f"s{len(self.seqs) % 3}")
        self.seqs.append(seq)
        self.counts["new"] += 1
        self._guard_grow(seq, lambda: self.mgr.allocate_slots(seq, seq.num_tokens))

    def _guard_grow(self, seq, call) -> None:
        before = snapshot(self.mgr, self.seqs)
        ok = self._grow(seq, call)
        if not ok:
            _require(snapshot(self.mgr, self.seqs) == before, "failed allocation changed state")

    def append(self, i: int, token_ids: list[int]) -> None:
        seq = self.seqs[i % len(self.seqs)]
        if seq.status in (SequenceStatus.FINISHED, SequenceStatus.SWAPPED):
            self._expect_reject(lambda: self.mgr.append_tokens(seq, token_ids))
            return
        self.counts["append"] += 1
        if seq.num_kv_tokens < seq.num_tokens:  # its prompt did not fit earlier: retry it
            self._guard_grow(seq, lambda: self.mgr.allocate_slots(
                seq, seq.num_tokens - seq.num_kv_tokens))
        else:
            self._guard_grow(seq, lambda: self.mgr.append_tokens(seq, token_ids))

    def fork(self, i: int) -> None:
        seq = self.seqs[i % len(self.seqs)]
        if seq.status in (SequenceStatus.FINISHED, SequenceStatus.SWAPPED):
            self._expect_reject(lambda: self.mgr.fork(seq))
            return
        self.seqs.append(self.mgr.fork(seq))
        self.counts["fork"] += 1

    def free(self, i: int) -> None:
        seq = self.seqs[i % len(self.seqs)]
        if seq.status is SequenceStatus.FINISHED:
            self._expect_reject(lambda: self.mgr.free(seq))
            return
        self.mgr.free(seq)
        self.counts["free"] += 1

    def truncate(self, i: int, frac: float) -> None:
        seq = self.seqs[i % len(self.seqs)]
        n = int(seq.num_tokens * frac)
        if seq.status in (SequenceStatus.FINISHED, SequenceStatus.SWAPPED):
            self._expect_reject(lambda: self.mgr.truncate(seq, n))
            return
        try:
            self._guarded(lambda: self.mgr.truncate(seq, n))
        except ValueError:  # a window group released what the shorter sequence would read again
            _require(self.mgr.is_hybrid, "truncate refused a one-group sequence")
            self.counts["rejected_bad_input"] += 1
            return
        self.counts["truncate"] += 1

    def swap_out(self, i: int) -> None:
        seq = self.seqs[i % len(self.seqs)]
        if seq.status is not SequenceStatus.RUNNING:
            self._expect_reject(lambda: self.mgr.swap_out(seq))
            return
        try:
            self._guarded(lambda: self._do_swap(seq, self.mgr.swap_out, self.gpu, self.cpu))
            self.counts["swap_out"] += 1
        except (OutOfBlocks, NeverFits):
            self.counts["out_of_blocks"] += 1

    def swap_in(self, i: int) -> None:
        seq = self.seqs[i % len(self.seqs)]
        if seq.status is not SequenceStatus.SWAPPED:
            self._expect_reject(lambda: self.mgr.swap_in(seq))
            return
        try:
            self._guarded(lambda: self._do_swap(seq, self.mgr.swap_in, self.cpu, self.gpu))
            self.counts["swap_in"] += 1
        except OutOfBlocks:
            self.counts["out_of_blocks"] += 1

    def _do_swap(self, seq, call, src_mem, dst_mem) -> None:
        ops = call(seq)
        self._after_call()
        self._copy(ops, src_mem, dst_mem)

    def lookup(self, token_ids: list[int]) -> None:
        n, ids = self.mgr.lookup_prefix(token_ids)
        self.counts["lookup"] += 1
        self.counts["hit_blocks"] += len(ids)
        _require(n == len(ids) * self.bs, "hit length is not whole blocks")
        for k, bid in enumerate(ids):
            want = list(token_ids[k * self.bs:(k + 1) * self.bs])
            _require(list(self.mgr.pool.block(bid).token_ids) == want,
                     f"prefix hit block {bid} stores other token ids")
            _require(self.gpu[bid] == want, f"prefix hit block {bid} holds other KV")

    def _expect_reject(self, call) -> None:
        try:
            self._guarded(call)
        except ValueError:
            self.counts["rejected_bad_input"] += 1
            return
        raise InvariantError("call on a freed/swapped sequence was accepted")

    # -- checks ---------------------------------------------------------------
    def check(self) -> None:
        """All invariants; raises InvariantError with the first violation."""
        self.counts["checks"] += 1
        null = self.mgr.null_block
        gpu_owners: dict[int, int] = {} if null is None else {null: 1}  # the null block: reserved, never a seq's
        cpu_owners: dict[int, int] = {} if null is None or self.mgr.cpu_pool is None else {null: 1}
        bs = self.bs
        for seq in self.seqs:
            if seq.status is SequenceStatus.FINISHED:
                _require(not any(seq.block_tables), f"freed sequence {seq.seq_id} still has blocks")
                continue
            _require(seq.num_computed_tokens <= seq.num_kv_tokens <= seq.num_tokens,
                     f"sequence {seq.seq_id} counters out of order")
            owners, mem = ((cpu_owners, self.cpu) if seq.status is SequenceStatus.SWAPPED
                           else (gpu_owners, self.gpu))
            if seq.block_table:
                _require(len(seq.block_tables) == self.mgr.num_groups, f"sequence {seq.seq_id}: one table a group")
            for window, table in zip(self.mgr.windows, seq.block_tables):
                _require(len(table) == -(-seq.num_kv_tokens // bs),
                         f"sequence {seq.seq_id}: {len(table)} blocks for {seq.num_kv_tokens} tokens")
                first = first_needed_block(window, seq.num_computed_tokens, bs)
                # Released lazily (at the next allocation): the nulls are a leading run, before `first`.
                nulls = sum(1 for b in table if b == null)
                _require(nulls <= first and all(b == null for b in table[:nulls]),
                         f"sequence {seq.seq_id}: null entries in {table} where the window still looks")
                for bid in table[nulls:]:
                    owners[bid] = owners.get(bid, 0) + 1
                for pos in range(nulls * bs, seq.num_kv_tokens):
                    _require(mem[table[pos // bs]][pos % bs] == seq.token_ids[pos],
                             f"sequence {seq.seq_id} slot {pos} holds another token")
        check_pool(self.mgr.pool, gpu_owners, bs)
        if self.mgr.cpu_pool is not None:
            check_pool(self.mgr.cpu_pool, cpu_owners, bs)
        for b in self.mgr.pool.block_states():
            if b.block_hash is not None:
                _require(list(b.token_ids) == self.gpu[b.block_id],
                         f"registered block {b.block_id} content differs from its tokens")
        for b in (self.mgr.cpu_pool.block_states() if self.mgr.cpu_pool is not None else []):
            if b.block_hash is not None:  # the CPU tier serves these as prefix hits (kv_cpu_tier)
                _require(list(b.token_ids) == self.cpu[b.block_id],
                         f"registered CPU block {b.block_id} content differs from its tokens")

    def free_all_and_check_no_leak(self) -> None:
        for seq in self.seqs:
            if seq.status is not SequenceStatus.FINISHED:
                self.mgr.free(seq)
        self.check()
        pool = self.mgr.pool
        _require(pool.num_used == pool.num_reserved and pool.num_free + pool.num_cached == pool.capacity,
                 "GPU blocks leaked after freeing every sequence")
        if self.mgr.cpu_pool is not None:
            _require(self.mgr.cpu_pool.num_used == self.mgr.cpu_pool.num_reserved,
                     "CPU blocks leaked after freeing every sequence")
        _require(not self.mgr.live, "manager still tracks live sequences")


PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18],
            [1, 2, 3, 4, 5, 6, 7, 8, 40, 41, 42, 43, 44, 45, 46, 47],
            [90, 91, 92, 93, 94, 95, 96, 97, 98]]


def random_tokens(rng: random.Random, max_len: int = 40) -> list[int]:
    """A prompt that often starts with a shared prefix, so prefix hits happen."""
    head = list(rng.choice(PREFIXES)) if rng.random() < 0.7 else []
    return head + [rng.randrange(0, 64) for _ in range(rng.randrange(0, max_len))]


def _pick(rng: random.Random, world: KVWorld, *statuses: SequenceStatus) -> int:
    """Mostly a sequence in one of `statuses`; sometimes any (to exercise rejections)."""
    good = [i for i, s in enumerate(world.seqs) if s.status in statuses]
    if good and rng.random() < 0.9:
        return rng.choice(good)
    return rng.randrange(len(world.seqs))


def run_random_workload(seed: int, num_steps: int, groups=None) -> dict:
    """Seeded random interleaving of every operation, checking all invariants after
    each step and that freeing everything leaks nothing. Returns operation counts.
    groups: KV groups (pagedkv.kv.groups.KVGroups) for the manager, e.g. a full group and a window group."""
    rng = random.Random(seed)
    world = KVWorld(groups=groups)
    live = (SequenceStatus.RUNNING, SequenceStatus.WAITING)
    for _ in range(num_steps):
        op = rng.random()
        if not world.seqs or op < 0.17:
            if rng.random() < 0.03:  # longer than the whole pool
                world.new([rng.randrange(0, 64) for _ in range(world.bs * 24 + 1)])
            else:
                world.new(random_tokens(rng))
        elif op < 0.42:
            world.append(_pick(rng, world, *live),
                         [rng.randrange(0, 64) for _ in range(rng.choice((1, 1, 1, 3, 9)))])
        elif op < 0.50:
            world.fork(_pick(rng, world, *live))
        elif op < 0.65:
            world.free(_pick(rng, world, *live, SequenceStatus.SWAPPED))
        elif op < 0.75:
            world.lookup(random_tokens(rng, 30))
        elif op < 0.82:
            world.swap_out(_pick(rng, world, SequenceStatus.RUNNING))
        elif op < 0.90:
            world.swap_in(_pick(rng, world, SequenceStatus.SWAPPED))
        else:
            world.truncate(_pick(rng, world, *live), rng.random())
        world.check()
    world.free_all_and_check_no_leak()
    summary = dict(world.counts)
    summary["seed"] = seed
    summary["num_steps"] = num_steps
    return summary
