"""The K-quant GGUFs made at test time (tests/gguf_models.py TINY_K: q4_K, q5_K, qwen2 q6_K and both Q4_K_M mixes,
whose layers with q6_K attn_v run unstacked) through the WebGPU backend in Chromium: 16 greedy ids equal
llama.cpp's under the near-tie rule, against the same reference ids tests/test_gguf_kquants.py (numpy) and
tests/native/test_gguf_native.py (lavapipe) compare with. Every file runs in one page and one call: converted here
(convert_cached), copied into dist/models/, decoded by WebGpuBackend directly (the page's `auto` backend would pick
the CPU on SwiftShader). `pytest -s` prints each file's agreement."""
from __future__ import annotations

import json
import shutil

import build
import pytest
from browser_pages import install_modules
from gguf_models import TINY_K, tiny_gguf
from llama_reference import first_divergence, llama_cpp_greedy, near_tie
from model_fixtures import cached_gguf
from test_gguf_architectures import MODELS, NUM_TOKENS, prompt_ids

from pagedkv.model.convert import convert_cached
from pagedkv.model.weights import ModelWeights

# Runs in the worker: each model's greedy ids, one request, its prompt prefilled in one step (the matmuls), then
# NUM_TOKENS - 1 decode steps (the matvecs); KV in f32 as the numpy reference keeps it. The cpu kernel family, which
# `auto` picks on SwiftShader: the gpu family's K-quant matvecs took ~20 s per file here, against ~5 s (its kernels
# are checked per type in test_model_kernels.py).
DECODE = """
import json, engine_cases as ec
from pagedkv.backends.webgpu.plan import PlanKey, layer_program
from pagedkv.tokenizer import Tokenizer
out = {}
for name, prompt in RUNS.items():
    manifest, _ = await ec.model_files(name)
    b = await ec.backend(name, budget_bytes=64 * ec.MIB, block_size=16, kv_dtype='f32',
                         max_num_batched_tokens=64, max_num_seqs=1, kernels='cpu')
    ids, _ = await ec.run_engine(b, Tokenizer.from_manifest(manifest), [prompt], NUM_TOKENS,
                                 max_num_batched_tokens=64, max_num_seqs=1)
    layers = layer_program(b, PlanKey.of(1, 1))[0]
    b.destroy()
    out[name] = {"ids": ids[0], "unstacked": any(d.slot == "lin_q" for d in layers)}
json.dumps(out)
"""


@pytest.fixture(scope="module")
def page_ids(ready_page) -> tuple[dict, dict]:
    """({file: {"ids": Chromium's greedy ids, "unstacked": whether a layer runs q, k, v apart}}, {file: llama.cpp's
    reference}) of every TINY_K file."""
    runs, refs = {}, {}
    for name in sorted(TINY_K):
        path = tiny_gguf(name, cached_gguf())
        converted = convert_cached(path, MODELS)
        prompt = prompt_ids(ModelWeights.load(converted))
        shutil.copytree(converted, build.DIST / "models" / name, dirs_exist_ok=True)
        runs[name] = prompt
        refs[name] = llama_cpp_greedy(path, prompt, NUM_TOKENS)
    worker = install_modules(ready_page, "engine_cases")
    code = f"RUNS = {json.dumps(runs)}\nNUM_TOKENS = {NUM_TOKENS}\n" + DECODE
    return worker.py(code), refs


@pytest.mark.parametrize("name", sorted(TINY_K))
def test_k_quant_file_in_chromium_gives_llama_cpps_greedy_ids(page_ids, name):
    runs, refs = page_ids
    ids = runs[name]["ids"]
    result = first_divergence(ids, refs[name])
    print(name, result)  # the per-file agreement in Chromium (pytest -s)
    assert runs[name]["unstacked"] == name.endswith("q4_k_m")  # a Q4_K_M layer multiplies q, k, v one by one
    assert len(ids) == NUM_TOKENS
    assert result["equal"] or near_tie(result["margin"]), (name, result)
