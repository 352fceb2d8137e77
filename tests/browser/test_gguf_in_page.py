"""`npm run generate -- --gguf FILE` on the tiny llama and qwen2 GGUFs (tests/gguf_models.py): converted on the fly,
run by the page's WebGPU engine, greedy ids equal to llama.cpp's under the near-tie rule (one kernel family each:
the bias and rope paths they share live in rope.wgsl)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import build
import pytest
from gguf_models import tiny_gguf
from llama_reference import first_divergence, llama_cpp_greedy, near_tie
from model_fixtures import cached_gguf

NUM_TOKENS = 8


@pytest.mark.parametrize("name,kernels", [("tiny-llama", "cpu"), ("tiny-qwen2", "gpu")])
def test_a_gguf_in_the_page_gives_llama_cpps_greedy_ids(base_url, tmp_path, name, kernels):
    path = tiny_gguf(name, cached_gguf())
    messages = tmp_path / "chat.json"
    messages.write_text(json.dumps([{"role": "user", "content": "What is the capital of France?"}]))
    # Its own process: Playwright's sync API runs once per thread, and the tests' browser is open here.
    env = dict(os.environ, PYTHONPATH=str(build.ROOT / "py"), PAGEDKV_BENCH_BUILT="1")  # base_url built dist/
    proc = subprocess.run([sys.executable, "-m", "pagedkv.generate", "--gguf", str(path), "--messages-json",
                           str(messages), "--max-tokens", str(NUM_TOKENS), "--greedy", "--backend", "webgpu", "--kernels", kernels, "--json"],
                          cwd=build.ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["backend"] == "webgpu" and got["kernels"][0] == kernels
    ref = llama_cpp_greedy(path, got["prompt_ids"], 16)
    result = first_divergence(got["output_ids"], ref)
    print(name, kernels, result)  # the per-file agreement of the page (pytest -s)
    assert len(got["output_ids"]) == NUM_TOKENS
    assert result["equal"] or near_tie(result["margin"]), result
