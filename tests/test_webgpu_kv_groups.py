"""KV groups on the WebGPU backend without a GPU: the memory plan sizes a block as a page of one group's layers and
gives each group a 256-byte-aligned range of the block tables and slot mapping buffers; the plan binds each layer
its slot's K / V buffers and its group's ranges (tests/native/test_kv_groups_wgpu_native.py runs it on lavapipe)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from test_kv_groups import gemma3_config

from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout
from pagedkv.backends.webgpu.kv_pool import GpuKVPool
from pagedkv.backends.webgpu.memory_plan import plan_kv_pool
from pagedkv.backends.webgpu.plan import PlanKey, layer_program
from pagedkv.backends.webgpu.shared_pages import page_use, plan_gpu_pages
from pagedkv.backends.webgpu.weight_upload import upload_weights
from pagedkv.engine import run_sync
from pagedkv.gpu_budget import GpuLedger
from pagedkv.kv.groups import KVGroups
from pagedkv.model.tiny import TINY_VOCAB, write_tiny_model
from pagedkv.model.weights import check_manifest
from pagedkv.model_runner import ForwardBatch

LIMITS = {"maxStorageBufferBindingSize": 128 << 20, "maxComputeWorkgroupsPerDimension": 65535}


class Named(dict):
    """Placeholder scratch buffers: each one is its own name."""

    def __missing__(self, name: str) -> str:
        return name


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(manifest, folder) of a tiny Gemma 3 of 12 layers (5 and 11 global, the rest a 32-token window): 6 groups
    of 2 layers."""
    cfg = replace(gemma3_config(n_layers=12, window=32), context_length=512, vocab=TINY_VOCAB)
    path = tmp_path_factory.mktemp("models") / "tiny-gemma3"
    return write_tiny_model(path, seed=1, config=cfg), path


def test_the_memory_plan_sizes_a_block_as_one_groups_page(model):
    manifest = model[0]
    cfg = check_manifest(manifest)
    sizes = dict(budget_bytes=8 << 20, block_size=16, kv_dtype="f16", max_num_batched_tokens=24, max_num_seqs=3,
                 max_binding=LIMITS["maxStorageBufferBindingSize"])
    grouped, flat = plan_kv_pool(manifest, **sizes), plan_kv_pool(manifest, **sizes, kv_groups=False)
    layer_block = 16 * cfg.n_kv_heads * cfg.head_dim * 2  # f16 K (or V) of one layer, one block
    assert (grouped["block_bytes"], flat["block_bytes"]) == (2 * 2 * layer_block, 2 * 12 * layer_block)
    # one group's slot mapping (24 tokens) and block tables (3 x 32 blocks) at 256-byte strides, 6 times
    assert grouped["scratch_bytes"] - flat["scratch_bytes"] == 6 * 256 + 6 * 512 - 96 - 384
    for plan in (grouped, flat):
        assert plan["num_blocks"] == ((8 << 20) - plan["fixed_bytes"]) // plan["block_bytes"]


def test_shared_pages_hold_one_groups_layers_and_size_blocks_by_them():
    # Gemma 3 270M (18 layers, 1 KV head of 256; groups of 3) beside SmolLM2-135M (30 layers, 3 KV heads of 64)
    # in f16 pages: a Gemma page holds 3 layers (3,072 B a token) instead of 18 (18,432 B).
    gemma = gemma3_config(n_heads=4, n_kv_heads=1, head_dim=256, hidden=640)
    smollm2 = replace(gemma3_config(), architecture="llama", n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                      hidden=576, sliding_window=None)
    assert page_use(gemma, "f16", 16) == 2 * 3 * 16 * 256 * 2 == 49_152
    assert page_use(gemma, "f16", 16, kv_groups=False) == 2 * 18 * 16 * 256 * 2 == 294_912
    assert plan_gpu_pages([gemma], "f16") == (49_152, [16])
    # SmolLM2's 16-token block (368,640 B) sizes the page; Gemma's largest block that fits (64 tokens; 128 would
    # take 393,216 B) fills 196,608 B of it (53 %). Decoding at n tokens Gemma then holds ceil(n / 64) full-group
    # pages and at most 5 x 9 window pages, against ceil(n / 16) with every layer in a page: fewer pages from about
    # 1,000 tokens on (61 against 64 at 1k, 301 against 1,024 at 16k).
    assert plan_gpu_pages([smollm2, gemma], "f16") == (368_640, [16, 64])
    assert page_use(gemma, "f16", 64) == 196_608 and page_use(gemma, "f16", 128) == 393_216
    assert plan_gpu_pages([smollm2, gemma], "f16", kv_groups=False) == (368_640, [16, 16])
    # SmolLM2 at 64-token blocks sizes a page 4x as large: Gemma's 128 tokens would fit it, but the pool's block
    # sizes stop at 64 (config.ALLOWED_BLOCK_SIZES), so Gemma's block is 64 tokens there too.
    assert plan_gpu_pages([smollm2, gemma], "f16", block_size=64) == (1_474_560, [64, 64])


def grouped_backend(model) -> WebGpuBackend:
    """A WebGpuBackend over placeholder buffers (each its label), its weights uploaded, its pool in groups."""
    manifest, path = model
    cfg = check_manifest(manifest)
    ctx = SimpleNamespace(buffer=lambda nbytes, label, **kw: label, write=lambda buf, data, offset=0: None,
                          info=SimpleNamespace(limits=LIMITS, features=()))
    groups = KVGroups.of(cfg)
    b = WebGpuBackend(ctx, cfg, GpuLedger(1 << 30), block_size=16, kv_dtype="f16", max_num_batched_tokens=24,
                      max_num_seqs=3, kv_groups=groups)

    async def source(name: str) -> bytes:
        return (path / name).read_bytes()

    run_sync(upload_weights(b, manifest, source, None))
    b.scratch = Named()
    b.kv_kernels = KVKernels(ctx, GpuKVLayout(b.kv_spec, 4), cfg.n_heads, family="cpu")
    b.kv_pool = GpuKVPool(ctx, b.kv_kernels, cfg, b.ledger, groups=groups)
    b.kv_pool.caches = [SimpleNamespace(k=f"k{j}", v=f"v{j}") for j in range(groups.group_size)]
    return b


def test_each_layer_binds_its_slots_buffers_and_its_groups_ranges(model):
    b = grouped_backend(model)
    assert b.kv_groups.groups[0].layers == (5, 11) and b.kv_groups.where(6) == (3, 1)
    assert b.page_bytes_per_token == b.bytes_per_token // 6 == 2 * 2 * b.config.kv_dim * 2
    # group g's block tables start at g x 512 (3 x 32 u32s, rounded up), its slots at g x 256 (24 u32s)
    assert b.group_binding("block_tables", 6) == ("block_tables", 3 * 512, 512)
    assert b.group_binding("slot_mapping", 11) == ("slot_mapping", 0, 256)
    for key in (PlanKey.of(1, 1), PlanKey.of(24, 2)):
        body = layer_program(b, key)[0]
        writes = [d for d in body if d.shader == "kv_write"]
        attention = [d for d in body if d.slot in ("attn", "attn_window")]
        assert len(writes) == len(attention) == 12  # a dispatch per layer, as with one group
        for layer, (w, a) in enumerate(zip(writes, attention)):
            g, j = b.kv_groups.where(layer)
            assert w.bindings[2:] == (("slot_mapping", g * 256, 256), f"k{j}", f"v{j}")
            assert (a.bindings[1], a.bindings[2], a.bindings[3]) == (f"k{j}", f"v{j}", ("block_tables", g * 512, 512))
            assert a.slot == ("attn" if g == 0 else "attn_window")


def test_a_batch_without_the_groups_tables_is_refused(model):
    b = grouped_backend(model)
    i32 = lambda v: np.asarray(v, np.int32)  # noqa: E731
    batch = ForwardBatch(i32([1, 2]), i32([0, 1]), i32([0, 1]), i32([0, 2]), i32([[1]]), i32([2]))
    with pytest.raises(ValueError, match="holds 6 KV group.*the batch has 1.*kv_groups=False"):
        b._check(batch)
