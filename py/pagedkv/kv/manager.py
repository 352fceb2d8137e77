"""Per-sequence paged KV cache API on top of the block pool: allocation, sharing, swap and eviction.

Callers get block ids and explicit copy plans, never Block objects. Only the
pool touches ref counts, the free queue and the hash map.

Prefix caching (prefix.py): each full block gets a chained hash of (parent hash,
token ids, namespace) (the namespace, e.g. the model id, keeps models apart), and a
hit is verified through the block it names. Registered blocks are immutable:
appending into one (after a truncate) copies it first, like a shared block.
Blocks become addressable as soon as their slots are allocated; the
forward pass of that same step writes them before any later step reads.

The manager holds its CPU tier (cpu_tier.py): it tells it of swaps and GPU
evictions, and hands its copies out with every other plan (`take_demotions`).
"""

from __future__ import annotations

from typing import Hashable, NamedTuple

from ..config import CacheConfig
from ..sequence import Sequence, SequenceStatus, append_then_allocate, check_token_ids
from .block_pool import BlockPool, BlockState, CopyOp, OutOfBlocks
from .cpu_tier import CpuTier
from .prefix import HashFn, PrefixIndex, default_block_hash
from .retention import ShiftOp

__all__ = ["KVCacheManager", "CopyOp", "OutOfBlocks", "NeverFits", "SequenceFreed", "DoubleFree"]


class NeverFits(ValueError):
    """The request needs more blocks than the whole pool has; no preemption helps."""


class SequenceFreed(ValueError):
    """The sequence was already freed; it holds no KV and cannot grow."""


class DoubleFree(SequenceFreed):
    """free() called twice on the same sequence."""


class _Plan(NamedTuple):
    hit_ids: list[int]
    hit_hashes: list[Hashable]
    hit_links: list[tuple[int, int]]
    num_new_blocks: int
    cow: bool
    num_needed: int       # blocks that must come out of the free queue
    num_available: int    # blocks the free queue can give after the hits are pulled out


class KVCacheManager:
    """Paged KV cache for one model: GPU pool, optional CPU swap pool, prefix cache.

    namespace: mixed into every prefix hash (e.g. the model id) so two models or
    tenants never share blocks. hash_fn: injectable for tests (e.g. a colliding one).
    pool: a GPU pool shared with other managers (see SharedKVBudget); its size
    must equal config.num_blocks. By default the manager owns a fresh pool.
    """

    def __init__(self, config: CacheConfig, namespace: str | None = None,
                 hash_fn: HashFn = default_block_hash, pool: BlockPool | None = None) -> None:
        if pool is not None and pool.num_blocks != config.num_blocks:
            raise ValueError(f"shared pool has {pool.num_blocks} blocks but config.num_blocks "
                             f"is {config.num_blocks}")
        demotes = config.demote_to_cpu and config.num_cpu_blocks > 0 and config.enable_prefix_caching
        if pool is not None and demotes:
            raise ValueError("a shared GPU pool cannot demote into one model's CPU tier; set demote_to_cpu=False")
        self.config = config
        self.block_size = config.block_size
        self.namespace = namespace
        self.pool = pool if pool is not None else BlockPool(config.num_blocks,
                                                            on_evict=self._demote if demotes else None)
        self.prefix = PrefixIndex(self.pool, config.block_size, namespace, hash_fn, config.enable_prefix_caching)
        self.cpu = (CpuTier(config.num_cpu_blocks, config.block_size, namespace, self.pool,
                            caching=config.enable_prefix_caching, demotes=demotes)
                    if config.num_cpu_blocks > 0 else None)
        self.live: dict[int, Sequence] = {}
        self.num_lookup_tokens = 0
        self.num_hit_tokens = 0

    # -- queries -------------------------------------------------------------
    @property
    def cpu_pool(self) -> BlockPool | None:
        """The CPU (swap) pool, None without one."""
        return self.cpu.pool if self.cpu is not None else None

    def lookup_prefix(self, token_ids: list[int] | tuple[int, ...]) -> tuple[int, list[int]]:
        """Longest verified cached prefix of `token_ids`: (num_cached_tokens, block_ids).
        Pure query: no ref counts change."""
        ids = self.prefix.match(token_ids, len(token_ids) // self.block_size).ids
        return len(ids) * self.block_size, ids

    def evict_prefix(self, token_ids: list[int] | tuple[int, ...], keep_tokens: int = 0) -> int:
        """Forget the cached blocks of `token_ids` past its first `keep_tokens` tokens (a deleted
        conversation's history): they become free blocks, reused first. Blocks a live sequence
        holds are untouched. Returns the number of blocks freed (the CPU tier's: cpu.forget)."""
        ids = self.prefix.match(token_ids, len(token_ids) // self.block_size).ids
        return self.pool.evict_cached(ids[keep_tokens // self.block_size:])

    def adopt_blocks(self, token_ids, start: int, num_blocks: int) -> list[int]:
        """Register up to `num_blocks` fresh blocks as the cached blocks start, start+1, ... of `token_ids`,
        whose verified cached prefix must be exactly `start` blocks (else none). They stay cached (ref 0) for
        the caller to fill (the disk tier) before the next forward; fewer when the pool runs out or a hash
        is taken. Returns their ids in order."""
        return self.prefix.adopt(token_ids, start, num_blocks)

    def promote_from_cpu(self, token_ids) -> list[CopyOp]:
        """Copy the CPU tier's run of the full blocks of `token_ids` that follow its GPU-cached prefix into fresh
        GPU blocks, registered as cached prefix blocks (ref 0). Returns the (cpu block, gpu block) copies to
        run, after take_demotions()' copies, before those GPU blocks are read or reused; fewer blocks when the
        GPU pool runs short."""
        cpu, bs = self.cpu, self.block_size
        n = len(token_ids) // bs
        if cpu is None:
            return []
        start = self.lookup_prefix(token_ids[:n * bs])[0] // bs
        run = cpu.find_run(token_ids, start, n)
        if not run:
            return []
        cpu.pool.touch(run)  # a demotion the GPU allocation below triggers must not take the blocks being read
        gpu_ids = self.adopt_blocks(token_ids[:(start + len(run)) * bs], start, len(run))
        cpu.pool.free_blocks(reversed(run))  # used now: the recent end of the CPU pool's LRU, prefix last
        return [CopyOp(c, g) for c, g in zip(run, gpu_ids)]

    def take_demotions(self) -> list[CopyOp]:
        """The CPU tier's pending (gpu, cpu) demotion copies: they run before anything writes the GPU blocks
        evicted since the last call (empty without a demoting CPU tier)."""
        return self.cpu.take_demotions() if self.cpu is not None else []

    def _demote(self, block: BlockState) -> None:
        self.cpu.demote(block)  # type: ignore[union-attr]  (wired only when the tier demotes)

    def get_block_ids(self, seq: Sequence) -> list[int]:
        """The sequence's block table (a copy)."""
        return list(seq.block_table)

    # -- growth --------------------------------------------------------------
    def _plan(self, seq: Sequence, num_new_tokens: int, check_fits: bool = True) -> _Plan:
        self._check_active(seq, "allocate slots for")
        if not isinstance(num_new_tokens, int) or num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be a non-negative int, got {num_new_tokens!r}")
        bs = self.block_size
        end = seq.num_kv_tokens + num_new_tokens
        if end > seq.num_tokens:
            raise ValueError(f"sequence {seq.seq_id} has {seq.num_tokens} token ids; append the "
                             f"token ids before allocating slots up to {end}")
        total_blocks = -(-(end - seq.num_evicted_tokens) // bs)
        if check_fits and total_blocks > self.pool.capacity:
            raise NeverFits(f"sequence {seq.seq_id} needs {total_blocks} blocks of {bs} tokens "
                            f"for {end} tokens; the pool only has {self.pool.capacity}")
        hit_ids: list[int] = []
        hit_hashes: list[Hashable] = []
        hit_links: list[tuple[int, int]] = []
        if not seq.block_table and num_new_tokens > 0:
            # Leave at least one token to compute: the model needs its logits.
            hit_ids, hit_hashes, hit_links = self.prefix.match(seq.token_ids, (end - 1) // bs)
        cow = False
        if seq.num_kv_tokens % bs and num_new_tokens > 0:
            last = self.pool.block(seq.block_table[-1])
            cow = last.ref_count > 1 or last.block_hash is not None
        num_new_blocks = total_blocks - len(seq.block_table) - len(hit_ids)
        pulled = sum(1 for b in hit_ids if self.pool.ref_count(b) == 0)
        return _Plan(hit_ids, hit_hashes, hit_links, num_new_blocks, cow,
                     num_new_blocks + int(cow), self.pool.num_available - pulled)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether allocate_slots(seq, num_new_tokens) would succeed right now."""
        try:
            plan = self._plan(seq, num_new_tokens)
        except NeverFits:
            return False
        return plan.num_needed <= plan.num_available

    def num_blocks_short(self, seq: Sequence, num_new_tokens: int) -> int:
        """How many more free blocks allocate_slots(seq, num_new_tokens) would need right now (0: it fits);
        also when the pool is smaller than the sequence (eviction makes room)."""
        plan = self._plan(seq, num_new_tokens, check_fits=False)
        return max(0, plan.num_needed - plan.num_available)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, *, register: bool = True) -> list[CopyOp]:
        """Give KV slots to the next `num_new_tokens` token ids of `seq`.

        A sequence without blocks first shares its longest verified cached
        prefix (seq.num_computed_tokens jumps to its length). A new block is
        taken only when the last one is full. Returns the copy-on-write ops the
        backend must run before writing (appending into a shared or cached
        partial block). Raises OutOfBlocks (state unchanged) when the pool is
        short right now, NeverFits when it can never hold the sequence.
        register=False: a block these slots fill is not made findable in the
        prefix cache yet (its last token id is still being drawn on the GPU:
        decode_chain.py); register_blocks does it once the id is known.
        """
        plan = self._plan(seq, num_new_tokens)
        if plan.num_needed > plan.num_available:
            raise OutOfBlocks(f"sequence {seq.seq_id} needs {plan.num_needed} blocks, "
                              f"{plan.num_available} free or cached")
        if seq.status is SequenceStatus.WAITING and not seq.block_table:
            self.num_lookup_tokens += num_new_tokens
            self.num_hit_tokens += len(plan.hit_ids) * self.block_size
        ops: list[CopyOp] = []
        if plan.hit_ids:
            self.pool.touch(plan.hit_ids)
            seq.block_table = list(plan.hit_ids)
            seq.block_hashes = list(plan.hit_hashes)
            seq.block_links = list(plan.hit_links)
            seq.num_computed_tokens = len(plan.hit_ids) * self.block_size
        if plan.cow:
            src = seq.block_table[-1]
            dst = self.pool.get_new_blocks(1)[0]
            self.pool.free_blocks([src])
            seq.block_table[-1] = dst
            ops.append(CopyOp(src, dst))
        seq.block_table.extend(self.pool.get_new_blocks(plan.num_new_blocks))
        seq.num_kv_tokens += num_new_tokens
        seq.status = SequenceStatus.RUNNING
        self.live[seq.seq_id] = seq
        if register:
            self.prefix.register_full_blocks(seq)
        return ops

    def register_blocks(self, seq: Sequence) -> None:
        """Make the full blocks allocate_slots(register=False) left unfindable findable (prefix cache)."""
        self._check_active(seq, "register blocks of")
        self.prefix.register_full_blocks(seq)

    def mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        """The forward wrote the KV of the next `num_tokens` slotted tokens of `seq`."""
        self._check_active(seq, "mark computed tokens of")
        if seq.num_computed_tokens + num_tokens > seq.num_kv_tokens:
            raise ValueError(f"sequence {seq.seq_id}: {num_tokens} tokens from {seq.num_computed_tokens} exceed "
                             f"its {seq.num_kv_tokens} KV slots")
        seq.num_computed_tokens += num_tokens

    def append_tokens(self, seq: Sequence, token_ids: list[int]) -> list[CopyOp]:
        """Append sampled token ids and give them slots (decode). State unchanged on error."""
        self._check_active(seq, "append to")
        check_token_ids(token_ids)
        if seq.num_kv_tokens != seq.num_tokens:
            raise ValueError(f"sequence {seq.seq_id} has {seq.num_tokens - seq.num_kv_tokens} "
                             "token ids without slots; allocate_slots them first")
        return append_then_allocate(seq, token_ids, self.allocate_slots)

    def add_attention_mass(self, seqs: list[Sequence], mass) -> None:
        """mass (S, max_blocks): one forward's attention mass per block-table entry of each of `seqs`, added
        to its block's importance score (H2O eviction, retention.evictable)."""
        for i, seq in enumerate(seqs):
            scores = seq.block_scores
            for k, block in enumerate(seq.block_table):
                scores[block] = scores.get(block, 0.0) + float(mass[i, k])

    # -- sharing, release, rollback -------------------------------------------
    def fork(self, seq: Sequence, session: str | None = None) -> Sequence:
        """A child sharing every block of `seq` (ref++); CoW happens on its first append."""
        self._check_active(seq, "fork")
        child = Sequence(seq.token_ids, session=seq.session if session is None else session)
        self.pool.touch(seq.block_table)
        child.num_kv_tokens = seq.num_kv_tokens
        child.num_computed_tokens = seq.num_computed_tokens
        child.block_table = list(seq.block_table)
        child.block_hashes = list(seq.block_hashes)
        child.block_links = list(seq.block_links)
        child.num_evicted_tokens = seq.num_evicted_tokens
        child.block_scores = dict(seq.block_scores)
        child.status = seq.status
        if child.block_table:
            self.live[child.seq_id] = child
        return child

    def free(self, seq: Sequence) -> None:
        """Release every block of `seq`, tail first, and mark it finished."""
        if seq.status is SequenceStatus.FINISHED:
            raise DoubleFree(f"sequence {seq.seq_id} was already freed")
        pool = self.cpu_pool if seq.status is SequenceStatus.SWAPPED else self.pool
        if seq.block_table:
            pool.free_blocks(reversed(seq.block_table))  # type: ignore[union-attr]
        seq.block_table = []
        seq.block_hashes = []
        seq.block_links = []
        seq.num_kv_tokens = seq.num_computed_tokens = seq.num_evicted_tokens = 0
        seq.block_scores = {}
        seq.status = SequenceStatus.FINISHED
        self.live.pop(seq.seq_id, None)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll `seq` back to its first `num_tokens` tokens, freeing blocks past them."""
        self._check_active(seq, "truncate")
        if seq.num_evicted_tokens:
            raise ValueError(f"cannot truncate sequence {seq.seq_id}: blocks of its history were evicted "
                             "(sliding window / eviction); recompute it from its token ids instead")
        if not isinstance(num_tokens, int) or not 0 <= num_tokens <= seq.num_tokens:
            raise ValueError(f"num_tokens must be in [0, {seq.num_tokens}], got {num_tokens!r}")
        bs = self.block_size
        kv = min(seq.num_kv_tokens, num_tokens)
        keep = -(-kv // bs)
        self.pool.free_blocks(reversed(seq.block_table[keep:]))
        del seq.block_table[keep:]
        del seq.block_hashes[kv // bs:]
        del seq.block_links[kv // bs:]
        del seq.token_ids[num_tokens:]
        seq.num_kv_tokens = kv
        seq.num_computed_tokens = min(seq.num_computed_tokens, kv)
        if not seq.block_table:
            seq.status = SequenceStatus.WAITING
            self.live.pop(seq.seq_id, None)

    # -- eviction -------------------------------------------------------------
    def evict_blocks(self, seq: Sequence, table_indices: list[int],
                     shift_positions: bool = False) -> tuple[list[CopyOp], list[ShiftOp]]:
        """Give the listed full, computed blocks of `seq` (block-table indices) back to the pool now.

        The block table shrinks and seq.num_evicted_tokens grows. With shift_positions, the blocks after
        an evicted one move down in the cache: returns their key re-rotations (ShiftOp) plus the
        copies to run first for a block shared with another sequence (its copy is rotated, the other
        sequence keeps the original). Raises ValueError / OutOfBlocks with the state unchanged.
        """
        self._check_active(seq, "evict blocks of")
        bs = self.block_size
        idx = sorted(set(table_indices))
        computed = (seq.num_computed_tokens - seq.num_evicted_tokens) // bs
        if idx and (idx[0] < 0 or idx[-1] >= computed):
            raise ValueError(f"sequence {seq.seq_id}: can only evict full, computed blocks 0..{computed - 1} "
                             f"of its table, got {idx}")
        if not idx:
            return [], []
        gone = set(idx)
        shifted = [(k, bs * sum(1 for i in idx if i < k)) for k in range(idx[0] + 1, len(seq.block_table))
                   if k not in gone] if shift_positions else []
        shared = [k for k, _ in shifted if self.pool.ref_count(seq.block_table[k]) > 1]
        freed = sum(1 for i in idx if self.pool.ref_count(seq.block_table[i]) == 1)
        if len(shared) > self.pool.num_available + freed:
            raise OutOfBlocks(f"re-rotating sequence {seq.seq_id} needs {len(shared)} copies of shared "
                              f"blocks, {self.pool.num_available + freed} free")
        evicted = [seq.block_table[i] for i in idx]
        self.pool.free_blocks(reversed(evicted))
        copies: list[CopyOp] = []
        shifts: list[ShiftOp] = []
        for k, delta in shifted:
            block = seq.block_table[k]
            if k in shared:
                new = self.pool.get_new_blocks(1)[0]
                self.pool.free_blocks([block])
                copies.append(CopyOp(block, new))
                seq.block_scores[new] = seq.block_scores.pop(block, 0.0)
                seq.block_table[k] = block = new
            else:
                self.pool.unregister(block)  # its keys change: no longer that prefix's K/V
            shifts.append(ShiftOp(block, delta))
        for block in evicted:
            seq.block_scores.pop(block, None)
        seq.block_table = [b for i, b in enumerate(seq.block_table) if i not in gone]
        seq.num_evicted_tokens += bs * len(idx)
        return copies, shifts

    # -- preemption -----------------------------------------------------------
    def swap_out(self, seq: Sequence) -> list[CopyOp]:
        """Move `seq`'s KV to the CPU pool. Returns (gpu_block, cpu_block) copies the backend
        must run before the freed GPU blocks are reused."""
        self._check_status(seq, SequenceStatus.RUNNING, "swap out")
        cpu = self._require_cpu_pool()
        n = len(seq.block_table)
        if n > cpu.num_blocks:
            raise NeverFits(f"sequence {seq.seq_id} has {n} blocks; the CPU pool only has "
                            f"{cpu.num_blocks}")
        cpu_ids = cpu.get_new_blocks(n)
        plan = [CopyOp(g, c) for g, c in zip(seq.block_table, cpu_ids)]
        if not seq.num_evicted_tokens:  # after an eviction the K/V is not that prefix's: never a hit
            self.cpu.register_swapped(seq.token_ids, seq.num_computed_tokens // self.block_size, cpu_ids)
        self.pool.free_blocks(reversed(seq.block_table))
        seq.block_table = cpu_ids
        seq.block_links = []
        seq.status = SequenceStatus.SWAPPED
        return plan

    def swap_in(self, seq: Sequence) -> list[CopyOp]:
        """Bring a swapped sequence back. Blocks still in the GPU prefix cache are shared
        instead of copied; returns (cpu_block, gpu_block) copies for the rest."""
        self._check_status(seq, SequenceStatus.SWAPPED, "swap in")
        cpu = self._require_cpu_pool()
        n = len(seq.block_table)
        hit_ids, hit_hashes, hit_links = self.prefix.match(
            seq.token_ids, 0 if seq.num_evicted_tokens else seq.num_kv_tokens // self.block_size)
        pulled = sum(1 for b in hit_ids if self.pool.ref_count(b) == 0)
        need = n - len(hit_ids)
        if need > self.pool.num_available - pulled:
            raise OutOfBlocks(f"swap-in of sequence {seq.seq_id} needs {need} GPU blocks, "
                              f"{self.pool.num_available - pulled} free or cached")
        self.pool.touch(hit_ids)
        new_ids = self.pool.get_new_blocks(need)
        cpu_ids = seq.block_table
        plan = [CopyOp(c, g) for c, g in zip(cpu_ids[len(hit_ids):], new_ids)]
        self.cpu.release_reads(list(reversed(cpu_ids)))  # type: ignore[union-attr]
        seq.block_table = hit_ids + new_ids
        if not seq.num_evicted_tokens:
            seq.block_hashes = hit_hashes
            seq.block_links = hit_links
        seq.status = SequenceStatus.RUNNING
        self.prefix.register_full_blocks(seq)
        return plan

    # -- checks ---------------------------------------------------------------
    def _check_active(self, seq: Sequence, what: str) -> None:
        if seq.status is SequenceStatus.FINISHED:
            raise SequenceFreed(f"cannot {what} sequence {seq.seq_id}: it was freed")
        if seq.status is SequenceStatus.SWAPPED:
            raise ValueError(f"cannot {what} sequence {seq.seq_id}: it is swapped out; swap_in first")

    def _check_status(self, seq: Sequence, status: SequenceStatus, what: str) -> None:
        if seq.status is SequenceStatus.FINISHED:
            raise SequenceFreed(f"cannot {what} sequence {seq.seq_id}: it was freed")
        if seq.status is not status:
            raise ValueError(f"cannot {what} sequence {seq.seq_id}: it is {seq.status.value}, needs {status.value}")

    def _require_cpu_pool(self) -> BlockPool:
        if self.cpu is None:
            raise ValueError("swapping needs a CPU pool: set CacheConfig.num_cpu_blocks > 0")
        return self.cpu.pool

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / prompt tokens allocated fresh."""
        return self.num_hit_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0
