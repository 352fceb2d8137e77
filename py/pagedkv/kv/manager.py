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

KV groups (groups.py): a model with sliding-window layers keeps one block table per group of layers, all in
this one pool (a block id is a page holding one group's layers). A window group's table is positional like
the full one, but its blocks that lie wholly out of the window of the sequence's next query leave it as the
query advances (in decode and between prefill chunks: before each allocation), replaced by the null block, a
pool block reserved for the purpose that no sequence ever writes and no kernel needs (its keys are masked);
a window group therefore holds at most ceil((W - 1 + chunk) / B) + 1 blocks of a sequence. Released blocks go
back to the pool like freed ones: a full (hashed) block stays in the prefix cache as an evictable block, as in
vLLM, because another sequence's hit whose end lies within W tokens of it needs exactly that block (a shared
prompt read again); it costs nothing until a fresh block is needed, and is then evicted first among cached
blocks of the same age (the oldest released first). A prefix hit takes the longest length every group can
serve: the full groups' common prefix, and in each window group only the blocks the hit's next query sees
(prefix.WindowPrefixIndex). The CPU and disk tiers extend a hit by the same rule (tier_hit, then adopt_hit:
fresh blocks registered in every group where the hit needs them). A pool shared by several models (SharedKVBudget,
the engine's add_model) works alike: each hybrid model reserves a null page of its own there, its groups' pages
are pages of the one pool, and its released blocks are cached pages any model's allocation may evict. A
request's retention (a sliding window with sinks, importance eviction: retention.py) drops table indices from
every group at once (evict_blocks), and the window groups count distances in cache indices, so they keep the
leading entries a drop could bring back into their view (KVRetention.pinned_blocks).
"""

from __future__ import annotations

from typing import Callable, Hashable, NamedTuple

from ..config import CacheConfig
from ..sequence import Sequence, SequenceStatus, append_then_allocate, check_token_ids
from .block_pool import BlockPool, BlockState, CopyOp, OutOfBlocks
from .cpu_tier import CpuTier
from .groups import KVGroup, KVGroups, first_needed_block
from .prefix import HashFn, PrefixIndex, PrefixMatch, WindowPrefixIndex, default_block_hash
from .retention import KVRetention, ShiftOp, min_blocks

__all__ = ["KVCacheManager", "CopyOp", "OutOfBlocks", "NeverFits", "SequenceFreed", "DoubleFree", "TierHit"]


class NeverFits(ValueError):
    """The request needs more blocks than the whole pool has; no preemption helps."""


class SequenceFreed(ValueError):
    """The sequence was already freed; it holds no KV and cannot grow."""


class DoubleFree(SequenceFreed):
    """free() called twice on the same sequence."""


class TierHit(NamedTuple):
    """A prefix hit another tier (CPU, disk) extends (KVCacheManager.tier_hit): the GPU cache serves `start`
    blocks; every group serves `num_blocks` once the tier's `blocks` ((group, table index) each, group by group,
    index ascending) are on the GPU."""
    start: int
    num_blocks: int
    blocks: list[tuple[int, int]]


class _Plan(NamedTuple):
    hits: list[PrefixMatch] | None  # per group: the prefix hit of a sequence without blocks yet
    releases: list[list[int]]  # per group: table indices that left the window (freed before allocating)
    num_new_blocks: list[int]  # per group
    cows: list[bool]           # per group: its last, partial block is copied first
    num_needed: int       # blocks that must come out of the free queue
    num_available: int    # blocks the free queue can give after the hits are pulled out and releases freed


class KVCacheManager:
    """Paged KV cache for one model: GPU pool, optional CPU swap pool, prefix cache.

    namespace: mixed into every prefix hash (e.g. the model id) so two models or
    tenants never share blocks. hash_fn: injectable for tests (e.g. a colliding one).
    pool: a GPU pool shared with other managers (see SharedKVBudget); its size
    must equal config.num_blocks. By default the manager owns a fresh pool.
    groups: the model's KV groups (groups.py); None: one full-attention group (one table per sequence).
    """

    def __init__(self, config: CacheConfig, namespace: str | None = None,
                 hash_fn: HashFn = default_block_hash, pool: BlockPool | None = None,
                 groups: KVGroups | None = None) -> None:
        if pool is not None and pool.num_blocks != config.num_blocks:
            raise ValueError(f"shared pool has {pool.num_blocks} blocks but config.num_blocks "
                             f"is {config.num_blocks}")
        self.groups = groups
        self.windows: tuple[int | None, ...] = groups.windows if groups is not None else (None,)
        demotes = config.demote_to_cpu and config.num_cpu_blocks > 0 and config.enable_prefix_caching
        if pool is not None and demotes:
            raise ValueError("a shared GPU pool cannot demote into one model's CPU tier; set demote_to_cpu=False")
        self.config = config
        self.block_size = config.block_size
        self.namespace = namespace
        self.pool = pool if pool is not None else BlockPool(config.num_blocks,
                                                            on_evict=self._demote if demotes else None)
        caching = config.enable_prefix_caching
        # Group 0 keeps the namespace (a one-group model's hashes are what they always were); the others add theirs.
        self.prefixes = [
            PrefixIndex(self.pool, config.block_size, namespace if g == 0 else f"{namespace}#g{g}", hash_fn, caching)
            if w is None else WindowPrefixIndex(self.pool, config.block_size, f"{namespace}#g{g}", w, caching)
            for g, w in enumerate(self.windows)]
        self.prefix = self.prefixes[0]
        self.cpu = (CpuTier(config.num_cpu_blocks, config.block_size, namespace, self.pool, caching=caching,
                            demotes=demotes, groups=tuple((p.namespace, w) for p, w in zip(self.prefixes, self.windows)))
                    if config.num_cpu_blocks > 0 else None)
        # The placeholder of a window group's released entries: a page of the pool reserved for this model (in
        # a pool several models share, one of its pages until the model leaves: LLMEngine.remove_model). The CPU
        # pool reserves the same id, so a swapped table keeps its placeholders.
        self.null_block: int | None = None
        if any(w is not None for w in self.windows):
            self.null_block = self.pool.reserve(1)[0]
            if self.cpu is not None:
                if self.null_block >= self.cpu.pool.num_blocks:
                    self.pool.release([self.null_block])
                    raise ValueError(f"the null block of the window groups is page {self.null_block} of the shared "
                                     f"pool, past the CPU pool's {self.cpu.pool.num_blocks} blocks; give the CPU "
                                     f"pool more than {self.null_block} blocks or none")
                self.cpu.pool.reserve_ids([self.null_block])
        self.live: dict[int, Sequence] = {}
        self.num_lookup_tokens = 0
        self.num_hit_tokens = 0

    # -- queries -------------------------------------------------------------
    @property
    def cpu_pool(self) -> BlockPool | None:
        """The CPU (swap) pool, None without one."""
        return self.cpu.pool if self.cpu is not None else None

    @property
    def num_groups(self) -> int:
        """KV groups: block tables per sequence (groups.py)."""
        return len(self.windows)

    @property
    def is_hybrid(self) -> bool:
        """Whether the layout is other than one full-attention table per sequence (several groups, or a window
        group): a swap-in then copies every page back instead of sharing the GPU cache's (swap_in)."""
        return self.windows != (None,)

    def _match(self, token_ids, max_blocks: int) -> list[PrefixMatch]:
        """Per group, the blocks of the longest prefix of at most `max_blocks` blocks that every group serves
        (module docstring): the full groups' common verified prefix, shortened until each window group holds
        the blocks its next query sees; a window group's earlier entries are the null block."""
        if len(self.windows) == 1 and self.windows[0] is None:
            return [self.prefix.match(token_ids, max_blocks)]
        full = {g: p.match(token_ids, max_blocks) for g, p in enumerate(self.prefixes) if self.windows[g] is None}
        n = min((len(m.ids) for m in full.values()), default=max_blocks)
        windows = {g: p for g, p in enumerate(self.prefixes) if self.windows[g] is not None}
        digests = {g: p.digests(token_ids, n) for g, p in windows.items()}
        settled = False
        while not settled:  # a shorter hit in one window group may miss another's window: until none shrinks
            settled = True
            for g, p in windows.items():
                h = p.hit_blocks(token_ids, n, digests[g])
                if h < n:
                    n, settled = h, False
        out = []
        for g, w in enumerate(self.windows):
            if w is None:
                m = full[g]
                out.append(PrefixMatch(m.ids[:n], m.hashes[:n], m.links[:n]))
                continue
            p = windows[g]
            first = max(0, n - p.num_tail_blocks)
            ids = [self.null_block] * first + [p.cached(token_ids, i, digests[g]) for i in range(first, n)]
            out.append(PrefixMatch(ids, digests[g][:n], []))  # type: ignore[arg-type]
        return out

    def lookup_prefix(self, token_ids: list[int] | tuple[int, ...]) -> tuple[int, list[int]]:
        """Longest verified cached prefix of `token_ids` every KV group serves: (num_cached_tokens, group 0's
        block_ids). Pure query: no ref counts change."""
        ids = self._match(token_ids, len(token_ids) // self.block_size)[0].ids
        return len(ids) * self.block_size, ids

    def cached_tables(self, token_ids) -> list[list[int]]:
        """Per KV group, the blocks of the longest verified cached prefix of `token_ids` every group serves
        (a window group's released entries: the null block). Pure query."""
        return [m.ids for m in self._match(token_ids, len(token_ids) // self.block_size)]

    def evict_prefix(self, token_ids: list[int] | tuple[int, ...], keep_tokens: int = 0) -> int:
        """Forget the cached blocks of `token_ids` past its first `keep_tokens` tokens (a deleted
        conversation's history), in every KV group: they become free blocks, reused first. Blocks a live
        sequence holds are untouched. Returns the number of blocks freed (the CPU tier's: cpu.forget)."""
        keep = keep_tokens // self.block_size
        hits = self._match(token_ids, len(token_ids) // self.block_size)
        return sum(self.pool.evict_cached([b for b in m.ids[keep:] if b != self.null_block]) for m in hits)

    def evict_all_cached(self) -> int:
        """Forget every cached block of this model, in every KV group (it leaves a pool it shared: each group
        hashes under a namespace of its own). Blocks a live sequence holds are untouched; returns how many."""
        return sum(self.pool.evict_salted(p.namespace) for p in self.prefixes)

    def tier_hit(self, token_ids, held: Callable[[int, int], bool]) -> TierHit:
        """The longest prefix hit of the full blocks of `token_ids` that another tier extends, by the rule of a
        lookup (_match): every full group needs each block up to the hit, each window group the blocks its next
        query sees; a block comes from the GPU cache or, where `held(group, table index)` says so, from the tier.
        Only as many blocks as the pool gives fresh (the hit's own cached blocks kept); none where a block's hash
        is taken by another block. Pure query."""
        bs = self.block_size
        n_max = len(token_ids) // bs
        k = len(self._match(token_ids, n_max)[0].ids)
        if not self.config.enable_prefix_caching or k == n_max:
            return TierHit(k, k, [])
        gpu: list[list[int | None]] = []  # per group: the verified cached block of each table index, or None
        taken: list[set[int]] = []  # per group: indices whose hash another block holds (never adopted)
        reach = n_max  # the full groups' blocks reach no further (GPU, then the tier's run)
        for g, (w, p) in enumerate(zip(self.windows, self.prefixes)):
            if w is None:
                m = p.match(token_ids, n_max)
                parent, i = (m.hashes[-1] if m.hashes else None), len(m.ids)
                while i < n_max and held(g, i):
                    parent = p.hash_fn(parent, tuple(token_ids[i * bs:(i + 1) * bs]), p.namespace)
                    if self.pool.cached_block(parent) is not None:
                        break
                    i += 1
                reach = min(reach, i)
                gpu.append(m.ids + [None] * (n_max - len(m.ids)))
                taken.append(set())
            else:
                digests = p.digests(token_ids, n_max)
                gpu.append([p.cached(token_ids, i, digests) for i in range(n_max)])
                taken.append({i for i in range(n_max) if gpu[g][i] is None
                              and self.pool.cached_block(digests[i]) is not None})
        for n in range(reach, k, -1):  # the window groups first: a miss there is the usual reason to shorten
            need = [(g, i) for g, w in enumerate(self.windows) if w is not None
                    for i in range(first_needed_block(w, n * bs, bs), n)]
            if any(gpu[g][i] is None and (i in taken[g] or not held(g, i)) for g, i in need):
                continue
            need = sorted(need + [(g, i) for g, w in enumerate(self.windows) if w is None for i in range(n)])
            missing = [(g, i) for g, i in need if gpu[g][i] is None]  # a full group's: held up to `reach`
            idle = sum(1 for b in {gpu[g][i] for g, i in need} - {None} if self.pool.ref_count(b) == 0)
            if len(missing) <= self.pool.num_available - idle:
                return TierHit(k, n, missing)
        return TierHit(k, k, [])

    def adopt_hit(self, token_ids, hit: TierHit) -> list[int]:
        """Register fresh blocks as the cached blocks `hit.blocks` of `token_ids` (tier_hit's, just planned),
        one per block, in that order, chained to the hit's cached blocks in each group. They stay cached (ref 0)
        for the caller to fill (a CPU tier's copy, the disk tier's write) before the next forward. Returns their
        ids in hit.blocks' order."""
        if not hit.blocks:
            return []
        bs, n = self.block_size, hit.num_blocks
        kept: list[int] = []  # the hit's cached blocks, held while the fresh ones are taken
        chains = []  # per group: how to register its block i
        for g, (w, p) in enumerate(zip(self.windows, self.prefixes)):
            first = first_needed_block(w, n * bs, bs)
            if w is None:
                m = p.match(token_ids, n)
                kept += m.ids
                chains.append([m.hashes[-1] if m.ids else None, m.links[-1] if m.ids else None, len(m.ids)])
            else:
                digests = p.digests(token_ids, n)
                kept += [b for b in (p.cached(token_ids, i, digests) for i in range(first, n)) if b is not None]
                chains.append(digests)
        self.pool.touch(kept)  # the fresh blocks must not evict the prefix they extend
        new = self.pool.get_new_blocks(len(hit.blocks))
        for block, (g, i) in zip(new, hit.blocks):
            p, chunk = self.prefixes[g], tuple(token_ids[i * bs:(i + 1) * bs])
            if self.windows[g] is None:
                parent_hash, parent_link, nxt = chains[g]
                if i != nxt:
                    raise ValueError(f"group {g}: block {i} does not follow the cached prefix of {nxt} blocks")
                h = p.hash_fn(parent_hash, chunk, p.namespace)
                chains[g] = [h, self.pool.register(block, h, chunk, parent_link, p.namespace), i + 1]
            else:
                digests = chains[g]
                self.pool.register(block, digests[i], chunk, digests[i - 1] if i else None, p.namespace)
        self.pool.free_blocks(reversed(kept + new))
        return new

    def adopt_blocks(self, token_ids, start: int, num_blocks: int) -> list[int]:
        """Register up to `num_blocks` fresh blocks as the cached blocks start, start+1, ... of `token_ids`,
        whose verified cached prefix must be exactly `start` blocks (else none), in every KV group where the hit
        they make needs them (tier_hit, adopt_hit). Fewer when the pool runs out or a hash is taken. Returns
        their ids (group by group)."""
        n = min(start + num_blocks, len(token_ids) // self.block_size)
        hit = self.tier_hit(token_ids[:n * self.block_size], lambda g, i: i >= start)
        return self.adopt_hit(token_ids, hit) if hit.start == start else []

    def promote_from_cpu(self, token_ids) -> list[CopyOp]:
        """Copy the CPU tier's blocks that extend the GPU-cached prefix of the full blocks of `token_ids` (by
        tier_hit's rule for KV groups) into fresh GPU blocks, registered as cached prefix blocks (ref 0).
        Returns the (cpu block, gpu block) copies to run, after take_demotions()' copies, before those GPU blocks
        are read or reused; fewer blocks when the GPU pool runs short."""
        cpu = self.cpu
        if cpu is None:
            return []
        cached = cpu.cached_blocks(token_ids, len(token_ids) // self.block_size)
        hit = self.tier_hit(token_ids, lambda g, i: i in cached[g])
        run = [cached[g][i] for g, i in hit.blocks]
        if not run:
            return []
        cpu.pool.touch(run)  # a demotion the GPU allocation below triggers must not take the blocks being read
        gpu_ids = self.adopt_hit(token_ids, hit)
        cpu.pool.free_blocks(reversed(run))  # used now: the recent end of the CPU pool's LRU, prefix last
        return [CopyOp(c, g) for c, g in zip(run, gpu_ids)]

    def take_demotions(self) -> list[CopyOp]:
        """The CPU tier's pending (gpu, cpu) demotion copies: they run before anything writes the GPU blocks
        evicted since the last call (empty without a demoting CPU tier)."""
        return self.cpu.take_demotions() if self.cpu is not None else []

    def _demote(self, block: BlockState) -> None:
        self.cpu.demote(block)  # type: ignore[union-attr]  (wired only when the tier demotes)

    def get_block_ids(self, seq: Sequence) -> list[int]:
        """The sequence's block table (group 0's; a copy)."""
        return list(seq.block_table)

    def held_blocks(self, seq: Sequence) -> list[int]:
        """The blocks `seq` holds (GPU or, swapped, CPU), every group's, null entries left out."""
        return [b for table in seq.block_tables for b in table if b != self.null_block]

    def num_held_blocks(self, seq: Sequence) -> int:
        """How many blocks `seq` holds, every group's (what swapping it out copies)."""
        return len(self.held_blocks(seq))

    def blocks_needed(self, num_tokens: int, chunk: int, retention: KVRetention | None = None) -> int:
        """The most blocks a sequence of `num_tokens` tokens, computed in chunks of at most `chunk`, holds at
        once: ceil(num_tokens / B) per full group, a window group no more than its window and a chunk.
        retention: the request's policy; its table bound (retention.min_blocks) binds every group, and a window
        group holds the entries it pins (KVRetention.pinned_blocks) on top of its window."""
        bs = self.block_size
        groups = self.groups.groups if self.groups is not None else (KVGroup(None, ()),)
        if retention is None:
            return sum(g.blocks_needed(num_tokens, chunk, bs) for g in groups)
        cap = min_blocks(retention, bs, chunk)
        total = 0
        for g in groups:
            held = -(-num_tokens // bs)
            if g.window is not None:
                pinned = retention.pinned_blocks(g.window, bs)
                if pinned is not None:
                    held = min(held, g.blocks_needed(num_tokens, chunk, bs) + pinned)
            total += held if cap is None else min(held, cap)
        return total

    def _ensure_groups(self, seq: Sequence) -> None:
        """Give a sequence without blocks one (empty) table per group."""
        g = len(self.windows)
        if len(seq.block_tables) != g:
            seq.block_tables = [[] for _ in range(g)]
            seq.group_hashes = [[] for _ in range(g)]
            seq.group_links = [[] for _ in range(g)]

    def _register(self, seq: Sequence) -> None:
        for g, p in enumerate(self.prefixes):
            if isinstance(p, WindowPrefixIndex):
                p.register_full_blocks(seq, g, self.null_block)  # type: ignore[arg-type]
            else:
                p.register_full_blocks(seq, g)

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
        positional = -(-(end - seq.num_evicted_tokens) // bs)  # table entries after this allocation
        hits = None
        if not seq.block_table and num_new_tokens > 0:
            # Leave at least one token to compute: the model needs its logits.
            hits = self._match(seq.token_ids, (end - 1) // bs)
        null = self.null_block
        # The cache index of the next query: the tables (and a window layer's mask) count cached tokens, so
        # tokens a request's retention evicted are not in the distance.
        next_query = max(seq.num_computed_tokens, len(hits[0].ids) * bs if hits else 0) - seq.num_evicted_tokens
        releases: list[list[int]] = []
        new: list[int] = []
        cows: list[bool] = []
        total = 0
        for g, window in enumerate(self.windows):
            table = hits[g].ids if hits else (seq.block_tables[g] if g < len(seq.block_tables) else [])
            first = first_needed_block(window, next_query, bs)
            pinned = 0 if window is None or seq.retention is None else seq.retention.pinned_blocks(window, bs)
            releases.append([] if pinned is None else
                            [i for i in range(pinned, min(first, len(table))) if table[i] != null])
            cow = False
            if seq.num_kv_tokens % bs and num_new_tokens > 0:
                last = self.pool.block(table[-1])
                cow = last.ref_count > 1 or last.block_hash is not None
            cows.append(cow)
            new.append(positional - len(table))
            released = sum(1 for b in table if b == null) + len(releases[-1]) if window is not None else 0
            total += positional - released  # what the table holds after this allocation
        if check_fits and total > self.pool.capacity:
            raise NeverFits(f"sequence {seq.seq_id} needs {total} blocks of {bs} tokens "
                            f"for {end} tokens; the pool only has {self.pool.capacity}")
        hit_ids = [b for m in hits for b in m.ids if b != null] if hits else []
        pulled = sum(1 for b in hit_ids if self.pool.ref_count(b) == 0)
        freed = sum(1 for g, rel in enumerate(releases) for i in rel
                    if self.pool.ref_count(seq.block_tables[g][i]) == 1)
        return _Plan(hits, releases, new, cows, sum(new) + sum(cows), self.pool.num_available - pulled + freed)

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
        hits = plan.hits
        if seq.status is SequenceStatus.WAITING and not seq.block_table:
            self.num_lookup_tokens += num_new_tokens
            self.num_hit_tokens += (len(hits[0].ids) if hits else 0) * self.block_size
        self._ensure_groups(seq)
        ops: list[CopyOp] = []
        if hits and hits[0].ids:
            self.pool.touch([b for m in hits for b in m.ids if b != self.null_block])
            seq.block_tables = [list(m.ids) for m in hits]
            seq.group_hashes = [list(m.hashes) for m in hits]
            seq.group_links = [list(m.links) for m in hits]
            seq.num_computed_tokens = len(hits[0].ids) * self.block_size
        for g, rel in enumerate(plan.releases):  # oldest first: evicted first among the cached blocks
            table = seq.block_tables[g]
            self.pool.free_blocks([table[i] for i in rel])
            for i in rel:
                table[i] = self.null_block  # type: ignore[call-overload]
        for g, table in enumerate(seq.block_tables):
            if plan.cows[g]:
                src = table[-1]
                dst = self.pool.get_new_blocks(1)[0]
                self.pool.free_blocks([src])
                table[-1] = dst
                ops.append(CopyOp(src, dst))
            table.extend(self.pool.get_new_blocks(plan.num_new_blocks[g]))
        seq.num_kv_tokens += num_new_tokens
        seq.status = SequenceStatus.RUNNING
        self.live[seq.seq_id] = seq
        if register:
            self._register(seq)
        return ops

    def register_blocks(self, seq: Sequence) -> None:
        """Make the full blocks allocate_slots(register=False) left unfindable findable (prefix cache)."""
        self._check_active(seq, "register blocks of")
        self._register(seq)

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
        self.pool.touch(self.held_blocks(seq))
        child.num_kv_tokens = seq.num_kv_tokens
        child.num_computed_tokens = seq.num_computed_tokens
        child.block_tables = [list(t) for t in seq.block_tables]
        child.group_hashes = [list(h) for h in seq.group_hashes]
        child.group_links = [list(links) for links in seq.group_links]
        child.num_evicted_tokens = seq.num_evicted_tokens
        child.block_scores = dict(seq.block_scores)
        child.retention = seq.retention
        child.status = seq.status
        if child.block_table:
            self.live[child.seq_id] = child
        return child

    def free(self, seq: Sequence) -> None:
        """Release every block of `seq`, group by group, each tail first, and mark it finished."""
        if seq.status is SequenceStatus.FINISHED:
            raise DoubleFree(f"sequence {seq.seq_id} was already freed")
        pool = self.cpu_pool if seq.status is SequenceStatus.SWAPPED else self.pool
        for table in seq.block_tables:
            if table:
                pool.free_blocks([b for b in reversed(table) if b != self.null_block])  # type: ignore[union-attr]
        seq.block_tables = [[] for _ in seq.block_tables]
        seq.group_hashes = [[] for _ in seq.block_tables]
        seq.group_links = [[] for _ in seq.block_tables]
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
        computed = min(seq.num_computed_tokens, kv)
        for window, table in zip(self.windows, seq.block_tables):
            first = first_needed_block(window, computed, bs)
            if any(b == self.null_block for b in table[first:keep]):
                raise ValueError(f"cannot truncate sequence {seq.seq_id} to {num_tokens} tokens: its window "
                                 f"layers released the keys those tokens see; recompute it from its token ids")
        for table, hashes, links in zip(seq.block_tables, seq.group_hashes, seq.group_links):
            self.pool.free_blocks([b for b in reversed(table[keep:]) if b != self.null_block])
            del table[keep:]
            del hashes[kv // bs:]
            del links[kv // bs:]
        del seq.token_ids[num_tokens:]
        seq.num_kv_tokens = kv
        seq.num_computed_tokens = min(seq.num_computed_tokens, kv)
        if not seq.block_table:
            seq.status = SequenceStatus.WAITING
            self.live.pop(seq.seq_id, None)

    # -- eviction -------------------------------------------------------------
    def evict_blocks(self, seq: Sequence, table_indices: list[int],
                     shift_positions: bool = False) -> tuple[list[CopyOp], list[ShiftOp]]:
        """Give the listed full, computed blocks of `seq` (block-table indices) back to the pool now, in every
        KV group: the tables are positional in the one cache index space, so index i leaves each of them (a
        window group's entry there may be the null block already: nothing to free).

        The block tables shrink and seq.num_evicted_tokens grows. With shift_positions, the blocks after
        an evicted one move down in the cache: returns their key re-rotations (ShiftOp, per group) plus the
        copies to run first for a block shared with another sequence (its copy is rotated, the other
        sequence keeps the original). Raises ValueError / OutOfBlocks with the state unchanged.
        """
        self._check_active(seq, "evict blocks of")
        bs, null = self.block_size, self.null_block
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
        # (group, table index) of every block that moves down: a released window entry holds no keys
        moved = [(g, k, delta) for g, table in enumerate(seq.block_tables) for k, delta in shifted if table[k] != null]
        shared = {(g, k) for g, k, _ in moved if self.pool.ref_count(seq.block_tables[g][k]) > 1}
        evicted = [[t[i] for i in idx if t[i] != null] for t in seq.block_tables]  # per group
        freed = sum(1 for blocks in evicted for b in blocks if self.pool.ref_count(b) == 1)
        if len(shared) > self.pool.num_available + freed:
            raise OutOfBlocks(f"re-rotating sequence {seq.seq_id} needs {len(shared)} copies of shared "
                              f"blocks, {self.pool.num_available + freed} free")
        for blocks in evicted:
            self.pool.free_blocks(reversed(blocks))
        copies: list[CopyOp] = []
        shifts: list[ShiftOp] = []
        for g, k, delta in moved:
            table = seq.block_tables[g]
            block = table[k]
            if (g, k) in shared:
                new = self.pool.get_new_blocks(1)[0]
                self.pool.free_blocks([block])
                copies.append(CopyOp(block, new))
                if g == 0:  # importance scores are kept by group 0's block ids (add_attention_mass)
                    seq.block_scores[new] = seq.block_scores.pop(block, 0.0)
                table[k] = block = new
            else:
                self.pool.unregister(block)  # its keys change: no longer that prefix's K/V
            shifts.append(ShiftOp(block, delta, g))
        for block in evicted[0]:
            seq.block_scores.pop(block, None)
        seq.block_tables = [[b for i, b in enumerate(t) if i not in gone] for t in seq.block_tables]
        seq.num_evicted_tokens += bs * len(idx)
        return copies, shifts

    def entries_freeing(self, seq: Sequence, table_indices: list[int], num_blocks: int) -> list[int]:
        """The shortest head of `table_indices` whose entries hold `num_blocks` blocks in all of `seq`'s KV groups
        together (a window group's released entry holds none; all of them when they hold fewer): what evicting
        must take to free that many."""
        held = 0
        for n, i in enumerate(table_indices):
            if held >= num_blocks:
                return list(table_indices[:n])
            held += sum(1 for t in seq.block_tables if t[i] != self.null_block)
        return list(table_indices)

    # -- preemption -----------------------------------------------------------
    def swap_out(self, seq: Sequence) -> list[CopyOp]:
        """Move `seq`'s KV to the CPU pool. Returns (gpu_block, cpu_block) copies the backend
        must run before the freed GPU blocks are reused."""
        self._check_status(seq, SequenceStatus.RUNNING, "swap out")
        cpu = self._require_cpu_pool()
        held = self.held_blocks(seq)
        n = len(held)
        if n > cpu.capacity:
            raise NeverFits(f"sequence {seq.seq_id} has {n} blocks; the CPU pool only has "
                            f"{cpu.capacity}")
        cpu_ids = cpu.get_new_blocks(n)
        plan = [CopyOp(g, c) for g, c in zip(held, cpu_ids)]
        for table in seq.block_tables:
            self.pool.free_blocks([b for b in reversed(table) if b != self.null_block])
        seq.block_tables = self._mapped(seq.block_tables, dict(zip(held, cpu_ids)))
        if not seq.num_evicted_tokens:  # after an eviction the K/V is not that prefix's: never a hit
            self.cpu.register_swapped(seq.token_ids, seq.num_computed_tokens // self.block_size,  # type: ignore
                                      seq.block_tables, self.null_block)
        seq.group_links = [[] for _ in seq.block_tables]
        seq.status = SequenceStatus.SWAPPED
        return plan

    def swap_in(self, seq: Sequence) -> list[CopyOp]:
        """Bring a swapped sequence back. Blocks still in the GPU prefix cache are shared
        instead of copied; returns (cpu_block, gpu_block) copies for the rest."""
        self._check_status(seq, SequenceStatus.SWAPPED, "swap in")
        self._require_cpu_pool()
        cpu_ids = self.held_blocks(seq)
        n = len(cpu_ids)
        # A one-group sequence shares the blocks the GPU prefix cache still holds; a hybrid one copies all back.
        hit_ids, hit_hashes, hit_links = ([], [], []) if self.is_hybrid else self.prefix.match(
            seq.token_ids, 0 if seq.num_evicted_tokens else seq.num_kv_tokens // self.block_size)
        pulled = sum(1 for b in hit_ids if self.pool.ref_count(b) == 0)
        need = n - len(hit_ids)
        if need > self.pool.num_available - pulled:
            raise OutOfBlocks(f"swap-in of sequence {seq.seq_id} needs {need} GPU blocks, "
                              f"{self.pool.num_available - pulled} free or cached")
        self.pool.touch(hit_ids)
        new_ids = self.pool.get_new_blocks(need)
        plan = [CopyOp(c, g) for c, g in zip(cpu_ids[len(hit_ids):], new_ids)]
        self.cpu.release_reads(list(reversed(cpu_ids)))  # type: ignore[union-attr]
        seq.block_tables = self._mapped(seq.block_tables, dict(zip(cpu_ids, hit_ids + new_ids)))
        if self.is_hybrid:
            seq.group_hashes = [[] for _ in seq.block_tables]  # registered again below, with the new blocks
        elif not seq.num_evicted_tokens:
            seq.block_hashes = hit_hashes
            seq.block_links = hit_links
        seq.status = SequenceStatus.RUNNING
        self._register(seq)
        return plan

    def _mapped(self, tables: list[list[int]], where: dict[int, int]) -> list[list[int]]:
        """Tables with every held block replaced by where[block] (a swap), null entries kept."""
        null = self.null_block
        return [[b if b == null else where[b] for b in table] for table in tables]

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
