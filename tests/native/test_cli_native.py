"""`python3 -m pagedkv generate --backend wgpu`, run as a real subprocess on lavapipe (tests/test_cli.py: CPU)."""
from __future__ import annotations

import json

from pagedkv.backends.webgpu import tuning
from model_fixtures import tiny_dir  # noqa: F401  (fixture)
from test_cli import CHAT, run_cli, write_messages


def test_generate_on_wgpu_prints_the_cpu_json_plus_timings_and_adapter(tiny_dir, tmp_path, native_device):  # noqa: F811
    messages = write_messages(tmp_path, CHAT)
    args = ("generate", "--model", str(tiny_dir), "--messages-json", messages, "--max-tokens", "8", "--greedy", "--json")
    gpu = run_cli(*args, "--backend", "wgpu")
    assert gpu.returncode == 0, gpu.stderr
    cpu = json.loads(run_cli(*args).stdout)
    out = json.loads(gpu.stdout)
    assert list(out) == ["prompt_ids", "output_ids", "text", "timings", "adapter", "kernels"]
    assert {k: out[k] for k in ("prompt_ids", "output_ids", "text")} == cpu
    assert out["output_ids"] == [321, 321, 321, 321, 242, 242, 242, 242]
    assert sorted(out["timings"]) == ["decode_tok_s", "decode_tokens", "first_decode_ms", "pipelined", "prefill_tok_s",
                                      "ttft_ms"]
    assert out["timings"]["pipelined"] is True  # the decode chain: step n+1 submitted before step n's ids are read
    assert out["timings"]["ttft_ms"] > 0 and out["timings"]["decode_tok_s"] > 0 and out["timings"]["first_decode_ms"] > 0
    assert out["timings"]["decode_tokens"] == 6  # 8 tokens: the prefill's, the first decode step's, then 6 timed
    assert out["adapter"] == {"name": native_device.info.name, "backend": native_device.info.backend,
                              "features": list(native_device.info.features)}
    name = native_device.info.name  # lavapipe: auto takes the cpu family, untuned
    assert out["kernels"] == {"family": "cpu", "why": f"auto: {name} is a software adapter (llvmpipe)"}


def test_generate_with_the_gpu_family_tunes_once_then_reuses_the_choice(tiny_dir, tmp_path):  # noqa: F811
    args = ("generate", "--model", str(tiny_dir), "--messages-json", write_messages(tmp_path, CHAT), "--max-tokens",
            "8", "--greedy", "--json", "--backend", "wgpu", "--kernels", "gpu", "--tuning-cache",
            str(tmp_path / "tuning.json"))
    first, again = (json.loads(run_cli(*args).stdout) for _ in range(2))
    plain = json.loads(run_cli(*args, "--no-pipeline").stdout)  # each step waits for its ids: the same tokens
    assert first["output_ids"] == again["output_ids"] == plain["output_ids"] == [321, 321, 321, 321, 242, 242, 242, 242]
    assert (first["timings"]["pipelined"], plain["timings"]["pipelined"]) == (True, False)
    assert (first["kernels"]["family"], first["kernels"]["why"]) == ("gpu", "kernels=gpu was asked for")
    tuned, cached = first["kernels"]["tuning"], again["kernels"]["tuning"]
    assert (tuned["source"], cached["source"]) == ("tuned", "cache")
    assert cached["key"] == tuned["key"] and cached["choice"] == tuned["choice"]
    assert tuned["choice"]["matvec"] in (64, 128, 256) and tuple(tuned["choice"]["matmul"]) in tuning.MATMUL_CANDIDATES
    assert json.loads((tmp_path / "tuning.json").read_text())[tuned["key"]]["choice"] == tuned["choice"]


def test_backend_choices_are_documented_and_checked(tmp_path):
    help_text = run_cli("generate", "--help").stdout
    assert "{cpu,wgpu}" in help_text and "wgpu-py" in help_text
    bad = run_cli("generate", "--messages-json", write_messages(tmp_path, CHAT), "--backend", "metal")
    assert bad.returncode == 2 and "argument --backend: invalid choice: 'metal'" in bad.stderr
