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
from pagedkv import cli
from gguf_models import TINY_FAMILIES, tiny_gguf
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


@pytest.mark.parametrize("name", sorted(TINY_FAMILIES))
def test_the_new_families_on_the_tabs_cpu_path_give_the_references_ids(base_url, capsys, name):
    """tiny qwen3 / smollm3 / gemma3 (q / k norms, a layer without rotary, 32-token windows in KV groups, GeGLU)
    on the tab's CPU path from a raw prompt past one window: with f32 activations exactly the CPU CLI's (numpy
    reference) ids, which tests/test_gguf_families.py holds to llama.cpp's, teacher forced. (Free running from
    this prompt with 8-bit activations, tiny-gemma3 and tiny-smollm3 part from llama.cpp at the first id, a near
    tie of 0.30 and 0.05, so that comparison would test nothing after it; the real Gemma 3's default path is
    held to llama.cpp in tests/browser/test_gemma3_page.py.)"""
    path = tiny_gguf(name, cached_gguf())
    env = dict(os.environ, PYTHONPATH=str(build.ROOT / "py"), PAGEDKV_BENCH_BUILT="1")  # base_url built dist/
    prompt = ("Alice went to the market on Monday, bought seven apples, three pears and a loaf of bread, then "
              "walked home along the river while the sun was setting behind the hills of the old town.")
    args = ["--gguf", str(path), "--prompt", prompt, "--max-tokens", str(NUM_TOKENS), "--greedy", "--json"]
    assert cli.main(["generate", *args]) == 0
    want = json.loads(capsys.readouterr().out)

    proc = subprocess.run([sys.executable, "-m", "pagedkv.generate", *args, "--backend", "cpu", "--activations", "f32"],
                          cwd=build.ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["backend"] == "cpu" and len(got["prompt_ids"]) > 32 and len(got["output_ids"]) == NUM_TOKENS
    assert {k: got[k] for k in ("prompt_ids", "output_ids", "text")} == want
