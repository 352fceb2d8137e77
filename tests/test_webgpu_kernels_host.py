"""Host-side checks of the KV-cache kernel calls that run without a GPU (pure Python + numpy)."""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout
from pagedkv.backends.webgpu.model_kernels import uniform_words
from pagedkv.kv.spec import KVSpec

SMOLLM2_LAYER = KVSpec(num_layers=1, num_kv_heads=3, head_dim=64)  # one layer's K (or V) cache, 16-token blocks
F32_LAYER = SMOLLM2_LAYER.with_(dtype="f32")


def test_layout_word_counts_for_smollm2_f32_and_f16():
    f32 = GpuKVLayout(F32_LAYER, num_blocks=100)
    f16 = GpuKVLayout(SMOLLM2_LAYER.with_(dtype="f16"), num_blocks=100)
    assert (f32.token_bytes, f32.block_words, f32.nbytes) == (768, 768, 1_228_800)
    assert (f16.token_bytes, f16.block_words, f16.nbytes) == (384, 384, 614_400)
    assert f16.constants == {"HEAD_DIM": 64, "KV_FORMAT": 1, "HEAD_MAJOR": 1, "KV_GROUP": 64} and f32.constants["KV_FORMAT"] == 0
    assert f16.shape == f16.storage_shape == (100, 16, 3, 64) and f16.storage_dtype == np.float16
    assert (f32.kv_write_invocations(5), f16.kv_write_invocations(5)) == (5 * 48, 5 * 24)


@pytest.mark.parametrize("dtype, token_bytes, constants", [
    ("int8", 224, {"HEAD_DIM": 64, "KV_FORMAT": 2, "KV_GROUP": 32}),  # 3 x 64 B + 6 scales, padded to 16 B
    ("fp8-e4m3", 208, {"HEAD_DIM": 64, "KV_FORMAT": 3, "KV_GROUP": 64}),  # 3 x 64 B + 3 scales + 1 pad u32
    ("int4", 128, {"HEAD_DIM": 64, "KV_FORMAT": 4, "KV_GROUP": 32}),  # 3 x 32 B + 6 scales + 2 pad u32
    ("int4-asym", 128, {"HEAD_DIM": 64, "KV_FORMAT": 5, "KV_GROUP": 32}),  # as int4: 6 (step, min) f16 pairs
])
def test_quantized_layouts_hold_words_with_scales_in_each_token(dtype, token_bytes, constants):
    lay = GpuKVLayout(SMOLLM2_LAYER.with_(dtype=dtype), num_blocks=100)
    assert (lay.token_bytes, lay.block_words, lay.nbytes) == (token_bytes, token_bytes, 100 * 16 * token_bytes)
    assert lay.constants == dict(constants, HEAD_MAJOR=1)
    assert lay.storage_shape == (100, 16, token_bytes // 4) and lay.storage_dtype == np.uint32
    # kv_write_quant: one workgroup per token (its 3 kv heads), an invocation per code word of its K and V rows
    words = 3 * 2 * 64 * lay.kind.bits // 32
    assert (lay.kv_write_shader, lay.kv_write_invocations(5), lay.kv_write_workgroup) == ("kv_write_quant",
                                                                                          5 * words, words)


@pytest.mark.parametrize("dtype, n_kv, head_dim", [("f16", 3, 64), ("f32", 2, 16), ("int8", 3, 64),
                                                 ("int4", 1, 48), ("int4-asym", 4, 32), ("fp8-e4m3", 2, 16)])
def test_blocks_cross_between_the_hosts_token_order_and_the_kernels_head_major_order(dtype, n_kv, head_dim):
    """device_order puts kv head h's row of token t of a block at row h * block_size + t, then the scale words in
    the same order, then the padding; host_order undoes it; head_major=False leaves blocks as they are."""
    lay = GpuKVLayout(SMOLLM2_LAYER.with_(dtype=dtype, num_kv_heads=n_kv, head_dim=head_dim, block_size=8), 6)
    rng = np.random.default_rng(1)
    host = rng.integers(0, 2**32, (6,) + lay.storage_shape[1:], dtype=np.uint64).astype(np.uint32)
    host = host.view(np.uint16)[..., ::2].copy() if lay.storage_dtype == np.float16 else host
    host = host.view(lay.storage_dtype)  # (6, 8, ...) random bits in the host's dtype
    device = lay.device_order(host)
    assert device.shape == host.shape and device.dtype == host.dtype
    assert np.array_equal(lay.host_order(device).view(np.uint8), host.view(np.uint8))
    row, scales = lay.kind.row_u32s(head_dim), lay.kind.scales_per_row(head_dim)
    words, tokens = device.view(np.uint32).reshape(6, -1), host.view(np.uint32).reshape(6, 8, -1)
    for block, t, h in ((0, 0, 0), (2, 7, n_kv - 1), (5, 3, n_kv // 2)):
        r = h * 8 + t
        assert np.array_equal(words[block, r * row:(r + 1) * row], tokens[block, t, h * row:(h + 1) * row])
        at, src = 8 * n_kv * row + r * scales, n_kv * row + h * scales
        assert np.array_equal(words[block, at:at + scales], tokens[block, t, src:src + scales])
    token_major = GpuKVLayout(lay.spec, 6, head_major=False)
    assert token_major.device_order(host) is host and token_major.constants["HEAD_MAJOR"] == 0


@pytest.mark.parametrize("spec_changes, num_blocks, message", [
    ({"dtype": "bf16"}, 4, "unknown KV cache dtype 'bf16'; valid dtypes are f32, f16, int8, fp8-e4m3, int4, int4-asym"),
    ({"block_size": 48}, 4, r"block_size must be in 1\.\.32 or a multiple of 32 up to 128 .* got 48"),
    ({"block_size": 256}, 4, r"block_size must be in 1\.\.32 or a multiple of 32 up to 128 .* got 256"),
    ({"head_dim": 56}, 4, "head_dim must be a multiple of 16"),
    ({"head_dim": 512}, 4, r"head_dim must be a multiple of 16 in 16\.\.256"),
    ({}, 0, "num_blocks must be >= 1, got 0"),
])
def test_layout_rejects_what_the_kernels_cannot_run(spec_changes, num_blocks, message):
    spec = KVSpec(num_layers=1, num_kv_heads=2, head_dim=64).with_(**spec_changes)  # KVSpec itself allows these
    with pytest.raises(ValueError, match=message):
        GpuKVLayout(spec, num_blocks)


def test_uniform_words_pack_u32_and_f32_fields_in_order():
    words = uniform_words(3, 9, 0.125)
    assert words.dtype == np.uint32 and words.shape == (4,)
    assert words[:2].tolist() == [3, 9] and words[2:3].view(np.float32)[0] == 0.125 and words[3] == 0
    assert uniform_words(*range(5)).shape == (8,)


def test_kernel_calls_validate_before_touching_the_gpu():
    kk = KVKernels(ctx=None, layout=GpuKVLayout(F32_LAYER, 8), n_heads=9)  # no GPU: any GPU use would fail
    assert (kk.partition_blocks, kk.head_tile, kk.query_tile) == (8, 3, 4)
    tiles = [KVKernels(None, GpuKVLayout(F32_LAYER.with_(num_kv_heads=kv), 8), n).head_tile
             for n, kv in ((8, 2), (12, 2), (10, 2), (4, 4))]
    assert tiles == [4, 3, 1, 1]
    q = np.zeros((2, 9, 64), np.float32)
    with pytest.raises(ValueError, match=r"block ids must lie in \[0, 8\)"):
        kk.prepare_paged_attention(None, q, np.array([[0, 1], [8, 2]]), np.array([20, 5]))
    with pytest.raises(ValueError, match="query must be"):
        kk.prepare_paged_attention(None, q[:, :3], np.array([[0], [1]]), np.array([5, 5]))
    with pytest.raises(ValueError, match="repeated slot"):
        kk.prepare_kv_write(None, np.zeros((2, 3, 64)), np.zeros((2, 3, 64)), np.array([5, 5]))
    with pytest.raises(ValueError, match="both a source and a destination"):
        kk.prepare_copy_blocks(None, np.array([[1, 2], [2, 3]]))
    with pytest.raises(ValueError, match="q_len <= context_len"):
        kk.prepare_prefill_attention(None, np.zeros((6, 9, 64), np.float32), np.array([0, 6]), np.array([[0]]),
                                     np.array([5]))
    with pytest.raises(ValueError, match="appears twice in the swap list"):
        kk.prepare_gather_blocks(None, np.array([3, 3]))
    with pytest.raises(ValueError, match=r"k_blocks must be \(1, 16, 3, 64\) float32"):
        kk.prepare_scatter_blocks(None, np.array([3]), np.zeros((1, 16, 3, 64), np.float16),
                                  np.zeros((1, 16, 3, 64), np.float32))
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        KVKernels(ctx=None, layout=GpuKVLayout(F32_LAYER, 8), n_heads=8)
    with pytest.raises(ValueError, match="query_tile must be 1..4"):
        KVKernels(ctx=None, layout=GpuKVLayout(F32_LAYER, 8), n_heads=9, query_tile=5)
    with pytest.raises(ValueError, match="partition_tokens"):
        KVKernels(ctx=None, layout=GpuKVLayout(F32_LAYER, 8), n_heads=9, partition_tokens=8)
