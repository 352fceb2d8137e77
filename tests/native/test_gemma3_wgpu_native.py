"""Gemma 3 270M (the pinned GGUF) on the WebGPU backend, wgpu-py on lavapipe, both kernel families: llama.cpp's
greedy ids (tests/golden/gemma3_golden.json) teacher forced through LLMEngine (tests/forced_rows.py: its scheduler,
KV groups and decode path; the window layers hold only their window) under tests/test_gemma3.py's near-tie rule
(an id may differ where either side's margin between the two ids is a near tie): cases 0 and 1 (6 and 19 prompt
tokens) x 24 ids in both families, and cases 3 and 5 (16 and 6 tokens) x 8 ids in the cpu family, which runs in
shared WebGPU pages beside tiny-llama (a page: one block of one of Gemma's KV groups).

What it takes that the tiny models do not: head_dim 256, a 262,144-row tied head whose 160 MiB of Q8_0 codes
exceed lavapipe's 128 MiB binding (split by rows: weight_upload.row_chunks; the embedding and the LM head run
one dispatch per part), q5_0 / q8_0 / K-quant projections, and a residual stream past f16's range, which the gpu
family's f16 matvecs (on: lavapipe has shader-f16) normalise before their f16 cast. Its 1,783-token case x 4 ids
(the long prefill attention in passes: 4 of 512 keys in the cpu family, 2 of 1,024 in the gpu family) takes
lavapipe ~100 s of CPU in the cpu family and 4-16x that in the gpu family, so it is a benchmark here:
`python3 -m bench --only gemma3_long` (both families and the tab on SwiftShader, bench/results/gemma3_long.json).
The suite runs it on the numpy reference and the tab's CPU path, and the passes at kernel level on both emulators
and in the engine on a tiny head-256 Gemma (tests/native/test_prefill_passes_native.py)."""
from __future__ import annotations

import json

import pytest
from forced_rows import forced_rows
from llama_reference import forced_differences
from model_fixtures import ROOT, gemma3_gguf  # noqa: F401  (pytest fixture)
from test_gemma3 import GOLDEN
from test_model_families_native import model_files

from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.backends.webgpu.memory_plan import weights_bytes
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.backends.webgpu.shared_pages import page_use
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.gpu_budget import MIB
from pagedkv.model.convert import convert_cached
from pagedkv.model.weights import check_manifest
from pagedkv.shared_gpu import GpuModel, shared_gpu_engine
from pagedkv.tokenizer import Tokenizer

# (golden case, ids forced) per kernel family: the gpu family is 4-16x slower on lavapipe, so it runs fewer
CASES = {"cpu": ((0, 24), (1, 24), (3, 8), (5, 8)), "gpu": ((0, 24), (1, 24))}


def golden(case: int, n: int) -> dict:
    """The first n of llama.cpp's ids and margins of golden case `case`."""
    g = GOLDEN["cases"][case]
    return {"prompt_ids": g["prompt_ids"], "output_ids": g["output_ids"][:n], "margins": g["margins"][:n]}


async def teacher_forced(manifest: dict, shards: dict, kernels: str, cases: tuple | None = None,
                         chunk: int = 32, shared: bool = False) -> dict:
    """Our (argmax, margin) rows after each prompt and each of llama.cpp's ids but the last, per case
    ((golden case, ids) pairs; CASES[kernels] by default), and the head's split; prompts prefilled in chunks of
    `chunk` tokens. shared: Gemma beside tiny-llama in one pool of shared WebGPU pages (shared_gpu_engine, KV
    groups: a page holds one block of one of Gemma's groups) instead of a backend of its own."""
    def model(name: str, m: dict, sh: dict) -> GpuModel:
        async def source(file: str) -> bytes:
            return sh[file]

        return GpuModel(name, m, source, Tokenizer.from_manifest(m))

    models = [model("gemma-3-270m", manifest, shards)] + ([model("tiny-llama", *model_files("tiny-llama"))]
                                                           if shared else [])
    gemma = models[0]
    config = EngineConfig(max_num_batched_tokens=chunk, max_num_seqs=1)
    if shared:
        engine, pool = await shared_gpu_engine(await open_device(), models, 700 * MIB, block_size=16,
                                               kv_dtype="f16", kernels=kernels, config=config)
        b = engine.lane(gemma.name).backend
    else:
        b = await WebGpuBackend.create(await open_device(), manifest, gemma.shard_source, budget_bytes=600 << 20,
                                       block_size=16, kv_dtype="f16", max_num_batched_tokens=chunk, max_num_seqs=1,
                                       kernels=kernels)
        engine = LLMEngine(b, gemma.tokenizer, config, model=gemma.name)
    out = {"head_parts": [rows for _, rows, _ in b.weight_rows.get("token_embd.weight", [])],
           "max_binding": b.max_binding, "shader_f16": b.shader_f16, "groups": b.kv_groups.num_groups,
           "weights": (b.ledger.by_kind()["weights"], sum(weights_bytes(m.manifest, b.max_binding) for m in models))}
    cases = [golden(case, n) for case, n in (cases or CASES[kernels])]
    out["passes"] = b.kv_kernels.prefill_passes([len(c["prompt_ids"]) for c in cases])
    out["rows"] = await forced_rows(engine, [(c["prompt_ids"], c["output_ids"]) for c in cases], model=gemma.name)
    out["golden"] = cases
    if shared:
        out["shared"] = {"page_bytes": pool.pages.page_bytes, "slots": len(b.kv_pool.caches),
                         "group_page": page_use(check_manifest(manifest), "f16", 16),
                         "used_at_end": engine.pool.num_used}
        for lane in engine.lanes.values():
            lane.backend.destroy()
        pool.pages.destroy()
    else:
        b.destroy()
    return out


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_gemma3_on_wgpu_gives_llama_cpps_ids(native_loop, native_device, gemma3_gguf, kernels):  # noqa: F811
    """The cpu family runs in shared pages (backends/webgpu/shared_pages.py) beside tiny-llama: Gemma's 16-token
    block of one KV group (3 layers x f16 K and V of one 256-wide kv head: 48 KiB) sizes the page and each group's
    layers read their slots of it (tests/native/test_shared_gpu_groups_native.py follows a tiny Gemma's window
    pages step by step); the gpu family in a backend of its own."""
    model_dir = convert_cached(gemma3_gguf, ROOT / ".cache" / "models")
    manifest = json.loads((model_dir / "model.json").read_text())
    shards = {s["file"]: (model_dir / s["file"]).read_bytes() for s in manifest["shards"]}
    r = native_loop.run(teacher_forced(manifest, shards, kernels, shared=kernels == "cpu"))
    print(kernels, r["rows"], r["weights"], r.get("shared"))  # pytest -s
    assert r["shader_f16"] and r["groups"] == 6  # f16 matvecs in the gpu family; 1 full + 5 window groups
    if kernels == "cpu":
        shared = r["shared"]
        assert shared["page_bytes"] == shared["group_page"] == 3 * 16 * 256 * 2 * 2
        assert (shared["slots"], shared["used_at_end"]) == (3, 1)  # a group's 3 layers; Gemma's null page
    if r["max_binding"] < 160 << 20:
        assert r["head_parts"] == [131072, 131072]  # two parts of 80 MiB of codes
    reserved, planned = r["weights"]
    assert reserved == planned  # the ledger holds what memory_plan planned for the parts (and tiny-llama's)
    for rows, ref in zip(r["rows"], r["golden"]):
        forced_differences(rows, ref)
