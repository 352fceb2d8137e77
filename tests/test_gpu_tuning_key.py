"""The first-boot tuning's cache key and file store (backends/webgpu/tuning.py), in CPython (no GPU)."""
from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.backends.webgpu.tuning import Budget, JsonFileStore, JsonInStore, cache_key
from pagedkv.engine import run_sync
from pagedkv.kv.disk_tier import MemoryStore
from pagedkv.model.config import ModelConfig

SMOLLM2 = ModelConfig("llama", 30, 576, 9, 3, 64, 1536, 49152, 100000.0, "adjacent_pairs", 1e-5, 8192, True)


def test_the_key_changes_with_adapter_runtime_shaders_and_model_shape_only():
    key = cache_key("NVIDIA / ampere", "Chrome/131", ["fn main() {}"], SMOLLM2)
    assert key == cache_key("NVIDIA / ampere", "Chrome/131", ["fn main() {}"], SMOLLM2)
    assert key.startswith("gpu-tuning:") and len(key) == len("gpu-tuning:") + 32
    others = [cache_key("Apple / m2", "Chrome/131", ["fn main() {}"], SMOLLM2),
              cache_key("NVIDIA / ampere", "Chrome/132", ["fn main() {}"], SMOLLM2),
              cache_key("NVIDIA / ampere", "Chrome/131", ["fn main() { }"], SMOLLM2),
              cache_key("NVIDIA / ampere", "Chrome/131", ["fn main() {}"], replace(SMOLLM2, ffn=2048))]
    assert len({key, *others}) == 5
    # the layer count and context length do not change a kernel's shapes
    assert cache_key("NVIDIA / ampere", "Chrome/131", ["fn main() {}"], replace(SMOLLM2, n_layers=2)) == key


def test_the_file_store_keeps_every_key(tmp_path):
    async def run():
        store = JsonFileStore(tmp_path / "sub" / "tuning.json")
        assert await store.get("a") is None
        await store.put("a", {"choice": {"matvec": 128, "matmul": [64, 4]}})
        await store.put("b", {"choice": {"matvec": 64, "matmul": [64, 8]}})
        again = JsonFileStore(tmp_path / "sub" / "tuning.json")
        return await again.get("a"), (await store.get("b"))["choice"]["matmul"]

    # run_sync, not asyncio.run: in the whole suite Playwright's sync API keeps a loop running in this thread
    assert run_sync(run()) == ({"choice": {"matvec": 128, "matmul": [64, 4]}}, [64, 8])


def test_the_page_store_keeps_every_key_and_reads_a_damaged_file_as_empty():
    files = MemoryStore()

    async def run():
        store = JsonInStore(files)
        assert await store.get("a") is None
        await store.put("a", {"choice": {"matvec": 128, "matmul": [64, 4]}})
        await store.put("b", {"choice": {"matvec": 64, "matmul": [64, 8]}})
        kept = await JsonInStore(files).get("a"), sorted(files.files)
        files.files["gpu_tuning.json"] = b'{"a": {"choice"'  # a write cut short
        damaged = await store.get("a")
        await store.put("c", {"choice": {"matvec": 256, "matmul": [128, 8]}})  # tuned again, the file rewritten
        return kept, damaged, sorted(json.loads(files.files["gpu_tuning.json"]))

    kept, damaged, keys = run_sync(run())
    assert kept == ({"choice": {"matvec": 128, "matmul": [64, 4]}}, ["gpu_tuning.json"])
    assert damaged is None and keys == ["c"]


def test_matmul_workgroup_memory_of_the_candidates():
    assert ops.matmul_gpu_workgroup_bytes((64, 8)) == 13824  # the default fits WebGPU's minimum 16 KiB
    assert ops.matmul_gpu_workgroup_bytes((64, 4)) == 13824
    assert ops.matmul_gpu_workgroup_bytes((128, 8)) == 18432
    assert ops.matmul_gpu_workgroup_bytes((128, 16)) == 23040
    assert ops.matmul_gpu_workgroup_bytes((64, 8, 2)) == (64 + 16) * 144  # half the tokens staged
    assert ops.matmul_gpu_workgroup_bytes((64, 8, 1)) == 10368
    assert ops.matmul_gpu_workgroup_bytes((128, 16, 1)) == (128 + 8) * 144


def test_matmul_tokens_a_thread_set_the_grid_and_constants():
    four, two, one = (ops.matmul_gpu_call("q4_1", 3072, 576, 128, shape, swiglu=True)
                      for shape in ((64, 8), (64, 8, 2), (64, 8, 1)))
    assert (four.workgroups, two.workgroups, one.workgroups) == ((48, 4, 1), (48, 8, 1), (48, 16, 1))
    assert "THREAD_TOKENS" not in dict(four.constants) and four.constants == ops.matmul_gpu_call(
        "q4_1", 3072, 576, 128, (64, 8, 4), swiglu=True).constants  # 4 is the default: the same pipeline
    assert dict(two.constants)["THREAD_TOKENS"] == 2 and dict(one.constants)["THREAD_TOKENS"] == 1
    for bad in ((64, 8, 3), (64, 8, 8), (64,), (64, 8, 1, 1)):
        with pytest.raises(ValueError, match="matmul"):
            ops.matmul_gpu_call("q4_1", 3072, 576, 128, bad)


def test_the_budget_counts_only_measuring_time():
    budget = Budget(30.0)
    time.sleep(0.05)  # compiling or making inputs: not counted
    assert not budget.over() and budget.left_ms == 30.0
    with budget.running():
        time.sleep(0.01)
    assert not budget.over() and 0 < budget.left_ms <= 20.0
    with budget.running():
        time.sleep(0.03)
    assert budget.over()
    assert Budget(0.0).over()  # budget_ms=0: every candidate "over budget"
