"""Attention kernels per kernel family (kv_attention_gpu.py), through KVKernels, without a GPU."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pagedkv.backends.webgpu.kv_attention_gpu import decode_kernels, prefill_kernel
from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout
from pagedkv.kv.spec import KVSpec

CTX = SimpleNamespace(info=SimpleNamespace(limits={"maxComputeWorkgroupsPerDimension": 65535}))


def test_each_family_names_its_pipelines_shaders_and_entry_points():
    assert decode_kernels("cpu", True, 16).specs == [("paged_attention", "paged_attention", "main", 16),
                                                     ("paged_attention_reduce", "paged_attention_reduce", "main", 16)]
    # the cpu family's private accumulator sized by head width: the narrowest tier that holds the heads
    assert [decode_kernels("cpu", False, 16, d).attention for d in (16, 64, 80, 128, 144, 256)] == [
        "paged_attention_narrow", "paged_attention_narrow", "paged_attention", "paged_attention",
        "paged_attention_wide", "paged_attention_wide"]
    assert decode_kernels("gpu", True, 16).specs == [
        ("paged_attention_gpu_sg", "paged_attention_gpu_sg", "main", 128),
        ("paged_attention_reduce_gpu", "paged_attention_reduce", "main_gpu", 128)]
    assert decode_kernels("gpu", False, 16).attention == "paged_attention_gpu"
    with pytest.raises(ValueError, match="kernel family must be cpu or gpu, got 'npu'"):
        decode_kernels("npu", False, 16)


def test_grids_smollm2_one_and_four_sequences():
    layout = GpuKVLayout(KVSpec(1, 3, 64, 16, "f16"), 600)
    cpu = KVKernels(CTX, layout, 9)
    gpu = KVKernels(CTX, layout, 9, family="gpu", subgroups=True)
    # 4 partitions (512 tokens): cpu 4 x 3 threads in workgroups of 16, merge 9 x 16 vec4s;
    # gpu one workgroup per (partition, kv head) and per head
    assert cpu.decode_grids(1, 4) == ((1, 1, 1), (9, 1, 1))
    assert gpu.decode_grids(1, 4) == ((12, 1, 1), (9, 1, 1))
    assert gpu.decode_grids(4, 32) == ((4 * 32 * 3, 1, 1), (36, 1, 1))
    small = GpuKVLayout(KVSpec(1, 2, 16, 8, "f32"), 64)
    group4 = KVKernels(CTX, small, 8, family="gpu")  # 4 query heads per kv head: one tile
    assert (group4.head_tile, group4.decode_grids(3, 2)) == (4, ((3 * 2 * 2, 1, 1), (24, 1, 1)))


def test_gpu_family_refuses_partitions_past_its_staged_block_table():
    layout = GpuKVLayout(KVSpec(1, 3, 64, 8, "f32"), 600)
    KVKernels(CTX, layout, 9, family="gpu", partition_tokens=1024)  # 128 blocks: the limit
    with pytest.raises(ValueError, match=r"at most 128 blocks, got 256 \(partition_tokens 2048, block_size 8\)"):
        KVKernels(CTX, layout, 9, family="gpu", partition_tokens=2048)
    assert KVKernels(CTX, layout, 9, partition_tokens=2048).partition_blocks == 256  # cpu: none


def test_prefill_kernels_tile_new_tokens_by_family():
    # cpu: query_tile tokens, whatever the heads; a pass walks PREFILL_PASS_TOKENS (512) keys, so its blocks
    # follow the block size
    assert prefill_kernel("cpu", 3, 64, 4, 16, 16) == prefill_kernel("cpu", 1, 16, 4, 16, 16)
    assert prefill_kernel("cpu", 3, 64, 4, 16, 16).pass_keys == 512
    assert dict(prefill_kernel("cpu", 3, 64, 4, 16, 8).constants) == {"SLOTS": 4, "PASS_KEYS": 512}
    # one pipeline for every block size (the shader divides PASS_KEYS by the uniform's block_size), the same walk
    assert prefill_kernel("cpu", 3, 64, 4, 16, 128).constants == prefill_kernel("cpu", 3, 64, 4, 16, 8).constants
    assert [prefill_kernel("cpu", 3, 64, 4, 16, bs).pass_keys for bs in (8, 24, 128)] == [512, 504, 512]
    layout = GpuKVLayout(KVSpec(1, 3, 64, 16, "f32"), 600)
    cpu = KVKernels(CTX, layout, 9, query_tile=3)
    assert (cpu.prefill.name, cpu.query_tile, cpu.prefill_grid(10)) == ("paged_prefill_attention_narrow", 3, (6, 1, 1))
    # gpu: 16 (token, head) rows per workgroup: 5 tokens x 3 heads; 16 keys of 64 values per K/V tile
    gpu = KVKernels(CTX, layout, 9, family="gpu", query_tile=3)
    assert (gpu.prefill.name, gpu.query_tile, gpu.prefill.workgroup) == ("paged_prefill_attention_gpu", 5, 128)
    # and a pass walks PREFILL_GPU_PASS_TOKENS (1,024) keys: 64 tiles of 16
    assert dict(gpu.prefill.constants) == {"SLOTS": 3, "QUERY_TILE": 5, "KEYS": 16, "PASS_TILES": 64}
    assert gpu.prefill.pass_keys == 1024
    assert gpu.prefill_grid(10) == (30, 1, 1)  # 10 tiles x 3 kv heads
    # 2 heads per tile: 8 tokens, 32 keys
    small = KVKernels(CTX, GpuKVLayout(KVSpec(1, 2, 16, 8, "f32"), 64), 4, family="gpu")
    assert dict(small.prefill.constants) == {"SLOTS": 2, "QUERY_TILE": 8, "KEYS": 32, "PASS_TILES": 32}
    # head_dim 96: 10 keys a tile, so a pass is 102 whole tiles, 1,020 keys
    wide = prefill_kernel("gpu", 1, 96, 4, 16, 16)
    assert (dict(wide.constants)["PASS_TILES"], wide.pass_keys) == (102, 1020)


def test_gpu_decode_partitions_aim_at_the_split_within_their_bounds():
    """decode_partition_blocks: about `split` workgroups (sequences x partitions x head tiles), partitions of at
    least 64 tokens and at most 128 blocks, no more partitions than the scratch holds."""
    from pagedkv.backends.webgpu.kv_attention_gpu import decode_partition_blocks as split

    # SmolLM2, one sequence (3 head tiles), block 16, scratch room 64 partitions
    assert [split(96, 1, 3, blocks, 16, 64) for blocks in (8, 32, 64, 256, 512)] == [4, 4, 4, 8, 16]
    assert split(24, 1, 3, 64, 16, 64) == 8  # 8 partitions x 3 = 24 workgroups
    assert split(384, 1, 3, 512, 16, 64) == 8  # 128 partitions wanted, 64 fit the scratch
    assert split(96, 4, 3, 64, 16, 64) == 8  # four sequences: 12 workgroups a partition, 8 partitions
    assert split(96, 1, 3, 8192, 16, 64) == 128  # never past the staged block table (MAX_PART_BLOCKS)
    assert split(96, 1, 3, 3, 32, 64) == 2  # block 32: the 64-token minimum is 2 blocks
    assert split(96, 40, 8, 2, 16, 64) == 4  # more sequences than the aim: one partition
