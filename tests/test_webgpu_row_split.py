"""A matrix larger than the adapter's maxStorageBufferBindingSize (Gemma 3's tied embedding: 160 MiB of Q8_0 codes
against lavapipe's 128 MiB) is uploaded by rows (weight_upload.row_chunks): parts of equal rows (a multiple of 32)
whose bytes are the matrix's rows, the ledger reserving what memory_plan.weights_bytes planned; the plan runs the
embedding and the LM head once per part (tests/native/test_gemma3_wgpu_native.py runs it on lavapipe)."""
from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest

from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout
from pagedkv.backends.webgpu.memory_plan import weights_bytes
from pagedkv.backends.webgpu.plan import PlanKey, layer_program, row_parts
from pagedkv.backends.webgpu.weight_upload import row_chunks, upload_weights
from pagedkv.engine import run_sync
from pagedkv.gpu_budget import GpuLedger
from pagedkv.kv.spec import KVSpec
from pagedkv.model.tiny import write_tiny_model
from pagedkv.model.weights import check_manifest


def test_row_chunks_split_into_equal_aligned_parts_that_fit():
    # Gemma 3 270M's head: 262,144 rows of 640 Q8_0 weights = 160 MiB of codes, 10 MiB of scales
    assert row_chunks("q8_0", (262144, 640), 128 << 20) == [(0, 131072), (131072, 131072)]
    assert row_chunks("q8_0", (262144, 640), 1 << 30) == [(0, 262144)]
    assert row_chunks("q8_0", (100, 64), 64 * 48) == [(0, 32), (32, 32), (64, 32), (96, 4)]
    assert row_chunks("f32", (64,), 16) == [(0, 64)]  # vectors are never split
    with pytest.raises(ValueError, match="do not fit a binding of 100 bytes"):
        row_chunks("q8_0", (512, 64), 100)


def test_a_split_table_uploads_its_rows_and_the_plan_dispatches_each_part(tmp_path):
    manifest = write_tiny_model(tmp_path)  # vocab 512 x hidden 64 q8_0, tied: codes 64 bytes a row
    cfg = check_manifest(manifest)
    uploads = {}
    ctx = SimpleNamespace(buffer=lambda nbytes, label, **kw: label, write=lambda buf, data: uploads.update({buf: data}),
                          info=SimpleNamespace(limits={"maxStorageBufferBindingSize": 200 * 64}, features=()))
    b = WebGpuBackend(ctx, cfg, GpuLedger(1 << 30), block_size=16, kv_dtype="f32", max_num_batched_tokens=8,
                      max_num_seqs=1)

    async def source(name: str) -> bytes:
        return (tmp_path / name).read_bytes()

    run_sync(upload_weights(b, manifest, source, None))
    assert "token_embd.weight" not in b.weights
    assert [(first, rows) for first, rows, _ in b.weight_rows["token_embd.weight"]] == [(0, 192), (192, 192),
                                                                                        (384, 128)]
    assert b.ledger.by_kind()["weights"] == weights_bytes(manifest, 200 * 64)
    whole = (tmp_path / manifest["tensors"]["token_embd.weight"]["file"]).read_bytes()
    qs = manifest["tensors"]["token_embd.weight"]["parts"]["qs"]
    codes = whole[qs["offset"]:qs["offset"] + qs["nbytes"]]
    assert b"".join(bytes(uploads[f"w:token_embd.weight#{i}.qs"]) for i in range(3)) == codes

    head_pass = layer_program_head(b)
    assert [(d.shader, dict(d.constants).get("ROW_BASE"), dict(d.constants).get("ROW_END"))
            for d in head_pass["embedding"]] == [("embedding", 0, 192), ("embedding", 192, 384),
                                                 ("embedding", 384, 512)]
    assert [(d.slot, dict(d.constants)["Y_OFFSET"], dict(d.constants)["Y_STRIDE"]) for d in head_pass["lm_head"]] == [
        ("lm_head", 0, 512), ("lm_head", 192, 512), ("lm_head_last", 384, 512)]
    assert [rows for _, rows, _ in row_parts(b, "token_embd.weight")] == [192, 192, 128]


def layer_program_head(b) -> dict:
    """The embedding and LM head dispatches of a greedy decode step of the gpu family."""
    layout = GpuKVLayout(KVSpec.of(b.config, block_size=16, dtype="f32"), 4)
    limits = SimpleNamespace(info=SimpleNamespace(limits={"maxComputeWorkgroupsPerDimension": 65535}))
    b.kernels, b.kv_kernels = "gpu", KVKernels(limits, layout, b.config.n_heads, family="gpu")
    caches = [SimpleNamespace(k=f"k{i}", v=f"v{i}") for i in range(b.config.n_layers)]
    b.kv_pool = SimpleNamespace(caches=caches, cache_of=caches.__getitem__)
    b.scratch = defaultdict(str)
    first, last = layer_program(b, PlanKey.of(1, 1, greedy=True))
    return {"embedding": [d for d in first if d.slot == "embedding"],
            "lm_head": [d for d in last if d.slot.startswith("lm_head")]}
