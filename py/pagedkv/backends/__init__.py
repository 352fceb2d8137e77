"""What the engine asks of a backend: `Backend`, implemented by cpu.CpuBackend and webgpu.backend.WebGpuBackend.

A backend owns the model's weights and the physical KV blocks (the engine's block ids index them); the
engine's scheduler decides which blocks are copied, swapped or re-rotated before each forward.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

from ..kv.block_pool import CopyOp
from ..kv.retention import ShiftOp
from ..kv.spec import KVSpec
from ..model.config import ModelConfig
from ..model_runner import ForwardBatch


class Backend(Protocol):
    name: str  # "cpu" or "webgpu", shown to the user
    config: ModelConfig
    kv_dtype: str  # a name of pagedkv.kv.dtypes
    num_blocks: int  # KV blocks of the device pool
    block_size: int  # tokens per block
    num_cpu_blocks: int  # blocks of the swap pool in host memory

    @property
    def kv_spec(self) -> KVSpec:
        """The KV cache's geometry and element type (config, block_size, kv_dtype)."""

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token on the device in kv_dtype: K and V of every layer, scales and padding."""

    async def forward(self, batch: ForwardBatch, *, greedy: bool = False,
                      attention_mass: np.ndarray | None = None) -> np.ndarray:
        """(S, vocab) f32 logits of each sequence's last new token, or (S,) int32 argmax ids (lowest id on
        ties) when greedy. attention_mass, an (S, block_tables width) f32 array when given, is overwritten
        with the last layer's softmax mass per block-table entry, summed over heads and new tokens. A backend
        whose `samples_on_device` is true also takes draws=(S, 4) f32 (Sampler.device_draw per row) and
        returns the (S,) int32 ids it drew (the WebGPU backend: shaders/sample.wgsl), and with shaping= (a
        device_draws.Shaping: top-k, min-p, penalties, logit bias, log-probs) a device_draws.DrawnTokens. Such a backend may also
        pipeline decode steps: `submit(batch, greedy=, draws=, feed=)` submits a step and returns an awaitable
        of forward's result, and feed=True takes the step's token ids from the ids the previous step drew,
        on the device (decode_chain.py); the engine uses it where `pipelines` is true."""

    async def copy_blocks(self, ops: Iterable[CopyOp]) -> None:
        """Copy-on-write: device block src -> dst for each (src, dst), K and V of every layer."""

    async def swap_out(self, ops: Iterable[CopyOp]) -> None:
        """Device block -> host block for each (device, host) pair."""

    async def swap_in(self, ops: Iterable[CopyOp]) -> None:
        """Host block -> device block for each (host, device) pair."""

    async def shift_keys(self, ops: Iterable[ShiftOp]) -> None:
        """Re-rotate the cached keys of each op's block by -delta positions (kv_retention.py)."""

    async def read_blocks(self, block_ids: list[int]) -> np.ndarray:
        """Whole device blocks for the disk tier: (n, layers, 2 (K, V), block_size, token_u32s) u32 words in the
        GPU layout of kv_dtype (kv_dtype.pack_tokens), the same bytes on every backend."""

    async def write_blocks(self, block_ids: list[int], words: np.ndarray) -> None:
        """The inverse of read_blocks: words (n, layers, 2, block_size, token_u32s) u32 into device blocks."""


def check_attention_mass(out: np.ndarray, batch: ForwardBatch) -> None:
    """The attention_mass argument of Backend.forward must be an f32 array shaped like the block tables."""
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != batch.block_tables.shape:
        raise ValueError(f"attention_mass must be a float32 array of shape {batch.block_tables.shape} "
                         f"(sequences, block-table width), got {getattr(out, 'dtype', type(out).__name__)} "
                         f"{getattr(out, 'shape', '')}")
