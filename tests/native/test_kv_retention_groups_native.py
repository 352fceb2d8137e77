"""A request's KV retention on WebGPU with KV groups (kv/retention.py, "KV groups"), wgpu-py on lavapipe:
tiny-gemma3 (7 groups of one layer: layer 5 global with rope base 1e6, the others a 32-token window with 10,000)
under a 16-token sliding window with a 4-token sink block, shifted positions.

Every drop re-rotates the kept keys of each group's pages with that group's layer's rotary base
(GpuKVPool.shift_keys, ShiftOp.group); the greedy ids equal the CPU engine's with every layer full under the same
retention (kv_groups=False: one table, the path that holds no groups), and the pages each group holds at every
step equal the CPU engine's with groups. The prompt is test_kv_groups_wgpu_native's 37-token one.
"""
from __future__ import annotations

from test_kv_groups_wgpu_native import BLOCK, gpu_backend, prompts
from test_model_families_native import model_files

from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.accounting import kv_stats
from pagedkv.kv.retention import KVRetention
from pagedkv.model.weights import ModelWeights
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

RETENTION = KVRetention(window_tokens=16, sink_tokens=4)
GREEDY = SamplingParams(max_tokens=40, stop_token_ids=(1_000_000,))


async def windowed() -> dict:
    manifest, shards = model_files("tiny-gemma3")
    weights = ModelWeights.from_shards(manifest, shards)
    prompt = prompts(weights.config.vocab)[1]
    gpu = await gpu_backend(manifest, shards, num_blocks=40)
    config = EngineConfig(max_num_batched_tokens=32, max_num_seqs=2, pipeline_decode=False)
    tok = Tokenizer.from_manifest(manifest)
    engines = [LLMEngine(gpu, tok, config),
               LLMEngine(CpuBackend(weights, num_blocks=40, block_size=BLOCK), tok, config),
               LLMEngine(CpuBackend(weights, num_blocks=40, block_size=BLOCK, kv_groups=False), tok, config)]
    reqs = [e.request(e.add_request(prompt, GREEDY, retention=RETENTION)) for e in engines]
    held = [[] for _ in engines]  # per engine, per step: each group's pages
    while any(e.has_unfinished for e in engines):
        for e, h in zip(engines, held):
            if e.has_unfinished:
                await e.step()
                h.append(kv_stats(e.kv).group_used_blocks)
    out = {"ids": [r.output_ids for r in reqs], "held": held, "shifted": engines[0].stats()["shifted_blocks"]}
    gpu.destroy()
    return out


def test_shifted_window_retention_with_groups_on_webgpu_equals_every_layer_full(native_loop, native_device):
    r = native_loop.run(windowed())
    gpu, cpu, flat = r["ids"]
    assert len(gpu) == 40 and gpu == cpu == flat
    assert r["held"][0] == r["held"][1]
    # 37 + 40 tokens in a 16-token window and a sink block: at most 3 pages a group (the sink pinned in each
    # window group: the request's window is narrower than the model's).
    assert max(max(h) for h in r["held"][0]) == 3 and r["shifted"] > 0
