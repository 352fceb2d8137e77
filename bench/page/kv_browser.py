# Runs inside the page's worker (Pyodide): kv_sim's workload against real GPU buffers. See bench/kv_browser.py.
import time

import numpy as np

from bench import kv_sim
from bench.page.webgpu_engine import bench_backend
from pagedkv.backends.webgpu.kv_pool import SWAP_CHUNK_BLOCKS
from pagedkv.kv.block_pool import OutOfBlocks
from pagedkv.config import CacheConfig
from pagedkv.kv.contiguous import ContiguousAllocator
from pagedkv.kv.manager import KVCacheManager, NeverFits
from pagedkv.sequence import Sequence

_STATE = {}


def bytes_per_token(b):
    """From the real KV layout the backend allocated (so any KV dtype, scales included)."""
    return b.ledger.by_kind()["kv"] // (b.num_blocks * b.block_size)


def release():
    """Destroy the loaded backend: the page may go on to other benchmarks."""
    _STATE.pop("backend").destroy()


async def load_backend(budget_mib, kv_dtype="f16"):
    """The real model's weights, scratch, staging and KV pool, every buffer reserved in the ledger."""
    if "backend" in _STATE:
        _STATE.pop("backend").destroy()
    ctx, b, _, ledger = await bench_backend(budget_mib, kv_dtype, _STATE.get("ctx"))
    _STATE["ctx"], _STATE["backend"] = ctx, b
    kinds = b.ledger.by_kind()
    bpt = bytes_per_token(b)
    fixed = kinds["weights"] + kinds["scratch"] + kinds["staging"]
    return {**ledger, "bytes_per_token": bpt, "formula_tokens": (b.ledger.budget_bytes - fixed) // bpt,
            "adapter": ctx.info.name}


class GpuWriter:
    """Writes synthetic K/V rows into the slots a replay hands out, with the engine's kv_write kernel.

    Each tick's slots go out in dispatches of at most SWAP_CHUNK_BLOCKS blocks' worth of tokens (so the
    upload temporaries stay inside the staging the backend reserved), into `layers_per_tick` layers
    chosen round-robin: every token's slot is a real slot of the real pool, but writing all 30 layers for
    every token would make the run 30x longer under SwiftShader without changing the memory picture."""

    def __init__(self, backend, layers_per_tick):
        self.b = backend
        self.layers_per_tick = layers_per_tick
        self.chunk = SWAP_CHUNK_BLOCKS * backend.block_size
        self.pending = []
        self.tokens_written = self.dispatches = 0
        self.copied_tokens = 0
        self.gpu_ms = 0.0
        self._next_layer = 0

    def on_slots(self, seq, first, n, slots):
        self.pending.append(slots)

    def on_copy(self, slots):
        self.copied_tokens += len(slots)
        self.pending.append(slots)

    async def flush(self):
        if not self.pending:
            return
        # (n,) int64; a block freed and reused within one tick appears twice: one write per slot
        slots = np.unique(np.concatenate(self.pending))
        self.pending = []
        lay, kk, ctx = self.b.kv_pool.layout, self.b.kv_kernels, self.b.ctx
        t0 = time.perf_counter()
        for at in range(0, len(slots), self.chunk):
            part = slots[at:at + self.chunk]
            # (n, n_kv_heads, head_dim): a value derived from the slot, so a read back could check placement
            rows = np.repeat(((part % 251) / 251.0).astype(np.float32)[:, None, None], lay.n_kv_heads, 1)
            rows = np.ascontiguousarray(np.repeat(rows, lay.head_dim, 2))
            prepared = []
            for _ in range(self.layers_per_tick):
                layer = self._next_layer
                self._next_layer = (layer + 1) % len(self.b.kv_pool.caches)
                prepared.append(kk.prepare_kv_write(self.b.kv_pool.caches[layer], rows, rows, part))
            ctx.submit([d for p in prepared for d in p.dispatches])
            await ctx.done()
            for p in prepared:
                p.destroy()
            self.dispatches += len(prepared)
            self.tokens_written += len(part) * len(prepared)
        self.gpu_ms += (time.perf_counter() - t0) * 1e3


async def replay(kind, num_sessions, seed, enable_prefix_caching=True, layers_per_tick=1, warmup_s=300,
                 contiguous_max_context=2048, preempt=False):
    """kv_sim's workload for `kind` over the loaded backend's KV pool, with real kv_write dispatches."""
    b = _STATE["backend"]
    bpt = bytes_per_token(b)
    cfg = kv_sim.WorkloadConfig(num_sessions=num_sessions, warmup_s=warmup_s)
    plans = kv_sim.make_workload(cfg, seed)
    writer = GpuWriter(b, layers_per_tick)
    r = kv_sim.Replay(kind, plans, cfg, b.num_blocks * b.block_size * bpt, bpt, b.block_size,
                      contiguous_max_context, enable_prefix_caching=enable_prefix_caching,
                      on_slots=writer.on_slots, on_copy=writer.on_copy, trace=True, preempt=preempt)
    t0 = time.perf_counter()
    while not r.done:
        r.tick()
        await writer.flush()
    out = r.result()
    out.update(seed=seed, wall_s=round(time.perf_counter() - t0, 2), kv_write_dispatches=writer.dispatches,
               kv_write_tokens=writer.tokens_written, kv_write_ms=round(writer.gpu_ms, 1),
               layers_written_per_tick=layers_per_tick, contiguous_copy_rewritten_tokens=writer.copied_tokens)
    return out


async def capacity_probe(kind, step=16, contiguous_max_context=2048):
    """One session growing `step` tokens at a time (slots written for real) until its allocation is refused:
    the largest context the pool holds for a single conversation."""
    b = _STATE["backend"]
    bpt = bytes_per_token(b)
    writer = GpuWriter(b, 1)
    if kind == "paged":
        alloc = KVCacheManager(CacheConfig(num_blocks=b.num_blocks, block_size=b.block_size))
    else:
        alloc = ContiguousAllocator(b.num_blocks * b.block_size, contiguous_max_context)
    seq = Sequence([], session="probe")
    while True:
        first = seq.num_kv_tokens
        try:
            alloc.append_tokens(seq, [7] * step)
        except (OutOfBlocks, NeverFits):
            break
        slots = kv_sim.token_slots(alloc, seq, first, b.block_size)
        writer.on_slots(seq, first, len(slots), slots)
        if len(writer.pending) * step >= writer.chunk:
            await writer.flush()
    await writer.flush()
    held = seq.num_kv_tokens
    alloc.free(seq)
    return {"allocator": kind, "max_context_tokens": held, "bytes_per_token": bpt,
            "kv_write_tokens": writer.tokens_written}
