"""Token state of one sequence (one request / one turn of a conversation)."""

from __future__ import annotations

import enum
import itertools
from typing import Hashable

_next_seq_id = itertools.count()


def check_token_ids(token_ids) -> None:
    """Raise ValueError unless every id is a non-negative int (bools rejected)."""
    # map/min run in C: a per-token Python loop would dominate allocation cost.
    if token_ids and (not set(map(type, token_ids)) <= {int} or min(token_ids) < 0):
        bad = next(t for t in token_ids if type(t) is not int or t < 0)
        raise ValueError(f"token ids must be non-negative ints, got {bad!r}")


def append_then_allocate(seq: "Sequence", token_ids: list[int], allocate_slots):
    """Append token ids to `seq` and give them slots with allocate_slots(seq, n); on any error the ids
    are taken back, so a refused append leaves the sequence as it was. Shared by both allocators."""
    check_token_ids(token_ids)
    seq.token_ids.extend(token_ids)
    try:
        return allocate_slots(seq, len(token_ids))
    except Exception:
        del seq.token_ids[len(seq.token_ids) - len(token_ids):]
        raise


class SequenceStatus(enum.Enum):
    WAITING = "waiting"      # not yet given KV slots
    RUNNING = "running"      # holds GPU blocks
    SWAPPED = "swapped"      # its KV lives in CPU blocks
    FINISHED = "finished"    # freed; must not be touched again


class Sequence:
    """Token ids plus the KV bookkeeping the cache manager keeps for them.

    num_kv_tokens: tokens that have a KV slot (prefix of token_ids).
    num_computed_tokens: tokens whose KV has been written (<= num_kv_tokens).
    block_tables: one block table per KV group (kv/groups.py), positional: entry i holds tokens
        [i*B, (i+1)*B) for that group's layers; a window group's entries that left its window hold the
        manager's null block. block_table is group 0's (full attention: the whole context).
    group_hashes / group_links: per group, per full block, its chained hash and the
        (id, epoch) of the verified cached block holding the same prefix
        (None when that prefix is not registered); maintained by the manager.
        block_hashes / block_links are group 0's.
    session: the tenant this sequence is accounted to.
    num_evicted_tokens: tokens whose blocks a window or eviction dropped (a multiple of the block size);
        the cache holds num_kv_tokens - num_evicted_tokens of them, and a new token's cache index is
        its position in token_ids minus this.
    block_scores: accumulated attention mass per physical block id (importance eviction).
    retention: the KVRetention its request runs under (None: keeps all KV), set by the scheduler before it
        allocates: which leading entries a window group keeps (KVRetention.pinned_blocks).
    """

    def __init__(self, token_ids: list[int] | tuple[int, ...], session: str = "default",
                 seq_id: int | None = None) -> None:
        check_token_ids(token_ids)
        self.seq_id = next(_next_seq_id) if seq_id is None else seq_id
        self.session = session
        self.token_ids: list[int] = list(token_ids)
        self.num_kv_tokens = 0
        self.num_computed_tokens = 0
        self.block_tables: list[list[int]] = [[]]  # one per KV group once the manager allocates
        self.group_hashes: list[list[Hashable]] = [[]]
        self.group_links: list[list[tuple[int, int] | None]] = [[]]
        self.num_evicted_tokens = 0
        self.block_scores: dict[int, float] = {}
        self.retention = None  # KVRetention | None (kv.retention imports this module)
        self.status = SequenceStatus.WAITING

    @property
    def block_table(self) -> list[int]:
        """Group 0's block table (the only one of a model without window layers)."""
        return self.block_tables[0]

    @block_table.setter
    def block_table(self, table: list[int]) -> None:
        self.block_tables[0] = table

    @property
    def block_hashes(self) -> list[Hashable]:
        return self.group_hashes[0]

    @block_hashes.setter
    def block_hashes(self, hashes: list[Hashable]) -> None:
        self.group_hashes[0] = hashes

    @property
    def block_links(self) -> list[tuple[int, int] | None]:
        return self.group_links[0]

    @block_links.setter
    def block_links(self, links: list[tuple[int, int] | None]) -> None:
        self.group_links[0] = links

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_cached_kv_tokens(self) -> int:
        """Tokens whose K/V the cache holds now (the attention kernels' context length)."""
        return self.num_kv_tokens - self.num_evicted_tokens

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, session={self.session!r}, tokens={self.num_tokens}, "
                f"kv={self.num_kv_tokens}, blocks={self.block_table}, {self.status.value})")
