"""llama.cpp's Q4_K_M mix (pagedkv.model.tiny.Q4_K_M_DTYPES: q4_K q / k beside a q6_K v, a q4_K gate beside a
q6_K up in layer 0) through the WebGPU backend: types with no lossless common type run as separate matrices
written into the stacked path's layouts (backends/webgpu/fused.stacks), and greedy ids of a chunked prefill
(matmul) and decode (matvec) equal the numpy reference's. tests/native/test_unstacked_weights_native.py runs
this on wgpu-py with the gpu family too, and the q4_1 / q8_0 split through the gpu family's tiled matmul."""
from __future__ import annotations

import pytest

import build
from browser_pages import install_modules
from pagedkv.model.tiny import GPU_MATMUL_SPLIT_DTYPES, Q4_K_M_DTYPES, mixed_config, write_tiny_model

MODELS = {"tiny-q4km": (Q4_K_M_DTYPES, mixed_config()), "tiny-split-q41-q80": (GPU_MATMUL_SPLIT_DTYPES, None)}


@pytest.fixture(scope="module")
def worker(ready_page):
    """The page (or native worker) with engine_cases loaded, and the split models written into dist/models/."""
    for name, (dtypes, config) in MODELS.items():
        write_tiny_model(build.DIST / "models" / name, seed=0, dtypes=dtypes, config=config)
    return install_modules(ready_page, "engine_cases")


def greedy(worker, model: str, kernels: str) -> dict:
    """tiny_greedy of `model` in kernel family `kernels`, with the plan's member dispatches of layer 0 / 1."""
    return worker.py(
        "import json, engine_cases as ec\n"
        "from pagedkv.backends.webgpu.plan import PlanKey, layer_program\n"
        f"r = await ec.tiny_greedy(16, 'f32', 8, kernels={kernels!r}, model_name={model!r})\n"
        f"b = await ec.backend({model!r}, budget_bytes=8 * ec.MIB, block_size=16, kv_dtype='f32',"
        f" max_num_batched_tokens=24, max_num_seqs=4, kernels={kernels!r})\n"
        "layers = layer_program(b, PlanKey.of(24, 1))[0]\n"
        "r['slots'] = [d.slot for d in layers if d.slot.startswith('lin_')]\n"
        "r['prefill'] = sorted({d.shader for d in layers if d.shader.startswith('mat')})\n"
        "b.destroy()\n"
        "json.dumps(r)")


def check(r: dict, prefill_shaders: list[str]) -> None:
    assert [len(o) for o in r["gpu"]] == [8, 8, 8, 8]
    assert r["gpu"] == r["ref"]
    # layer 0 unstacked (q, k, v; gate, up), layer 1 stacked; lm_head is in the second pass
    assert r["slots"] == ["lin_q", "lin_kv", "lin_kv", "lin_h", "lin_gate", "lin_gate", "lin_down",
                          "lin_qkv", "lin_h", "lin_ffn", "lin_down"]
    assert r["prefill"] == prefill_shaders


def test_q4_k_m_mix_greedy_equals_numpy(worker):
    check(greedy(worker, "tiny-q4km", "cpu"), ["matmul_q4_K", "matmul_q6_K"])
