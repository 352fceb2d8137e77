"""The CPU tier of the prefix cache: full blocks in the CPU (swap) pool are found by content, GPU -> CPU -> disk.

Full blocks reach the CPU pool two ways: a swapped-out sequence's full, computed blocks are registered there
when they are copied (they stay, as cached CPU blocks, after it comes back or is freed), and a cached GPU block
that a GPU allocation evicts is demoted there (CpuTier). Each pool evicts its least recently used cached block
first; a block the CPU pool drops is usually on disk already (write-behind). Before a step, a waiting sequence
whose prefix misses the GPU cache past block k takes the CPU pool's run of blocks k, k+1, ...: they get fresh
GPU blocks registered as cached prefix blocks (KVCacheManager.adopt_blocks, as for the disk tier) and are copied
there (Backend.swap_in); the scheduler then finds them as ordinary prefix hits, and the disk tier loads only
what follows them. A promoted block keeps its CPU copy, so its next demotion copies nothing.

The GPU prefix cache verifies a hit through its parent's (block id, epoch) link, which dies when the parent
block leaves the GPU, so the CPU pool keys its blocks by a collision-resistant digest of the whole prefix
instead (the disk tier's chain hash, kv_disk.chain_step, seeded with the namespace): equal digests mean
equal prefixes, whatever hash_fn the GPU cache uses.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from .block_pool import BlockState, CopyOp
from .disk_tier import chain_step

if TYPE_CHECKING:  # the manager imports this module (swap_out registers blocks here)
    from .manager import KVCacheManager
    from ..sequence import Sequence

__all__ = ["chain_digests", "register_on_cpu", "promote_prefix", "forget_on_cpu", "CpuTier"]


def _seed(namespace: str | None) -> bytes:
    return hashlib.sha256(repr(namespace).encode()).digest()[:16]


def chain_digests(token_ids, num_blocks: int, block_size: int, namespace: str | None) -> list[bytes]:
    """Digests (16 bytes) of the first `num_blocks` full blocks; block i's covers blocks 0..i and the namespace."""
    parent = _seed(namespace)
    out = []
    for i in range(num_blocks):
        parent = chain_step(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


def register_on_cpu(kv: KVCacheManager, seq: Sequence, cpu_ids: list[int]) -> None:
    """Make the full, computed blocks `seq` just swapped out to `cpu_ids` findable in the CPU pool. A block
    whose prefix another CPU block holds already stays unaddressable (the prefix is found once)."""
    # After an eviction the K/V is not that prefix's under full attention: never served as a hit.
    if kv.cpu_pool is None or not kv.config.enable_prefix_caching or seq.num_evicted_tokens:
        return
    bs = kv.block_size
    digests = chain_digests(seq.token_ids, min(seq.num_computed_tokens // bs, len(cpu_ids)), bs, kv.namespace)
    for i, digest in enumerate(digests):
        if kv.cpu_pool.cached_block(digest) is None:
            kv.cpu_pool.register(cpu_ids[i], digest, tuple(seq.token_ids[i * bs:(i + 1) * bs]), None, kv.namespace)


def promote_prefix(kv: KVCacheManager, token_ids) -> list[CopyOp]:
    """Copy the CPU pool's run of the full blocks of `token_ids` that follow its GPU-cached prefix into fresh
    GPU blocks, registered as cached prefix blocks (ref 0). Returns the (cpu block, gpu block) copies the
    backend must run before those GPU blocks are read or reused; fewer blocks when the GPU pool runs short."""
    cpu = kv.cpu_pool
    bs = kv.block_size
    n = len(token_ids) // bs
    if cpu is None or cpu.num_blocks == cpu.num_free or not kv.config.enable_prefix_caching:
        return []
    start = kv.lookup_prefix(token_ids[:n * bs])[0] // bs
    run: list[int] = []
    for i, digest in enumerate(chain_digests(token_ids, n, bs, kv.namespace)[start:], start):
        block = cpu.cached_block(digest)
        if block is None or block.token_ids != tuple(token_ids[i * bs:(i + 1) * bs]) or block.salt != kv.namespace:
            break
        run.append(block.block_id)
    if not run:
        return []
    cpu.touch(run)  # a demotion the GPU allocation below triggers must not take the blocks being read
    gpu_ids = kv.adopt_blocks(token_ids[:(start + len(run)) * bs], start, len(run))
    cpu.free_blocks(reversed(run))  # used now: the recent end of the CPU pool's LRU, prefix last
    return [CopyOp(c, g) for c, g in zip(run, gpu_ids)]


def forget_on_cpu(kv: KVCacheManager, token_ids, keep_tokens: int = 0) -> int:
    """Drop the CPU pool's cached blocks of `token_ids` past its first `keep_tokens` tokens (a deleted chat's
    history, like KVCacheManager.evict_prefix on the GPU); blocks a swapped sequence holds stay. Returns how many."""
    cpu, bs = kv.cpu_pool, kv.block_size
    if cpu is None:
        return 0
    digests = chain_digests(token_ids, len(token_ids) // bs, bs, kv.namespace)
    held = [cpu.cached_block(d) for d in digests[keep_tokens // bs:]]
    return cpu.evict_cached(b.block_id for b in held if b is not None)


class CpuTier:
    """The engine's side of the CPU tier for one manager (see the module docstring).

    Demotion: a cached GPU block that a GPU allocation evicts goes to the CPU pool (registered there, taking
    its least recently used block) unless the CPU pool holds that prefix already or has no block to give.
    The (gpu, cpu) copies wait in `take_moves()`, which the engine calls after each allocating phase and runs
    before anything writes the evicted GPU blocks; the CPU blocks a swap_in reads stay held until then.
    """

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._checked: dict[int, int] = {}  # seq id -> token count when its prefix was last looked up
        self._demotions: list[tuple[CopyOp, bytes]] = []  # (gpu, cpu) copy, the digest the CPU block is for
        self._gpu_digests: dict[tuple[int, int], bytes] = {}  # (block id, epoch) link -> digest of its prefix
        self.last_restored_tokens = 0
        self.num_demoted = 0
        if kv.cpu_pool is not None and kv.config.enable_prefix_caching:
            kv.pool.on_evict = self._demote
            kv.cpu_reads = []

    def _demote(self, block: BlockState) -> None:
        kv, cpu = self.kv, self.kv.cpu_pool
        digest = self.gpu_digest(block) if block.salt == kv.namespace else None
        if digest is None or cpu is None:
            return
        held = cpu.cached_block(digest)
        if held is not None:  # the prefix is in the CPU tier already (swapped out, or promoted from there)
            if held.ref_count == 0:
                cpu.touch([held.block_id])
                cpu.free_blocks([held.block_id])
            return
        if cpu.num_available == 0:
            return
        cpu_id = cpu.get_new_blocks(1)[0]
        cpu.register(cpu_id, digest, block.token_ids, None, kv.namespace)
        cpu.free_blocks([cpu_id])
        self._demotions.append((CopyOp(block.block_id, cpu_id), digest))
        self.num_demoted += 1

    def gpu_digest(self, block: BlockState) -> bytes | None:
        """The chain digest of the prefix a registered GPU block ends, through its verified parent links (the
        digests of links seen before are remembered: evicting a chain tail first costs one digest per block);
        None when an ancestor left the GPU (its epoch changed)."""
        memo = self._gpu_digests
        if len(memo) > 2 * self.kv.pool.num_blocks:  # links of blocks re-registered since never match again
            memo.clear()
        chain = [block]  # this block and its ancestors up to the first with a known digest (or the root)
        digest = _seed(self.kv.namespace)
        link = block.parent
        while link is not None:
            if link in memo:
                digest = memo[link]
                break
            parent = self.kv.pool.block(link[0])
            if parent.epoch != link[1]:
                return None
            chain.append(parent)
            link = parent.parent
        for b in reversed(chain):
            digest = chain_step(digest, b.token_ids)
            memo[(b.block_id, b.epoch)] = digest
        return digest

    def take_moves(self) -> list[CopyOp]:
        """The pending (gpu, cpu) demotion copies, to run before the GPU blocks are written; releases the CPU
        blocks swap_in read (their copies are handed out by now)."""
        cpu = self.kv.cpu_pool
        # A CPU block taken again before its copy ran (by a later demotion, a swap-out) no longer holds that
        # prefix: its copy is dropped, so it cannot overwrite what the block holds now.
        moves = [op for op, digest in self._demotions if cpu.block(op.dst).block_hash == digest]
        self._demotions = []
        if self.kv.cpu_reads:
            self.kv.cpu_pool.free_blocks(self.kv.cpu_reads)
            self.kv.cpu_reads = []
        return moves

    async def flush(self, backend) -> None:
        """Run the pending demotion copies now (before a GPU block is written outside a step's schedule)."""
        moves = self.take_moves()
        if moves:
            await backend.swap_out(moves)

    async def restore(self, backend, requests) -> int:
        """Copy back from the CPU pool the prefixes of `requests` (waiting, no blocks) that the GPU cache
        lacks; returns the tokens restored."""
        kv = self.kv
        requests = list(requests)
        waiting = {req.seq.seq_id for req in requests}
        self._checked = {sid: n for sid, n in self._checked.items() if sid in waiting}
        total = 0
        for req in requests:
            seq = req.seq
            if seq.block_table or self._checked.get(seq.seq_id) == seq.num_tokens:
                continue
            self._checked[seq.seq_id] = seq.num_tokens
            usable = (seq.num_tokens - 1) // kv.block_size  # leave one token to compute: the model needs logits
            ops = promote_prefix(kv, seq.token_ids[:usable * kv.block_size])
            await self.flush(backend)  # the GPU blocks promote_prefix took may have held demoted blocks
            if ops:
                # Now, not batched: a later sequence's promotion may evict these blocks again.
                await backend.swap_in(ops)
                self.last_restored_tokens = len(ops) * kv.block_size
                total += len(ops) * kv.block_size
        return total
