"""The CPU tier: the swap pool in host memory, and its prefix cache (GPU -> CPU -> disk).

Full blocks reach the CPU pool two ways: a swapped-out sequence's full, computed blocks are registered there
when they are copied (they stay, as cached CPU blocks, after it comes back or is freed), and a cached GPU block
that a GPU allocation evicts is demoted there. Each pool evicts its least recently used cached block first; a
block the CPU pool drops is usually on disk already (write-behind). Before a step, a waiting sequence whose
prefix misses the GPU cache past block k takes the CPU pool's blocks k, k+1, ... (`cached_blocks`): the
manager gives them fresh GPU blocks registered as cached prefix blocks and returns the copies (promotion);
the scheduler then finds them as ordinary prefix hits, and the disk tier loads only what follows them. A
promoted block keeps its CPU copy, so its next demotion copies nothing.

The tier decides what moves and hands the copies out (`take_demotions`); it never touches a backend. The
manager that holds it tells it of each GPU eviction (the GPU pool's on_evict, wired by the manager that
creates that pool) and of each swap.

The GPU prefix cache verifies a hit through its parent's (block id, epoch) link, which dies when the parent
block leaves the GPU, so the CPU pool keys its blocks by a collision-resistant digest of the whole prefix
instead (prefix.chain_step, seeded with the namespace): equal digests mean equal prefixes, whatever hash_fn
the GPU cache uses.

KV groups (groups.py): each group's blocks are keyed by the chain seeded with that group's namespace (the
manager's: the namespace for group 0, `<namespace>#g<g>` for the others), so a page of one group is never taken
for another's. A window group's GPU blocks are keyed by that same digest already (prefix.WindowPrefixIndex); a
full group's digest comes through its parent links as above. Which blocks a promotion brings is the manager's
rule for groups (KVCacheManager.tier_hit): every full group's blocks up to the hit, each window group's window.
"""
from __future__ import annotations

from .block_pool import BlockPool, BlockState, CopyOp
from .prefix import chain_digests, chain_step, namespace_seed

__all__ = ["CpuTier"]


class CpuTier:
    """The CPU pool of one manager; with `caching` (prefix caching on), swapped-out blocks are found by content
    there, and with `demotes` as well, evicted GPU blocks are kept there (see the module docstring).

    Demotion: a cached GPU block that a GPU allocation evicts goes to the CPU pool (registered there, taking
    its least recently used block) unless the CPU pool holds that prefix already or has no block to give.
    The (gpu, cpu) copies wait in `take_demotions()`, which runs after each allocating phase; the engine runs
    them before anything writes the evicted GPU blocks. The CPU blocks a swap-in reads stay held until then.
    """

    def __init__(self, num_blocks: int, block_size: int, namespace: str | None, gpu_pool: BlockPool,
                 caching: bool, demotes: bool, groups: tuple[tuple[str | None, int | None], ...] | None = None) -> None:
        """groups: (namespace, window) of each KV group, as the manager's prefix indexes have them; None: one
        full-attention group in `namespace`."""
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.namespace = namespace
        self.groups = groups if groups is not None else ((namespace, None),)
        self._group_of = {ns: g for g, (ns, _) in enumerate(self.groups)}  # a GPU block's salt -> its group
        self.gpu_pool = gpu_pool  # read only: the parent links of an evicted block lead through it
        self.caching = caching
        self.demotes = caching and demotes
        self._demotions: list[tuple[CopyOp, bytes]] = []  # (gpu, cpu) copy, the digest the CPU block is for
        self._gpu_digests: dict[tuple[int, int], bytes] = {}  # (block id, epoch) link -> digest of its prefix
        self._reads: list[int] = []  # CPU blocks a swap-in reads, freed when its copies are handed out
        self.num_demoted = 0

    # ---------------------------------------------------------------- swap

    def register_swapped(self, token_ids, num_full_blocks: int, tables: list[list[int]],
                         null_block: int | None = None) -> None:
        """Make the first `num_full_blocks` (full, computed) blocks a sequence just swapped out to the CPU blocks
        of `tables` (one per KV group; `null_block` entries left out) findable by content. A block whose prefix
        another CPU block holds already stays unaddressable."""
        if not self.caching:
            return
        bs = self.block_size
        for (ns, _), table in zip(self.groups, tables):
            for i, digest in enumerate(chain_digests(token_ids, min(num_full_blocks, len(table)), bs, ns)):
                if table[i] != null_block and self.pool.cached_block(digest) is None:
                    self.pool.register(table[i], digest, tuple(token_ids[i * bs:(i + 1) * bs]), None, ns)

    def release_reads(self, cpu_ids: list[int]) -> None:
        """A swap-in has read `cpu_ids` (given tail first): free them now, or, when demotions may take CPU
        blocks this step, once the copies are handed out (a demotion must not overwrite them first)."""
        if self.demotes:
            self._reads.extend(cpu_ids)
        else:
            self.pool.free_blocks(cpu_ids)

    # ---------------------------------------------------------------- promotion

    def cached_blocks(self, token_ids, num_blocks: int) -> list[dict[int, int]]:
        """Per KV group, {table index: CPU block} of the first `num_blocks` full blocks of `token_ids` this pool
        holds (verified by tokens and namespace)."""
        out: list[dict[int, int]] = [{} for _ in self.groups]
        if not self.caching or self.pool.num_blocks == self.pool.num_free:
            return out
        bs = self.block_size
        for found, (ns, _) in zip(out, self.groups):
            for i, digest in enumerate(chain_digests(token_ids, num_blocks, bs, ns)):
                block = self.pool.cached_block(digest)
                if block is not None and block.salt == ns and block.token_ids == tuple(token_ids[i * bs:(i + 1) * bs]):
                    found[i] = block.block_id
        return out

    # ---------------------------------------------------------------- demotion

    def demote(self, block: BlockState) -> None:
        """A GPU allocation evicts the cached GPU `block` (its content still intact): keep it on the CPU."""
        if not self.demotes or block.salt not in self._group_of:
            return
        ns, window = self.groups[self._group_of[block.salt]]
        # A window group's GPU blocks are keyed by this very digest; a full group's comes through its parents.
        digest = block.block_hash if window is not None else self.gpu_digest(block, ns)
        if digest is None:
            return
        cpu = self.pool
        held = cpu.cached_block(digest)
        if held is not None:  # the prefix is in the CPU tier already (swapped out, or promoted from there)
            if held.ref_count == 0:
                cpu.touch([held.block_id])
                cpu.free_blocks([held.block_id])
            return
        if cpu.num_available == 0:
            return
        cpu_id = cpu.get_new_blocks(1)[0]
        cpu.register(cpu_id, digest, block.token_ids, None, ns)
        cpu.free_blocks([cpu_id])
        self._demotions.append((CopyOp(block.block_id, cpu_id), digest))
        self.num_demoted += 1

    def gpu_digest(self, block: BlockState, namespace: str | None = None) -> bytes | None:
        """The chain digest of the prefix a registered GPU block of a full group (in `namespace`, default the
        tier's) ends, through its verified parent links (the digests of links seen before are remembered:
        evicting a chain tail first costs one digest per block); None when an ancestor left the GPU (its epoch
        changed)."""
        memo = self._gpu_digests
        if len(memo) > 2 * self.gpu_pool.num_blocks:  # links of blocks re-registered since never match again
            memo.clear()
        chain = [block]  # this block and its ancestors up to the first with a known digest (or the root)
        digest = namespace_seed(self.namespace if namespace is None else namespace)
        link = block.parent
        while link is not None:
            if link in memo:
                digest = memo[link]
                break
            parent = self.gpu_pool.block(link[0])
            if parent.epoch != link[1]:
                return None
            chain.append(parent)
            link = parent.parent
        for b in reversed(chain):
            digest = chain_step(digest, b.token_ids)
            memo[(b.block_id, b.epoch)] = digest
        return digest

    def take_demotions(self) -> list[CopyOp]:
        """The pending (gpu, cpu) demotion copies, to run before the GPU blocks are written; releases the CPU
        blocks swap-ins read (their copies are handed out by now)."""
        # A CPU block taken again before its copy ran (by a later demotion, a swap-out) no longer holds that
        # prefix: its copy is dropped, so it cannot overwrite what the block holds now.
        moves = [op for op, digest in self._demotions if self.pool.block(op.dst).block_hash == digest]
        self._demotions = []
        if self._reads:
            self.pool.free_blocks(self._reads)
            self._reads = []
        return moves

    @property
    def held_reads(self) -> list[int]:
        """CPU blocks swap-ins read whose copies are not handed out yet (tail first)."""
        return list(self._reads)

    # ---------------------------------------------------------------- forgetting

    def forget(self, token_ids, keep_tokens: int = 0) -> int:
        """Drop the cached blocks of `token_ids` past its first `keep_tokens` tokens (a deleted chat's
        history); blocks a swapped sequence holds stay. Returns how many."""
        bs = self.block_size
        held = [self.pool.cached_block(d) for ns, _ in self.groups
                for d in chain_digests(token_ids, len(token_ids) // bs, bs, ns)[keep_tokens // bs:]]
        return self.pool.evict_cached(b.block_id for b in held if b is not None)
