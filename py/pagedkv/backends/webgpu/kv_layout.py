"""The KV pool's memory on the GPU: GpuKVLayout (a KVSpec and a block count: the bytes, words and pipeline
constants every KV kernel is compiled with) and KVCacheBuffers (one layer's K and V buffers, or its bindings
into pages several models share). kv_kernels.py runs the kernels over them; kv_pool.py holds a model's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...kv.spec import KVSpec

# The cpu family scores a block MAX_CHUNK keys at a time (paged_attention_common.wgsl), so a block is either at
# most one chunk or a whole number of them; MAX_BLOCK_SIZE is the largest the kernel tests run (both families,
# decode and prefill), and a prefill pass (PREFILL_PASS_TOKENS keys) still holds at least one such block.
MAX_CHUNK = 32  # MAX_CHUNK in paged_attention_common.wgsl
MAX_BLOCK_SIZE = 128
MAX_HEAD_DIM = 256  # 4 * MAX_VEC of attention_heads_256.wgsl (Gemma 3 270M: 256)
HOST_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}  # else u32 words on the host
WORD_BYTES = 16  # the kernels address the cache in vec4<u32> words


@dataclass(frozen=True)
class GpuKVLayout:
    """A KV pool on the GPU: its KVSpec (geometry and element type) and num_blocks. Each layer's K (and V) cache
    is one buffer of num_blocks blocks in spec.dtype; with page_words, a binding in which block b starts at vec4
    word b * page_words (pages several models share, shared_pages.py).

    Inside a block the kernels keep each kv head's rows of all block_size tokens together (head_major, the
    default: one head's keys are contiguous, so the lanes of decode attention that take neighbouring keys read
    neighbouring memory): (n_kv_heads, block_size, row) data, then (n_kv_heads, block_size, scales) scale
    words, then the tokens' padding (shaders/paged_kv_read.wgsl). The host always sees tokens one after
    another, as pack_tokens writes them and as the disk tier stores them: `device_order` / `host_order`
    convert whole blocks where they cross (upload, read, the swaps). head_major=False keeps the host's order on
    the device too (the side-by-side benchmark's other row)."""

    spec: KVSpec
    num_blocks: int
    page_words: int = 0  # vec4<u32> words from one block's start to the next; 0: block_words
    head_major: bool = True

    def __post_init__(self) -> None:
        self.spec.element  # noqa: B018  the registry entry: ValueError for bf16, which KVSpec only sizes
        bs = self.block_size
        if not 1 <= bs <= MAX_BLOCK_SIZE or (bs > MAX_CHUNK and bs % MAX_CHUNK):
            raise ValueError(f"block_size must be in 1..{MAX_CHUNK} or a multiple of {MAX_CHUNK} up to "
                             f"{MAX_BLOCK_SIZE} (the kernels score a block {MAX_CHUNK} keys at a time), got {bs}")
        if self.head_dim % 16 or not 16 <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f"head_dim must be a multiple of 16 in 16..{MAX_HEAD_DIM}, got {self.head_dim}")
        if not isinstance(self.num_blocks, int) or self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.page_words and self.page_words < self.block_words:
            raise ValueError(f"a page of {self.page_words} words holds no block of {self.block_words}")

    # the spec's geometry in the kernels' (ModelConfig's) names
    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def n_kv_heads(self) -> int:
        return self.spec.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.spec.head_dim

    @property
    def dtype(self) -> str:
        return self.spec.dtype

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_blocks, self.block_size, self.n_kv_heads, self.head_dim)

    @property
    def kind(self):
        """The pagedkv.kv.dtypes registry entry."""
        return self.spec.element

    @property
    def storage_shape(self) -> tuple:
        """Host view of a cache: the logical shape for f32 / f16, (num_blocks, block_size, token_u32s) words else."""
        if self.dtype in HOST_DTYPES:
            return self.shape
        return (self.num_blocks, self.block_size, self.spec.token_u32s)

    @property
    def storage_dtype(self) -> np.dtype:
        return HOST_DTYPES.get(self.dtype, np.dtype(np.uint32))

    np_dtype = storage_dtype  # the name the f32 / f16 callers use

    @property
    def token_bytes(self) -> int:
        """Bytes of one token in one cache (K or V): data, scales and padding."""
        return self.spec.token_u32s * 4

    @property
    def block_words(self) -> int:
        """vec4<u32> words of one block of one cache."""
        return self.block_size * self.token_bytes // WORD_BYTES

    @property
    def stride_words(self) -> int:
        """vec4<u32> words from one block's start to the next."""
        return self.page_words or self.block_words

    @property
    def nbytes(self) -> int:
        """Bytes of one cache (K or V) of this layer: its buffer, or its binding into shared pages."""
        return ((self.num_blocks - 1) * self.stride_words + self.block_words) * WORD_BYTES

    @property
    def constants(self) -> dict:
        paged = {"BLOCK_U32": self.page_words * 4} if self.page_words else {}
        return {"HEAD_DIM": self.head_dim, "KV_FORMAT": self.kind.code, "HEAD_MAJOR": int(self.head_major),
                "KV_GROUP": self.kind.group_for(self.head_dim) or self.head_dim, **paged}

    def device_order(self, blocks: np.ndarray) -> np.ndarray:
        """Whole blocks in the host's order, (n, block_size, ...) of storage_shape[1:], as the kernels keep them
        (head_major): the same shape and dtype, the values of each block reordered."""
        return self._reorder(blocks, to_device=True)

    def host_order(self, blocks: np.ndarray) -> np.ndarray:
        """The inverse of device_order: blocks as the kernels keep them back in the host's (token-major) order."""
        return self._reorder(blocks, to_device=False)

    def _reorder(self, blocks: np.ndarray, to_device: bool) -> np.ndarray:
        if not self.head_major:
            return blocks
        n, bs, heads = blocks.shape[0], self.block_size, self.n_kv_heads
        if self.dtype in HOST_DTYPES:  # (n, block_size, heads, head_dim): no scales, no padding
            if to_device:
                return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3)).reshape(blocks.shape)
            return np.ascontiguousarray(blocks.reshape(n, heads, bs, -1).transpose(0, 2, 1, 3))
        row, scales = self.kind.row_u32s(self.head_dim), self.kind.scales_per_row(self.head_dim)
        data, used = heads * row, heads * (row + scales)  # u32s of a token's rows; of its rows and scales
        if to_device:  # (n, block_size, token_u32s) -> rows by head, scales by head, padding
            parts = (blocks[:, :, :data].reshape(n, bs, heads, row).transpose(0, 2, 1, 3),
                     blocks[:, :, data:used].reshape(n, bs, heads, scales).transpose(0, 2, 1, 3),
                     blocks[:, :, used:])
            return np.concatenate([p.reshape(n, -1) for p in parts], axis=1).reshape(blocks.shape)
        flat = blocks.reshape(n, -1)
        rows = flat[:, : bs * data].reshape(n, heads, bs, row).transpose(0, 2, 1, 3).reshape(n, bs, data)
        scale_words = flat[:, bs * data : bs * used].reshape(n, heads, bs, scales).transpose(0, 2, 1, 3)
        padding = flat[:, bs * used :].reshape(n, bs, -1)
        return np.concatenate([rows, scale_words.reshape(n, bs, -1), padding], axis=2)

    @property
    def kv_write_shader(self) -> str:
        """kv_write (f32 / f16) or kv_write_quant (the quantized formats: one workgroup per token x kv head)."""
        return "kv_write_quant" if self.kind.quantized else "kv_write"

    def kv_write_invocations(self, num_tokens: int) -> int:
        """kv_write runs one invocation per cache word for f32 / f16; kv_write_quant one per code word of the
        token's K and V rows, in workgroups of kv_write_heads kv heads (kv_write_workgroup)."""
        if self.kind.quantized:
            return num_tokens * self.n_kv_heads // self.kv_write_heads * self.kv_write_workgroup
        return num_tokens * self.n_kv_heads * self.head_dim * self.kind.bits // (8 * WORD_BYTES)

    @property
    def kv_write_heads(self) -> int:
        """kv_write_quant's kv heads per workgroup: the most that divide n_kv_heads within 256 invocations
        (WebGPU's least maxComputeInvocationsPerWorkgroup)."""
        row = 2 * self.head_dim * self.kind.bits // 32  # code words of a K and a V row
        return max(h for h in range(1, self.n_kv_heads + 1) if self.n_kv_heads % h == 0 and h * row <= 256)

    @property
    def kv_write_workgroup(self) -> int | None:
        """kv_write_quant's workgroup size, the code words of kv_write_heads heads' K and V rows (96 for
        SmolLM2's int8 KV); None: kv_write's, the kernels' own (KVKernels.workgroup_size)."""
        if not self.kind.quantized:
            return None
        return self.kv_write_heads * 2 * self.head_dim * self.kind.bits // 32


class KVCacheBuffers:
    """One layer's K and V pool buffers on the GPU, or (views) its K and V bindings (buffer, offset, size) into
    pages several models share, which it does not own."""

    def __init__(self, ctx, layout: GpuKVLayout, views: tuple | None = None) -> None:
        self.ctx = ctx
        self.layout = layout
        self.owned = views is None
        if views is not None:
            self.k, self.v = views
            return
        self.k = ctx.buffer(layout.nbytes, "k_cache")  # (num_blocks, block_size, n_kv_heads, head_dim)
        self.v = ctx.buffer(layout.nbytes, "v_cache")  # (num_blocks, block_size, n_kv_heads, head_dim)

    def upload(self, k_cache: np.ndarray, v_cache: np.ndarray) -> None:
        """Overwrite both caches with host arrays of the layout's shape and dtype (owned buffers only)."""
        self._check_owned()
        lay = self.layout
        for name, array in (("k_cache", k_cache), ("v_cache", v_cache)):
            if array.shape != lay.storage_shape or array.dtype != lay.storage_dtype:
                raise ValueError(f"{name} must be {lay.storage_shape} {lay.storage_dtype}, "
                                 f"got {array.shape} {array.dtype}")
        self.ctx.write(self.k, lay.device_order(k_cache))
        self.ctx.write(self.v, lay.device_order(v_cache))

    async def read(self) -> tuple[np.ndarray, np.ndarray]:
        """Both caches back on the host, in the layout's shape and dtype (owned buffers only)."""
        self._check_owned()
        lay = self.layout
        shape, dtype = lay.storage_shape, lay.storage_dtype
        k, v = await self.ctx.read_array(self.k, dtype, shape), await self.ctx.read_array(self.v, dtype, shape)
        return lay.host_order(k), lay.host_order(v)

    def _check_owned(self) -> None:
        if not self.owned:
            raise ValueError("a view into shared pages moves whole blocks only (gather / scatter)")

    def destroy(self) -> None:
        if self.owned:
            self.k.destroy()
            self.v.destroy()
