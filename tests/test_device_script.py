"""bench/device/gpu.sh's bounds and its recording of each step into $OUT (bench/device/record_step.py): the
device gives 15 minutes in all, so a run's deadlines add up to at most 300 s, and a run killed at any point
returns the steps that ended before."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "device" / "gpu.sh"


def plans() -> list[dict[str, int]]:
    """Each PLAN="name:seconds ..." of the script (the GPU's, then GPU_QUICK's), in order."""
    return [{name: int(s) for name, s in re.findall(r"([\w.]+):(\d+)", body)}
            for body in re.findall(r'PLAN="([^"]*)"', SCRIPT.read_text())]


def test_deadlines_add_up_to_at_most_300_s_and_cover_every_step():
    gpu, quick = plans()
    assert (sum(gpu.values()), sum(quick.values())) == (297, 295)
    # every step the script takes is in the plan it runs under (one outside would have no deadline)
    steps = set(re.findall(r'^\s*step ([\w.]+) ', SCRIPT.read_text(), re.MULTILINE))
    assert steps - {"setup", "nvidia_smi", "adapter_icd"} <= set(quick) and steps <= set(gpu)
    assert {"generate_smollm2_gpu", "generate_smollm2_cpu", "generate_smollm2_gpu_plain",
            "generate_1.5b_gpu", "generate_1.5b_gpu_plain", "lm_head", "kernels_prefill"} <= set(gpu)
    assert "generate_smollm2_cpu_2" not in gpu and "generate_smollm2_gpu_plain_2" not in gpu  # baselines once


def record(out: Path, work: Path, name: str, rc: int, stdout: str, log: str = "") -> None:
    (work / f"{name}.json").write_text(stdout)
    (work / f"{name}.log").write_text(log)
    subprocess.run([sys.executable, str(ROOT / "bench" / "device" / "record_step.py"), str(out), str(work), name,
                    str(rc), "7", "20"], check=True)


def test_each_step_lands_in_out_as_it_ends(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    record(out, work, "adapter", 0, json.dumps({"device": "NVIDIA H100 80GB HBM3", "vendor": "nvidia"}))
    (work / "card").write_text("NVIDIA H100 80GB HBM3\n")
    record(out, work, "kernels", 124, '{"kernels": [{"kernel": "stream_re', "a\nb\nc\nd\ne\nf\n")
    lines = [json.loads(s) for s in (out / "steps.jsonl").read_text().splitlines()]
    assert [(s["step"], s["card"], s["exit"], s["seconds"], s["limit_s"]) for s in lines] == [
        ("adapter", "NVIDIA H100 80GB HBM3", 0, 7, 20), ("kernels", "NVIDIA H100 80GB HBM3", 124, 7, 20)]
    assert lines[0]["result"] == {"device": "NVIDIA H100 80GB HBM3", "vendor": "nvidia"}
    # killed mid-print: no result, what it printed kept, and the log's last lines
    assert (lines[1]["result"], lines[1]["stdout_tail"], lines[1]["log_tail"]) == (
        None, '{"kernels": [{"kernel": "stream_re', "b\nc\nd\ne\nf")
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == ["adapter", "kernels"] and "result" not in summary["steps"][0]
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["adapter.log", "kernels.log"]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "steps.jsonl", "summary.json"]
