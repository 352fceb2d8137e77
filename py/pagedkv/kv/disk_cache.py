"""The engine's side of the disk tier: restore prefixes from disk before a step, write full blocks behind it.

Restore: a waiting sequence without blocks whose prefix misses the GPU prefix cache past block k loads the
blocks k, k+1, ... that the disk holds, gives them fresh GPU blocks registered as cached prefix blocks
(KVCacheManager.adopt_blocks) and writes their K/V there (Backend.write_blocks); the scheduler's
allocate_slots then finds them as ordinary prefix hits, so the sequence prefills only the rest. The CPU pool
is looked up before this (kv_cpu_tier), so disk loads start after the blocks it held.

Write-behind: after a forward, blocks that became full and computed are read back in one call
(Backend.read_blocks) and stored unless the disk holds them already; a step reads back only when a block
fills, and never for a block that is on disk (a restored or shared prefix).
"""
from __future__ import annotations

from .disk_tier import DiskTier, KVLayout, block_chain, block_payloads, block_words

__all__ = ["DiskCache", "layout_for"]


def layout_for(backend, model_hash: str) -> KVLayout:
    """The disk key of `backend`'s KV: the model hash plus its dtype and cache geometry."""
    cfg = backend.config
    return KVLayout(model_hash, backend.kv_dtype, backend.block_size, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim)


class DiskCache:
    """Glue between the engine and a DiskTier (see the module docstring)."""

    def __init__(self, tier: DiskTier) -> None:
        self.tier = tier
        self.layout = tier.layout
        self._checked: dict[int, int] = {}  # seq id -> token count when its prefix was last looked up on disk
        self._saved: dict[int, int] = {}  # seq id -> full blocks already handled by write-behind
        self.restored_tokens = 0
        self.last_restored_tokens = 0

    def check_backend(self, backend) -> None:
        """ValueError unless the tier's layout is the backend's (dtype, block size, layers, heads)."""
        want = layout_for(backend, self.layout.model_hash)
        if want != self.layout:
            raise ValueError(f"the disk tier holds {self.layout} but the {backend.name} backend's KV is {want}")

    async def restore(self, kv, backend, requests, cpu_tier=None) -> int:
        """Load from disk the prefixes of `requests` (waiting, no blocks) that the GPU cache lacks; returns
        the tokens restored. cpu_tier (kv_cpu_tier.CpuTier): its demotions run before a block is written."""
        bs = self.layout.block_size
        total = 0
        requests = list(requests)
        waiting = {req.seq.seq_id for req in requests}
        self._checked = {sid: n for sid, n in self._checked.items() if sid in waiting}
        for req in requests:
            seq = req.seq
            if seq.block_table or self._checked.get(seq.seq_id) == seq.num_tokens:
                continue
            self._checked[seq.seq_id] = seq.num_tokens
            self.last_restored_tokens = 0  # "restored from disk" tells about the newest request looked up
            usable = (seq.num_tokens - 1) // bs  # leave one token to compute: the model needs its logits
            hashes = block_chain(self.layout, seq.token_ids, usable)
            start = kv.lookup_prefix(seq.token_ids[:usable * bs])[0] // bs
            self.tier.touch(hashes[:start])  # a GPU hit counts as a use for the disk's LRU too
            run = min(self.tier.present_run(hashes, start), kv.pool.num_available)
            if not run:
                continue
            payloads = await self.tier.load(hashes[:start + run], seq.token_ids, start)
            ids = kv.adopt_blocks(seq.token_ids[:(start + len(payloads)) * bs], start, len(payloads))
            if ids:
                if cpu_tier is not None:
                    await cpu_tier.flush(backend)
                await backend.write_blocks(ids, block_words(self.layout, payloads[:len(ids)]))
                self.last_restored_tokens = len(ids) * bs
                total += len(ids) * bs
        self.restored_tokens += total
        await self.tier.flush()  # a GPU hit or a load moved blocks in the disk's LRU
        return total

    async def write_behind(self, kv, backend, seqs) -> int:
        """Store the newly full, computed blocks of `seqs` that the disk lacks; returns how many it wrote."""
        bs = self.layout.block_size
        todo: list[tuple[str, list[int], int]] = []  # (chain hash, token ids, GPU block)
        queued: set[str] = set()  # two live sequences with one prefix fill the same hash: stored once
        for seq in seqs:
            full = seq.num_computed_tokens // bs
            done = self._saved.get(seq.seq_id, 0)
            # After a sliding-window eviction the K/V is no longer that prefix's: never stored.
            if seq.num_evicted_tokens or full <= done:
                continue
            hashes = block_chain(self.layout, seq.token_ids, full)
            for i in range(done, full):
                if self.tier.has(hashes[i]):
                    self.tier.touch(hashes[i:i + 1])
                elif hashes[i] not in queued:
                    queued.add(hashes[i])
                    todo.append((hashes[i], seq.token_ids[i * bs:(i + 1) * bs], seq.block_table[i]))
            self._saved[seq.seq_id] = full
        self._saved = {sid: n for sid, n in self._saved.items() if sid in kv.live}
        written = 0
        if todo:
            payloads = block_payloads(await backend.read_blocks([block for _, _, block in todo]))
            for (h, tokens, _), payload in zip(todo, payloads):
                written += int(await self.tier.save(h, tokens, payload))
        await self.tier.flush()
        return written

    def stats(self) -> dict:
        """Plain data for the memory panel."""
        return {"disk_blocks": self.tier.num_blocks, "disk_bytes": self.tier.num_bytes,
                "disk_budget_bytes": self.tier.budget_bytes, "last_disk_restored_tokens": self.last_restored_tokens,
                "disk_corrupt_blocks": self.tier.num_corrupt, "disk_index_writes": self.tier.num_index_writes,
            "disk_notes": list(self.tier.notes)}
