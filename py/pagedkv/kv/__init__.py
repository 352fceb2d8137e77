"""The KV memory hierarchy of one engine, one module a concept (docs/architecture.md, "KV package").

    spec.py        KVSpec: one model's KV geometry and dtype (bytes per token / per block)
    dtypes.py      the KV element types (f32, f16, int8, fp8, int4) and their numpy twins
    block_pool.py  the only owner of physical blocks: free ring, ref counts, hash -> block map
    prefix.py      chain hashes and verified prefix lookup over a pool's hash map
    manager.py     per-sequence allocation: slots, copy-on-write, fork, free, swap, eviction
    cpu_tier.py    the CPU (swap) pool as a prefix cache: what to demote, what a promotion reads
    disk_tier.py   block files on disk (DiskKey, DiskTier) over a file_store.py FileStore
    disk_cache.py  the disk tier's side of a step: what to load and store (plans)
    tiers.py       GPU <- CPU <- disk restores before a step, one request at a time (plans)
    moves.py       BlockMoves, BlockWrite, BlockRead: the plans; the engine's block_mover.py runs them
    retention.py   sliding window, attention sinks, H2O: which blocks a request may drop
    accounting.py  block-level statistics and SharedKVBudget (several models on one byte pool)
    contiguous.py  the static-reservation baseline, same interface, for side-by-side measurement

The package imports nothing on its own, so importing one module costs only what it needs.
"""
