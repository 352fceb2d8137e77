"""KV groups in WebGPU pages several models share (backends/webgpu/shared_pages.py, pagedkv/shared_gpu.py), wgpu-py
on lavapipe: tiny-gemma3 (7 layers: layer 5 global, the others a 32-token window -> 7 groups of one layer) and
tiny-llama (2 layers) in one buffer of equal pages.

A page holds one block of one Gemma group's layer (f16 K and V of one 128-wide KV head: 512 B a token) or of both
llama layers (2 x 2 heads x 64: 1 KiB a token), so the llama's 32-token blocks (block_size=32) size the page
(32 KiB) and Gemma gets 64-token blocks in it, longer than the 32 keys the kernels score at a time
(paged_attention_common.wgsl walks them in chunks) and than Gemma's window; with every Gemma layer in a page (the
layout before groups) a 16-token Gemma block alone took 56 KiB. Checked at every step: Gemma's pages per group are
what the window rule gives (the full group every block, a window group the blocks its step's first query still
sees and the step's own), the llama's its blocks, and the pool's used pages exactly their sum plus Gemma's null
page; as Gemma decodes past its prompt its window groups give their first page back while the full group grows;
both models' greedy ids are the numpy reference's; unloading Gemma gives its null page back. The prompts are
test_kv_groups_wgpu_native's 100-token Gemma prompt and 40 random llama ids, both without near ties against the
reference here.
"""
from __future__ import annotations

import numpy as np
from test_kv_groups_wgpu_native import prompts
from test_model_families_native import model_files

from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.backends.webgpu.shared_pages import page_use
from pagedkv.engine import EngineConfig
from pagedkv.gpu_budget import MIB
from pagedkv.kv.accounting import kv_stats
from pagedkv.model.weights import ModelWeights, check_manifest
from pagedkv.sampling import SamplingParams
from pagedkv.shared_gpu import GpuModel, shared_gpu_engine
from pagedkv.tokenizer import Tokenizer

GREEDY = SamplingParams(max_tokens=24, stop_token_ids=(1_000_000,))
WINDOW = 32


def gpu_model(name: str) -> tuple[GpuModel, ModelWeights]:
    manifest, shards = model_files(name)

    async def source(file: str) -> bytes:
        return shards[file]

    return GpuModel(name, manifest, source, Tokenizer.from_manifest(manifest)), ModelWeights.from_shards(manifest,
                                                                                                       shards)


async def two_models() -> dict:
    (gemma, gemma_w), (llama, llama_w) = gpu_model("tiny-gemma3"), gpu_model("tiny-llama")
    engine, shared = await shared_gpu_engine(await open_device(), [gemma, llama], 44 * MIB, block_size=32,
                                             kv_dtype="f16",
                                             config=EngineConfig(max_num_batched_tokens=32, max_num_seqs=2,
                                                                 pipeline_decode=False))
    lanes = {n: engine.lane(n) for n in ("tiny-gemma3", "tiny-llama")}
    gemma_prompt = prompts(gemma_w.config.vocab)[0]
    llama_prompt = np.random.default_rng(5).integers(100, llama_w.config.vocab, 40).tolist()
    reqs = {"tiny-gemma3": engine.request(engine.add_request(gemma_prompt, GREEDY, model="tiny-gemma3")),
            "tiny-llama": engine.request(engine.add_request(llama_prompt, GREEDY, model="tiny-llama"))}
    trace = []  # per step: (Gemma's computed tokens before and after, its pages per group, llama's pages, used)
    while engine.has_unfinished:
        before = reqs["tiny-gemma3"].seq.num_computed_tokens
        await engine.step()
        seqs = {n: r.seq for n, r in reqs.items()}
        trace.append((before, seqs["tiny-gemma3"].num_computed_tokens,
                      kv_stats(lanes["tiny-gemma3"].kv).group_used_blocks, lanes["tiny-llama"].held_blocks,
                      engine.pool.num_used))
    out = {"ids": {n: r.output_ids for n, r in reqs.items()},
           "ref": {"tiny-gemma3": greedy_reference(NumpyModel(gemma_w), gemma_prompt, 24),
                   "tiny-llama": greedy_reference(NumpyModel(llama_w), llama_prompt, 24)},
           "trace": trace, "page_bytes": shared.pages.page_bytes, "pages": shared.pages.num_pages,
           "block_sizes": {n: lane.kv.block_size for n, lane in lanes.items()},
           "slots": {n: len(lane.backend.kv_pool.caches) for n, lane in lanes.items()},
           "groups": lanes["tiny-gemma3"].kv.num_groups, "null": lanes["tiny-gemma3"].kv.null_block,
           "flat_page": page_use(check_manifest(gemma.manifest), "f16", 16) * 7,
           "ledger_kv": shared.pages.ledger.by_kind()["kv"], "used_at_end": engine.pool.num_used}
    engine.remove_model("tiny-gemma3")
    out["used_after_unload"] = engine.pool.num_used
    for lane in engine.lanes.values():
        lane.backend.destroy()
    shared.pages.destroy()
    return out


def test_a_hybrid_model_in_shared_webgpu_pages_frees_its_window_pages(native_loop, native_device):
    r = native_loop.run(two_models())
    assert r["page_bytes"] == 32_768 and r["flat_page"] == 57_344
    assert r["block_sizes"] == {"tiny-gemma3": 64, "tiny-llama": 32}
    assert r["slots"] == {"tiny-gemma3": 1, "tiny-llama": 2}  # K / V bindings: a group's layer, both llama layers
    assert (r["groups"], r["null"]) == (7, 0) and r["ledger_kv"] == r["pages"] * 32_768
    assert r["ids"] == r["ref"]
    bs = 64
    for before, after, groups, llama, used in r["trace"]:
        if after:  # Gemma holds pages (it is not finished yet)
            blocks = -(-after // bs)
            released = max(0, (before - WINDOW + 1) // bs)
            assert groups == (blocks,) + (blocks - released,) * 6, (before, after, groups)
        assert used == sum(groups) + llama + 1  # + Gemma's null page
    window = {t[1]: t[2][1] for t in r["trace"] if t[1]}  # a window group's pages after computing t tokens
    # A window group holds at most the 2 pages of the chunk that brings query 95, the first whose window (keys
    # 64..95) leaves the page of tokens 0..63; decoding (queries 100..122) it holds 1, while the full group ends at 2.
    assert max(window.values()) == 2 and {v for n, v in window.items() if n > 100} == {1}
    # At 122 tokens Gemma holds 8 pages, where 32-token blocks (the kernels' limit before chunks) held 4 + 6 x 2 = 16
    # and every layer in a page (8-token blocks of its 7 layers) 16.
    assert r["trace"][-2][1:3] == (122, (2, 1, 1, 1, 1, 1, 1))
    assert r["used_at_end"] == 1 and r["used_after_unload"] == 0
