"""A model mixing weight types per tensor (pagedkv.model.tiny.MIXED_DTYPES: every quantized type, the q6_K
tied embedding as the LM head) through the WebGPU backend: each matrix runs the kernels of its own type, and
greedy ids and logits equal the numpy reference's. Cases: tests/browser/engine_cases.py."""
from __future__ import annotations

import json

import pytest

import build
from browser_pages import install_modules
from pagedkv.model.tiny import MIXED_DTYPES, mixed_config, write_tiny_model

MODEL = "tiny-mixed"


@pytest.fixture(scope="module")
def worker(ready_page):
    """The page (or native worker) with engine_cases loaded, and the mixed model written into dist/models/."""
    write_tiny_model(build.DIST / "models" / MODEL, seed=0, dtypes=MIXED_DTYPES, config=mixed_config())
    return install_modules(ready_page, "engine_cases")


def run(worker, call: str):
    return worker.py(f"import json, engine_cases as ec\njson.dumps(await ec.{call})")


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_mixed_types_greedy_equals_numpy(worker, kernels):
    """Four concurrent requests with chunked prefill (matmul) and decode (matvec of the `kernels` family)."""
    r = run(worker, f"tiny_greedy(16, 'f32', 8, kernels={kernels!r}, model_name={MODEL!r})")
    assert [len(o) for o in r["gpu"]] == [8, 8, 8, 8]
    assert r["gpu"] == r["ref"]


def test_mixed_types_logits_match_numpy(worker):
    """Prefill and decode logits within 1e-4 of max |logit| (f32 KV), as the single-type tiny model's."""
    prompts = [[5, 9, 200, 31, 7], list(range(40, 63)), list(range(300, 317))]
    r = run(worker, f"logits_vs_numpy({MODEL!r}, {json.dumps(prompts)}, 'f32', 8)")
    for step in ("prefill", "decode"):
        assert r[step]["max_abs"] <= 1e-4 * r[step]["scale"], r
        assert r[step]["argmax_equal"], r
