"""`npm run generate` (pagedkv.generate): one chat completion, or a raw --prompt continued with no chat template,
through the page's engine in headless Chromium prints what the CPU CLI (`python3 -m pagedkv generate`) prints for
the same messages or prompt (the tab's CPU path with f32 activations, as the CLI's numpy computes), plus the tab's
timings."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import build
from pagedkv import cli


@pytest.mark.parametrize("given", ["messages", "prompt"])
def test_generate_in_the_page_prints_the_cpu_clis_ids_and_timings(base_url, tmp_path, capsys, given):
    messages = tmp_path / "chat.json"
    messages.write_text(json.dumps([{"role": "user", "content": "What is the capital of France?"}]))
    source = ["--messages-json", str(messages)] if given == "messages" else ["--prompt", "The capital of France is"]
    args = [*source, "--max-tokens", "6", "--greedy", "--json"]
    assert cli.main(["generate", "--model", str(build.DIST / "models" / "tiny-random"), *args]) == 0
    want = json.loads(capsys.readouterr().out)
    # Its own process: Playwright's sync API runs once per thread, and the tests' browser is open here.
    env = dict(os.environ, PYTHONPATH=str(build.ROOT / "py"), PAGEDKV_BENCH_BUILT="1")  # base_url built dist/
    proc = subprocess.run([sys.executable, "-m", "pagedkv.generate", *args, "--model", "tiny-random",
                           "--backend", "cpu", "--activations", "f32"], cwd=build.ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert {key: got[key] for key in ("prompt_ids", "output_ids", "text")} == want
    assert got["backend"] == "cpu"
    assert set(got["timings"]) == {"ttft_ms", "prefill_tok_s", "decode_tok_s"} and got["timings"]["ttft_ms"] > 0

