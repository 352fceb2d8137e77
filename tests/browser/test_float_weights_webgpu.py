"""Models whose matrices are f32, f16 or bf16 (GGUF files such as SmolLM2-135M-Instruct-f16.gguf) through the
WebGPU backend: embedding_ / matvec_ / matmul_<type> (shaders/<type>_words.wgsl), q|k|v and gate|up as float
stacks with their norm weight after the weights (backends/webgpu/fused.py), the tied f16 / bf16 / f32 table as
the LM head; greedy ids equal the numpy reference's. The page (SwiftShader) runs f16 on the cpu family;
tests/native/test_float_weights_native.py runs every float type in both families."""
from __future__ import annotations

import pytest

import build
from browser_pages import install_modules
from pagedkv.backends.webgpu.model_kernels import FLOATS
from pagedkv.model.tiny import write_tiny_model

MATRICES = ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(scope="module")
def worker(ready_page):
    """The page (or native worker) with engine_cases loaded, and tiny-f32 / tiny-f16 / tiny-bf16 (every matrix
    of that type, f32 norms) written into dist/models/."""
    for dtype in FLOATS:
        write_tiny_model(build.DIST / "models" / f"tiny-{dtype}", seed=1,
                         dtypes={f"{m}.weight": dtype for m in MATRICES})
    return install_modules(ready_page, "engine_cases")


def check_greedy(worker, dtype: str, kernels: str) -> None:
    """Four concurrent requests, chunked prefill (matmul) and decode (the `kernels` family's matvec), on the
    tiny-<dtype> model: the same greedy ids as numpy, the LM head on the type's own matvec (the gpu family's
    leaving each workgroup's best row, not logits: matvec_io_argmax.wgsl)."""
    r = worker.py("import json, engine_cases as ec\n"
                  f"json.dumps(await ec.tiny_greedy(16, 'f32', 8, kernels={kernels!r}, model_name='tiny-{dtype}'))")
    assert [len(o) for o in r["gpu"]] == [8, 8, 8, 8]
    assert r["gpu"] == r["ref"]
    gpu_heads = [f"matvec_gpu_sg_{dtype}_argmax", f"matvec_gpu_{dtype}_argmax"]
    heads = {"cpu": [f"matvec_{dtype}"], "gpu": gpu_heads}[kernels]
    assert r["head"][-2] in heads, r["head"]  # the LM head, then argmax (the gpu family fuses the final norm)


def test_f16_model_greedy_equals_numpy(worker):
    check_greedy(worker, "f16", "cpu")
