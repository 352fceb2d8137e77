"""Several models' KV in one GPU buffer of equal pages (vLLM v1's hybrid allocator: one page size for every KV
group, each group's block size chosen so a block fills the page).

A page holds one block of one KV group of one model (kv/groups.py): K and V of the group's layers, every layer
of a model without window layers (one group), a group's `group_size` layers of a model with them (Gemma 3 270M:
3 of its 18), so a window group's pages leave the sequence as its window slides, as in a pool of the model's
own. Each slot's K (and V) block sits in a slot of `layer_slot_bytes` (rounded up to 256 B, the largest
minStorageBufferOffsetAlignment WebGPU allows). The K halves of the pages are one buffer and the V halves
another: a kernel that writes K and V binds both, and WebGPU refuses two writable bindings of one buffer whose
ranges overlap. Model m's slot j K cache is a binding of the K buffer from byte j * slot_m (V: the same in the V
buffer), in which block b starts at b * page_bytes / 2: its GpuKVLayout's page_words, which the KV kernels read
as BLOCK_U32. So every kernel keeps one K and one V binding per slot (layer l binds its slot's), and a physical
page id means the same bytes to every model and every group.

plan_gpu_pages sizes the page (the widest model, most KV bytes per token in a page, gets `block_size` tokens a
block; every other model the largest block of ALLOWED_BLOCK_SIZES up to the kernels' MAX_BLOCK_SIZE that fits),
SharedGpuPages allocates the buffer in a GpuLedger and hands each model's GpuKVPool its views.
pagedkv/shared_gpu.py builds the engine over them.
"""
from __future__ import annotations

from ...config import ALLOWED_BLOCK_SIZES
from ...gpu_budget import GpuLedger
from ...kv.spec import KVSpec
from ...model.config import ModelConfig
from .kv_layout import MAX_BLOCK_SIZE, WORD_BYTES, GpuKVLayout
from .memory_plan import kv_groups_of

OFFSET_ALIGN = 256  # every layer's binding starts on it: the largest minStorageBufferOffsetAlignment allowed


def layer_slot_bytes(spec: KVSpec) -> int:
    """Bytes a page gives one layer's K (or V) block of `spec`: the block, rounded up to OFFSET_ALIGN."""
    block = spec.block_size * spec.token_u32s * 4
    return -(-block // OFFSET_ALIGN) * OFFSET_ALIGN


def page_use(config: ModelConfig, kv_dtype: str, block_size: int, kv_groups: bool = True) -> int:
    """Bytes of a page one block of a model takes: K and V slots of one KV group's layers (every layer's for a
    model without window layers, or with kv_groups False)."""
    slots = kv_groups_of(config, kv_groups).group_size
    return 2 * slots * layer_slot_bytes(KVSpec.of(config, block_size=block_size, dtype=kv_dtype))


def block_size_in(page_bytes: int, config: ModelConfig, kv_dtype: str, name: str = "a model",
                  kv_groups: bool = True) -> int:
    """The largest block (ALLOWED_BLOCK_SIZES, at most MAX_BLOCK_SIZE) of a model a page holds; ValueError with
    the sizes when even the smallest does not fit."""
    sizes = [bs for bs in ALLOWED_BLOCK_SIZES if bs <= MAX_BLOCK_SIZE]
    fitting = [bs for bs in sizes if page_use(config, kv_dtype, bs, kv_groups) <= page_bytes]
    if not fitting:
        raise ValueError(f"a page of {page_bytes:,} B holds no {sizes[0]}-token block of {name} "
                         f"({page_use(config, kv_dtype, sizes[0], kv_groups):,} B in {kv_dtype})")
    return max(fitting)


def plan_gpu_pages(configs: list[ModelConfig], kv_dtype: str, block_size: int = 16,
                   kv_groups: bool = True) -> tuple[int, list[int]]:
    """(page bytes, each model's block size): the widest model (most KV bytes per token in a page) gets
    `block_size`. kv_groups False: a model with window layers keeps every layer of a block in a page."""
    if not configs:
        raise ValueError("no model to size a page for")
    if block_size not in ALLOWED_BLOCK_SIZES or block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be one of {[b for b in ALLOWED_BLOCK_SIZES if b <= MAX_BLOCK_SIZE]}, "
                         f"got {block_size}")
    page = max(page_use(c, kv_dtype, block_size, kv_groups) for c in configs)
    return page, [block_size_in(page, c, kv_dtype, f"model {i}", kv_groups) for i, c in enumerate(configs)]


class SharedGpuPages:
    """num_pages pages of page_bytes, their K halves in one GPU buffer and V halves in another, reserved in
    `ledger` as "kv.pages"; every model's GpuKVPool views them (views())."""

    def __init__(self, ctx, ledger: GpuLedger, num_pages: int, page_bytes: int) -> None:
        if num_pages < 1 or page_bytes % OFFSET_ALIGN:
            raise ValueError(f"need >= 1 page of a multiple of {OFFSET_ALIGN} B, got {num_pages} of {page_bytes}")
        self.ctx, self.ledger = ctx, ledger
        self.num_pages, self.page_bytes = num_pages, page_bytes
        self.half = page_bytes // 2  # one page's K (or V) slots of every layer
        self._allocate()

    def _allocate(self) -> None:
        self.ledger.reserve("kv.pages", self.num_pages * self.page_bytes, "kv")
        self.k = self.ctx.buffer(self.num_pages * self.half, "k_pages")
        self.v = self.ctx.buffer(self.num_pages * self.half, "v_pages")

    def resize(self, num_pages: int) -> None:
        """New buffers of num_pages pages (contents not kept: the caller made sure no page holds any); every
        model's pool must take its views again (WebGpuBackend.rebind_pages)."""
        if num_pages < 1:
            raise ValueError(f"need >= 1 page, got {num_pages}")
        self.destroy()
        self.num_pages = num_pages
        self._allocate()

    @staticmethod
    def pages_that_fit(free_bytes: int, page_bytes: int, limits: dict) -> int:
        """Pages of free_bytes whose K (and V) halves one buffer (maxBufferSize) and a binding over it
        (maxStorageBufferBindingSize) may hold."""
        cap = min(limits.get("maxBufferSize", free_bytes), limits.get("maxStorageBufferBindingSize", free_bytes))
        return max(0, min(free_bytes // page_bytes, cap // (page_bytes // 2)))

    def layout(self, spec: KVSpec, num_blocks: int) -> GpuKVLayout:
        """A model's KV layout over these pages; num_blocks: the engine pool's pages (those past the buffer
        are never written: they hold weights' accounting only)."""
        return GpuKVLayout(spec, num_blocks, page_words=self.half // WORD_BYTES)

    def views(self, layout: GpuKVLayout, num_slots: int) -> list[tuple[tuple, tuple]]:
        """Each slot's (K, V) bindings (buffer, offset, size) over the pages: a page's layers (a KV group's)."""
        slot = layer_slot_bytes(layout.spec)
        if num_slots * slot > self.half:
            raise ValueError(f"{num_slots} layers of {slot:,} B K and V slots do not fit a page of "
                             f"{self.page_bytes:,} B")
        size = (self.num_pages - 1) * self.half + layout.block_words * WORD_BYTES
        return [((self.k, j * slot, size), (self.v, j * slot, size)) for j in range(num_slots)]

    def destroy(self) -> None:
        self.k.destroy()
        self.v.destroy()
        self.ledger.release("kv.pages")
