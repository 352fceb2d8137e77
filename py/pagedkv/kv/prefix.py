"""Prefix matching: chained block hashes and the verified lookup of a cached prefix.

Two chains, for two jobs:

- The GPU prefix cache chains a cheap hash, (parent hash, token ids, namespace) -> Python's tuple hash, and
  verifies every hit through the block it names: its stored token ids, its namespace and its parent link
  (block id, epoch) must equal the query's, so even a colliding hash cannot hand out KV computed for other
  tokens. The hash -> block map itself belongs to the pool (block_pool.py); PrefixIndex reads and registers
  through it.
- The CPU and disk tiers outlive the GPU's parent links, so they key blocks by a collision-resistant digest
  of the whole prefix: `chain_step` (sha256), seeded with the namespace (CPU tier) or the disk key (disk tier).
"""
from __future__ import annotations

import hashlib
from typing import Callable, Hashable, NamedTuple

import numpy as np

from ..sequence import Sequence
from .block_pool import BlockPool

__all__ = ["HashFn", "default_block_hash", "PrefixMatch", "PrefixIndex", "WindowPrefixIndex", "chain_step",
           "namespace_seed", "chain_digests"]

HashFn = Callable[[Hashable, tuple[int, ...], str | None], Hashable]


def default_block_hash(parent: Hashable, token_ids: tuple[int, ...], namespace: str | None) -> Hashable:
    """Chained block hash of (parent hash or None, token ids, namespace).

    Python's built-in tuple hash is enough: a hash only picks the candidate
    block; the hit is then verified exactly (tokens, namespace, parent block),
    so a collision costs a cache miss, never wrong KV. It is ~10x cheaper
    than sha256 here and identical under Pyodide (where it is 32-bit).
    """
    return hash((parent, token_ids, namespace))


class PrefixMatch(NamedTuple):
    """The verified cached blocks of a prefix, in order: their ids, hashes and (id, epoch) links."""
    ids: list[int]
    hashes: list[Hashable]
    links: list[tuple[int, int]]


class PrefixIndex:
    """Lookup and registration of full blocks in one pool's hash map, for one namespace."""

    def __init__(self, pool: BlockPool, block_size: int, namespace: str | None, hash_fn: HashFn,
                 enabled: bool) -> None:
        self.pool = pool
        self.block_size = block_size
        self.namespace = namespace
        self.hash_fn = hash_fn
        self.enabled = enabled

    def match(self, token_ids, max_blocks: int) -> PrefixMatch:
        """The longest verified cached prefix of `token_ids`, at most `max_blocks` blocks. No ref count changes."""
        found = PrefixMatch([], [], [])
        if not self.enabled:
            return found
        bs = self.block_size
        parent_hash: Hashable = None
        parent_link: tuple[int, int] | None = None
        for i in range(max_blocks):
            chunk = tuple(token_ids[i * bs:(i + 1) * bs])
            h = self.hash_fn(parent_hash, chunk, self.namespace)
            block = self.pool.cached_block(h)
            if (block is None or block.token_ids != chunk or block.parent != parent_link
                    or block.salt != self.namespace):
                break
            parent_hash, parent_link = h, (block.block_id, block.epoch)
            found.ids.append(block.block_id)
            found.hashes.append(h)
            found.links.append(parent_link)
        return found

    def adopt(self, token_ids, start: int, num_blocks: int) -> list[int]:
        """Register up to `num_blocks` fresh blocks as the cached blocks start, start+1, ... of `token_ids`,
        whose verified cached prefix must be exactly `start` blocks (else none). They stay cached (ref 0) for
        the caller to fill before the next forward; fewer when the pool runs out or a hash is taken. Returns
        their ids in order."""
        bs = self.block_size
        hit = self.match(token_ids, len(token_ids) // bs)
        if len(hit.ids) != start or not self.enabled:
            return []
        self.pool.touch(hit.ids)  # the fresh blocks must not evict the prefix they extend
        parent_hash, parent_link = (hit.hashes[-1], hit.links[-1]) if hit.ids else (None, None)
        new: list[int] = []
        for i in range(start, min(start + num_blocks, len(token_ids) // bs)):
            chunk = tuple(token_ids[i * bs:(i + 1) * bs])
            h = self.hash_fn(parent_hash, chunk, self.namespace)
            if self.pool.num_available == 0 or self.pool.cached_block(h) is not None:
                break
            new.append(self.pool.get_new_blocks(1)[0])
            parent_hash, parent_link = h, self.pool.register(new[-1], h, chunk, parent_link, self.namespace)
        self.pool.free_blocks(reversed(hit.ids + new))
        return new

    def register_full_blocks(self, seq: Sequence, group: int = 0) -> None:
        """Make the full blocks of `seq`'s table of KV group `group` past those it hashed already findable
        (they are written by the forward of the step that allocated them, before any later step reads them)."""
        # After an eviction, later K/V was computed without the dropped tokens: it is not the K/V of
        # that prefix under full attention, so it must never be served as a prefix-cache hit.
        if not self.enabled or seq.num_evicted_tokens:
            return
        bs = self.block_size
        hashes, links, table = seq.group_hashes[group], seq.group_links[group], seq.block_tables[group]
        for i in range(len(hashes), seq.num_kv_tokens // bs):
            chunk = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            parent_hash = hashes[i - 1] if i else None
            parent_link = links[i - 1] if i else None
            h = self.hash_fn(parent_hash, chunk, self.namespace)
            link = None
            if i == 0 or parent_link is not None:
                existing = self.pool.cached_block(h)
                if existing is None:
                    link = self.pool.register(table[i], h, chunk, parent_link, self.namespace)
                elif (existing.token_ids == chunk and existing.parent == parent_link
                      and existing.salt == self.namespace):
                    link = (existing.block_id, existing.epoch)  # same prefix cached elsewhere
                # else: a colliding hash owns the slot; this block stays unaddressable.
            hashes.append(h)
            links.append(link)


class WindowPrefixIndex:
    """The prefix cache of one sliding-window KV group (kv/groups.py): a hit of h blocks needs only the blocks
    a query at position h*B still sees, the last ceil((W - 1) / B) before it (vLLM's sliding-window
    find_longest_cache_hit); the blocks before them may have left the cache long ago.

    So a block cannot be verified through its parent's (block id, epoch) link as PrefixIndex does (the parent
    is gone): it is keyed by the collision-resistant digest of its whole prefix instead (chain_step, seeded with
    the group's namespace), and a hit is verified by its token ids, its namespace and its parent's digest.
    A sequence keeps the digests of all its blocks (group_hashes), released ones too, to go on chaining.
    """

    def __init__(self, pool: BlockPool, block_size: int, namespace: str, window: int, enabled: bool) -> None:
        self.pool = pool
        self.block_size = block_size
        self.namespace = namespace
        self.enabled = enabled
        self.num_tail_blocks = -(-(window - 1) // block_size)  # blocks a hit must hold before its end

    def digests(self, token_ids, num_blocks: int, known: list | None = None) -> list[bytes]:
        """Digests of the first `num_blocks` full blocks of `token_ids` (reusing the `known` leading ones)."""
        return chain_digests(token_ids, num_blocks, self.block_size, self.namespace, known or [])

    def cached(self, token_ids, i: int, digests: list[bytes]) -> int | None:
        """The verified cached block holding full block i of `token_ids`, or None."""
        block = self.pool.cached_block(digests[i])
        bs = self.block_size
        if (block is None or block.salt != self.namespace or block.parent != (digests[i - 1] if i else None)
                or block.token_ids != tuple(token_ids[i * bs:(i + 1) * bs])):
            return None
        return block.block_id

    def hit_blocks(self, token_ids, max_blocks: int, digests: list[bytes]) -> int:
        """The longest h <= max_blocks whose blocks h - num_tail_blocks .. h - 1 (from 0) are all cached."""
        if not self.enabled or max_blocks == 0:
            return 0
        need = self.num_tail_blocks
        if need == 0:
            return max_blocks
        run = 0
        for i in range(max_blocks - 1, -1, -1):  # from the right: the first long enough run is the longest hit
            if self.cached(token_ids, i, digests) is None:
                run = 0
                continue
            run += 1
            if run == need:
                return i + need
        return run  # blocks 0 .. run - 1: a hit shorter than the window

    def register_full_blocks(self, seq: Sequence, group: int, null_block: int) -> None:
        """Make the full blocks of `seq`'s table of `group` past those it hashed already findable (entries
        already released, the null block, are only hashed)."""
        if not self.enabled or seq.num_evicted_tokens:
            return
        bs = self.block_size
        hashes, table = seq.group_hashes[group], seq.block_tables[group]
        n = seq.num_kv_tokens // bs
        start = len(hashes)
        hashes[:] = self.digests(seq.token_ids, n, hashes)
        for i in range(start, n):
            if table[i] == null_block or self.pool.cached_block(hashes[i]) is not None:
                continue  # released already, or the same prefix is cached in another block
            self.pool.register(table[i], hashes[i], tuple(seq.token_ids[i * bs:(i + 1) * bs]),
                               hashes[i - 1] if i else None, self.namespace)


def chain_step(parent: bytes, block_token_ids) -> bytes:
    """The chain digest (16 bytes) of a block whose prefix's digest is `parent`: covers every token before it
    too. The disk tier's file names and the CPU tier's keys are this chain, from different seeds."""
    return hashlib.sha256(parent + np.asarray(block_token_ids, dtype="<i4").tobytes()).digest()[:16]


def namespace_seed(namespace: str | None) -> bytes:
    """The chain's seed for a namespace (the CPU tier's; the disk tier seeds with its DiskKey)."""
    return hashlib.sha256(repr(namespace).encode()).digest()[:16]


def chain_digests(token_ids, num_blocks: int, block_size: int, namespace: str | None,
                  known: list[bytes] = ()) -> list[bytes]:  # type: ignore[assignment]
    """Digests (16 bytes) of the first `num_blocks` full blocks; block i's covers blocks 0..i and the namespace.
    known: digests of the leading blocks computed before (kept, not computed again)."""
    out = list(known[:num_blocks])
    parent = out[-1] if out else namespace_seed(namespace)
    for i in range(len(out), num_blocks):
        parent = chain_step(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out
