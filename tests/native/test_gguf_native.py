"""`python3 -m pagedkv generate --gguf FILE --backend wgpu` on lavapipe: the tiny llama and qwen2 GGUFs
(tests/gguf_models.py), K-quant ones included, give llama.cpp's greedy ids under the near-tie rule
(tests/browser/test_gguf_in_page.py: the same in Chromium)."""
from __future__ import annotations

import json

import pytest
from gguf_models import TINY_K, _tensor_specs, tiny_gguf
from llama_reference import first_divergence, llama_cpp_greedy, near_tie
from model_fixtures import cached_gguf
from test_cli import CHAT, run_cli, write_messages

from pagedkv.model.quants import BY_GGUF, common_type


def stacked_qkv_fits(name: str) -> bool:
    """Whether every layer's q|k|v types of TINY_K[name] meet in a lossless common type (the GPU stacks them)."""
    types = {n: BY_GGUF[t].name for n, _, t, _ in _tensor_specs(TINY_K[name])}
    return all(common_type({types[f"blk.{i}.attn_{p}.weight"] for p in "qkv"})
               for i in range(TINY_K[name]["layers"]))


def test_the_q4_k_m_mixes_run_unstacked_layers():
    """The Q4_K_M mixes (q6_K attn_v beside q4_K attn_q / attn_k) have layers whose q|k|v the GPU multiplies one
    by one (fused.stacks); the other K files stack every layer."""
    assert sorted(name for name in TINY_K if not stacked_qkv_fits(name)) == ["tiny-llama-q4_k_m", "tiny-qwen2-q4_k_m"]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", *sorted(TINY_K)])
def test_a_gguf_on_wgpu_gives_llama_cpps_greedy_ids(tmp_path, native_device, name):
    path = tiny_gguf(name, cached_gguf())
    out = run_cli("generate", "--gguf", str(path), "--gguf-cache", str(tmp_path / "cache"), "--backend", "wgpu",
                  "--messages-json", write_messages(tmp_path, CHAT), "--max-tokens", "8", "--greedy", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    result = first_divergence(got["output_ids"], llama_cpp_greedy(path, got["prompt_ids"], 16))
    print(name, native_device.info.name, result)  # the per-file agreement on this adapter (pytest -s)
    assert len(got["output_ids"]) == 8
    assert result["equal"] or near_tie(result["margin"]), result
