"""The block pool: the only owner of physical KV blocks.

Every block is in exactly one of three states:

- used:   ref_count > 0, not in the free queue;
- cached: ref_count == 0, carries a prefix hash, in the free queue (reusable
          by a prefix hit, evicted LRU-first when a fresh block is needed);
- free:   ref_count == 0, no hash, in the free queue.

The free queue is a ring (doubly linked list) threaded through the blocks
themselves, with one sentinel node acting as both head and tail, so popping
the head, pushing at either end and unlinking a cache hit from the middle
are all O(1) and allocate no Python objects. Unhashed blocks are pushed at
the head (reused first, they hold nothing worth keeping); hashed blocks are
pushed at the tail (kept longest for prefix hits). Popping takes the head.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, NamedTuple


class OutOfBlocks(RuntimeError):
    """Not enough free or cached blocks right now; the caller may preempt and retry."""


class CopyOp(NamedTuple):
    """Copy all slots of block `src` into block `dst` (the backend executes it)."""
    src: int
    dst: int


class _Link:
    __slots__ = ("prev", "next")

    def __init__(self) -> None:
        self.prev: _Link = self
        self.next: _Link = self


class Block(_Link):
    """One physical block. Only BlockPool mutates it.

    block_hash / token_ids / parent identify the cached content when the block
    is full and registered: parent is (block_id, epoch) of the verified block
    holding the previous block's tokens, or None for the first block. epoch
    changes on every (un)registration so stale parent links never match.
    """

    __slots__ = ("block_id", "ref_count", "block_hash", "token_ids", "parent", "salt", "epoch")

    def __init__(self, block_id: int) -> None:
        super().__init__()
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: Hashable = None
        self.token_ids: tuple[int, ...] = ()
        self.parent: tuple[int, int] | None = None
        self.salt: str | None = None
        self.epoch = 0


class BlockState(NamedTuple):
    """A read-only snapshot of one block, for callers outside the pool (the manager, the dashboard)."""

    block_id: int
    ref_count: int
    block_hash: Hashable
    token_ids: tuple[int, ...]
    parent: tuple[int, int] | None
    salt: str | None
    epoch: int

    @property
    def state(self) -> str:
        """'used', 'cached' or 'free'."""
        if self.ref_count > 0:
            return "used"
        return "cached" if self.block_hash is not None else "free"


def _snapshot(block: Block) -> BlockState:
    return BlockState(block.block_id, block.ref_count, block.block_hash, block.token_ids, block.parent,
                      block.salt, block.epoch)


class BlockPool:
    """Fixed set of `num_blocks` physical blocks (equal-sized pages of KV memory).

    The pool does not know how many tokens a block holds: several managers
    (models with different bytes per token) may share one pool, each viewing a
    block as its own number of token slots.
    """

    def __init__(self, num_blocks: int, on_evict: Callable[[BlockState], None] | None = None) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._ring = _Link()
        self._num_in_queue = 0
        self._num_cached = 0
        self._hash_to_block: dict[Hashable, Block] = {}
        # Called with each cached block get_new_blocks evicts, before its content is dropped: set once by the
        # pool's owner (the manager, for its CPU tier's demotions), never patched in later.
        self._on_evict = on_evict
        self._reserved: set[int] = set()  # blocks held outside any sequence (the pages of a model's weights)
        for block in self._blocks:
            self._push_tail(block)

    # -- free queue ring ---------------------------------------------------
    def _push_tail(self, block: Block) -> None:
        last = self._ring.prev
        block.prev, block.next = last, self._ring
        last.next = block
        self._ring.prev = block
        self._num_in_queue += 1

    def _push_head(self, block: Block) -> None:
        first = self._ring.next
        block.prev, block.next = self._ring, first
        first.prev = block
        self._ring.next = block
        self._num_in_queue += 1

    def _unlink(self, block: Block) -> None:
        block.prev.next = block.next
        block.next.prev = block.prev
        block.prev = block.next = block
        self._num_in_queue -= 1

    def free_queue_ids(self) -> list[int]:
        """Block ids in the free queue, head (next to be handed out) first."""
        ids = []
        node = self._ring.next
        while node is not self._ring:
            ids.append(node.block_id)  # type: ignore[attr-defined]
            node = node.next
        return ids

    # -- counts ------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks with ref 0 and no cached content."""
        return self._num_in_queue - self._num_cached

    @property
    def num_cached(self) -> int:
        """Blocks with ref 0 that still hold a registered prefix (evictable)."""
        return self._num_cached

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self._num_in_queue

    @property
    def num_available(self) -> int:
        """Blocks get_new_blocks may hand out (free + evictable cached)."""
        return self._num_in_queue

    @property
    def num_reserved(self) -> int:
        """Blocks reserve() holds (no sequence can have them)."""
        return len(self._reserved)

    @property
    def capacity(self) -> int:
        """Blocks sequences may ever hold: all but the reserved ones."""
        return self.num_blocks - len(self._reserved)

    def is_reserved(self, block_id: int) -> bool:
        return block_id in self._reserved

    def ref_count(self, block_id: int) -> int:
        """Number of sequences holding `block_id`."""
        return self._blocks[block_id].ref_count

    # -- allocation --------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[int]:
        """Hand out `n` blocks with ref 1, evicting cached ones from the head if needed."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > self._num_in_queue:
            raise OutOfBlocks(f"need {n} blocks, only {self._num_in_queue} free or cached "
                              f"of {self.num_blocks}")
        ids = []
        for _ in range(n):
            block = self._ring.next
            assert isinstance(block, Block)
            self._unlink(block)
            if block.block_hash is not None:
                self._num_cached -= 1
                if self._on_evict is not None:
                    self._on_evict(_snapshot(block))
                self._drop_hash(block)
            block.ref_count = 1
            ids.append(block.block_id)
        return ids

    def reserve(self, n: int) -> list[int]:
        """Take `n` blocks out of circulation (a model's weights loaded into the pages of a shared budget),
        evicting cached ones as an allocation does; OutOfBlocks when fewer are free or cached."""
        ids = self.get_new_blocks(n)
        self._reserved.update(ids)
        return ids

    def reserve_top(self, n: int) -> list[int]:
        """Reserve the `n` highest block ids, all free (pages with no memory behind them: only weights take
        them, see LLMEngine's backed_pages)."""
        return self.reserve_ids(range(self.num_blocks - n, self.num_blocks))

    def reserve_ids(self, block_ids: Iterable[int]) -> list[int]:
        """Reserve these blocks, all free (their cached content evicted first by the caller); ValueError
        otherwise."""
        ids = list(block_ids)
        blocks = [self._blocks[b] for b in ids]
        if any(b.ref_count or b.block_hash is not None for b in blocks):
            raise ValueError(f"blocks {ids[0]}..{ids[-1]} are not all free")
        for block in blocks:
            self._unlink(block)
            block.ref_count = 1
        self._reserved.update(ids)
        return ids

    def release(self, block_ids: Iterable[int]) -> None:
        """Give reserved blocks back to the free queue (the model was unloaded)."""
        ids = list(block_ids)
        missing = [b for b in ids if b not in self._reserved]
        if missing:
            raise ValueError(f"blocks {missing} are not reserved")
        self._reserved.difference_update(ids)
        self.free_blocks(ids)

    def evict_salted(self, salt: str | None) -> int:
        """Drop the cached content of every free block registered under `salt` (the namespace of a model
        that left the pool); returns how many."""
        return self.evict_cached([b.block_id for b in self._blocks if b.block_hash is not None
                                  and b.ref_count == 0 and b.salt == salt])

    def touch(self, block_ids: Iterable[int]) -> None:
        """Add one reference to each block; a cached block leaves the free queue (a hit)."""
        for bid in block_ids:
            block = self._blocks[bid]
            if block.ref_count == 0:
                self._unlink(block)
                if block.block_hash is not None:
                    self._num_cached -= 1
            block.ref_count += 1

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in the given order (pass a sequence's
        blocks reversed so its tail is evicted before its prefix)."""
        blocks = [self._blocks[bid] for bid in block_ids]
        drops: dict[int, int] = {}
        for block in blocks:
            drops[block.block_id] = drops.get(block.block_id, 0) + 1
            if drops[block.block_id] > block.ref_count:
                raise ValueError(f"block {block.block_id} freed more often than referenced")
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is not None:
                    self._push_tail(block)
                    self._num_cached += 1
                else:
                    self._push_head(block)

    # -- prefix hash map ---------------------------------------------------
    def cached_block(self, block_hash: Hashable) -> BlockState | None:
        """The block registered under `block_hash`, if any (caller verifies content)."""
        block = self._hash_to_block.get(block_hash)
        return None if block is None else _snapshot(block)

    def register(self, block_id: int, block_hash: Hashable, token_ids: tuple[int, ...],
                 parent: tuple[int, int] | None, salt: str | None) -> tuple[int, int]:
        """Make a full, used block addressable by `block_hash`; returns its (id, epoch) link."""
        block = self._blocks[block_id]
        if block.ref_count == 0:
            raise ValueError(f"block {block_id} is not in use; only used blocks are registered")
        if block.block_hash is not None or block_hash in self._hash_to_block:
            raise ValueError(f"block {block_id} or hash already registered")
        if not token_ids:
            raise ValueError("a registered block must hold its token ids")
        block.block_hash = block_hash
        block.token_ids = token_ids
        block.parent = parent
        block.salt = salt
        block.epoch += 1
        self._hash_to_block[block_hash] = block
        return (block_id, block.epoch)

    def unregister(self, block_id: int) -> None:
        """Forget a used block's cached content (it is about to be overwritten)."""
        block = self._blocks[block_id]
        if block.ref_count == 0:
            raise ValueError(f"block {block_id} is not in use")
        if block.block_hash is not None:
            self._drop_hash(block)

    def evict_cached(self, block_ids: Iterable[int]) -> int:
        """Drop the cached content of free (ref 0) blocks so they become plain free blocks, reused first
        (e.g. the history of a deleted conversation). Used blocks are left alone. Returns how many."""
        n = 0
        for block_id in block_ids:
            block = self._blocks[block_id]
            if block.ref_count == 0 and block.block_hash is not None:
                self._unlink(block)
                self._drop_hash(block)
                self._num_cached -= 1
                self._push_head(block)
                n += 1
        return n

    def _drop_hash(self, block: Block) -> None:
        del self._hash_to_block[block.block_hash]  # type: ignore[arg-type]
        block.block_hash = None
        block.token_ids = ()
        block.parent = None
        block.salt = None
        block.epoch += 1

    def link(self, block_id: int) -> tuple[int, int]:
        """(id, epoch) of a block: how a child block names its verified parent."""
        block = self._blocks[block_id]
        return (block_id, block.epoch)

    def block(self, block_id: int) -> BlockState:
        """A snapshot of block `block_id`."""
        return _snapshot(self._blocks[block_id])

    def block_states(self) -> list[BlockState]:
        """A snapshot of every block, in block id order."""
        return [_snapshot(block) for block in self._blocks]

    def state_of(self, block_id: int) -> str:
        """'used', 'cached' or 'free' (for checks and debugging)."""
        return self.block(block_id).state
