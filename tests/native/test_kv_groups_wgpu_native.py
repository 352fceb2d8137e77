"""KV groups on the WebGPU backend (kv/groups.py), wgpu-py on lavapipe: tiny-gemma3 (7 layers: layer 5 global,
the others a 32-token window -> 7 groups of one layer) keeps a page per group, each window group only its window.

- LLMEngine over WebGPU with groups gives the numpy reference's greedy ids past several windows (blocks released,
  their table entries the null block) and holds, step for step, exactly the blocks the CPU backend's engine with
  the same pool holds (the same manager decisions on both backends).
- Parallel samples (fork, copy-on-write of each group's partial block) and preemption by swap (every group's
  pages to the CPU pool and back) keep the reference's ids.
- The pool's page moves (copy, swap out / in, disk read / write) move every slot's words exactly, and a reload
  restores every group's pages from the disk tier by the groups' rule.
"""
from __future__ import annotations

import numpy as np
from test_model_families_native import BLOCK, CHUNK, model_files

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.backends.webgpu.memory_plan import plan_kv_pool
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.accounting import kv_stats
from pagedkv.kv.block_pool import CopyOp
from pagedkv.kv.disk_tier import DiskKey, DiskTier, MemoryStore, model_hash
from pagedkv.model.weights import ModelWeights
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

# Pages: a 124-token sequence holds up to 8 full-group blocks + 6 windows of ceil((31 + chunk) / 16) + 1 (44 in
# chunks of 40, 38 in chunks of 32), and the manager reserves the null block: about one such sequence fits.
NUM_BLOCKS = 46
GREEDY = SamplingParams(max_tokens=24, stop_token_ids=(1_000_000,))


class CopyCounting(WebGpuBackend):
    """Counts the copy-on-write pairs the engine hands it (then copies them as the backend does)."""

    copies = 0

    async def copy_blocks(self, ops) -> None:
        ops = list(ops)
        self.copies += len(ops)
        await super().copy_blocks(ops)


async def gpu_backend(manifest: dict, shards: dict, num_blocks: int = NUM_BLOCKS, num_cpu_blocks: int = 0
                      ) -> CopyCounting:
    """tiny-gemma3 on WebGPU with KV groups, its budget sized for exactly num_blocks pages."""
    async def source(file: str) -> bytes:
        return shards[file]

    sizes = dict(block_size=BLOCK, kv_dtype="f16", max_num_batched_tokens=CHUNK, max_num_seqs=2)
    ctx = await open_device()
    plan = plan_kv_pool(manifest, budget_bytes=64 << 20, max_binding=ctx.info.limits["maxStorageBufferBindingSize"],
                        **sizes)
    return await CopyCounting.create(ctx, manifest, source, budget_bytes=plan["fixed_bytes"] + num_blocks *
                                      plan["block_bytes"], num_cpu_blocks=num_cpu_blocks, kernels="cpu", **sizes)


def prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(11)
    return [rng.integers(100, vocab, n).tolist() for n in (100, 37)]


async def lockstep() -> dict:
    """The same two requests on a WebGPU and a CPU engine of NUM_BLOCKS pages, stepped together."""
    manifest, shards = model_files("tiny-gemma3")
    weights = ModelWeights.from_shards(manifest, shards)
    gpu = await gpu_backend(manifest, shards)
    cpu = CpuBackend(weights, num_blocks=gpu.num_blocks, block_size=BLOCK)
    # not pipelined: a WebGPU engine would otherwise read a step's ids one step later than the CPU engine
    config = EngineConfig(max_num_batched_tokens=CHUNK, max_num_seqs=2, pipeline_decode=False)
    engines = [LLMEngine(b, Tokenizer.from_manifest(manifest), config) for b in (gpu, cpu)]
    requests = [[e.request(e.add_request(p, GREEDY)) for p in prompts(weights.config.vocab)] for e in engines]
    held = [[], []]  # per engine, per step: (pool's used blocks, each group's)
    while engines[0].has_unfinished:
        for e, h in zip(engines, held):
            await e.step()
            stats = kv_stats(e.kv)
            h.append((e.kv.pool.num_used, stats.group_used_blocks))
    out = {"held": held, "ids": [[r.output_ids for r in reqs] for reqs in requests],
           "ref": [greedy_reference(NumpyModel(weights), p, GREEDY.max_tokens) for p in prompts(weights.config.vocab)],
           "groups": engines[0].kv.num_groups, "slots": len(gpu.kv_pool.caches), "num_blocks": gpu.num_blocks,
           "page": (gpu.page_bytes_per_token, gpu.bytes_per_token, gpu.kv_spec.bytes_per_block),
           "ledger_kv": gpu.ledger.by_kind()["kv"]}
    gpu.destroy()
    return out


def test_grouped_engine_on_webgpu_gives_the_reference_ids_and_holds_what_the_cpu_engine_holds(native_loop,
                                                                                              native_device):
    r = native_loop.run(lockstep())
    assert r["groups"] == 7 and r["slots"] == 1  # one layer a page: one K / V buffer pair, not 7
    # f16 K and V of one layer (1 kv head x 128) a token in a page; 7 layers' in bytes_per_token
    assert r["page"] == (512, 7 * 512, 16 * 512) and r["num_blocks"] == NUM_BLOCKS
    assert r["ledger_kv"] == NUM_BLOCKS * 16 * 512
    assert r["ids"][0] == r["ref"]
    assert r["held"][0] == r["held"][1]  # the CPU backend's engine held the same blocks at every step
    held = r["held"][0]
    # The pool fills in prefill (a chunk's first query still sees up to 6 blocks of a window group); decoding the
    # 100-token prompt, the full group holds its 7 blocks and each window group 3: 26 pages with the null block,
    # where every layer full would hold 7 x 7 = 49; at 124 tokens 8 and still 3.
    assert held[2] == (46, (9, 6, 6, 6, 6, 6, 6))
    assert held[3] == (26, (7, 3, 3, 3, 3, 3, 3)) and held[24] == (27, (8, 3, 3, 3, 3, 3, 3))
    assert max(max(groups[1:]) for _, groups in held) == 6
    assert held[-1] == (1, (0,) * 7)  # every request freed; the null block stays reserved


async def forks_and_swaps() -> dict:
    """Greedy parallel samples (forked blocks, copy-on-write) and a low-priority request swapped out for two
    higher ones and back, on WebGPU with groups."""
    manifest, shards = model_files("tiny-gemma3")
    weights = ModelWeights.from_shards(manifest, shards)
    gpu = await gpu_backend(manifest, shards, num_blocks=40, num_cpu_blocks=64)
    engine = LLMEngine(gpu, Tokenizer.from_manifest(manifest),
                       EngineConfig(max_num_batched_tokens=32, max_num_seqs=2, preemption="swap",
                                    enable_prefix_caching=False))
    long, short = prompts(weights.config.vocab)
    forked = await engine.generate(short, SamplingParams(n=2, max_tokens=24, stop_token_ids=(1_000_000,)))
    rids = [engine.add_request(p, GREEDY, priority=prio) for p, prio in ((long, 0), (long[:90], 2), (short, 1))]
    reqs = [engine.request(r) for r in rids]
    while engine.has_unfinished:
        await engine.step()
    model = NumpyModel(weights)
    out = {"forked": [s.output_ids for s in forked.samples], "ids": [r.output_ids for r in reqs],
           "ref": [greedy_reference(model, p, 24) for p in (short, long, long[:90])],
           "copies": gpu.copies, "swaps": engine.stats()["preemptions"]["swap"]}
    gpu.destroy()
    return out


def test_forks_and_swaps_of_grouped_sequences_keep_the_reference_ids(native_loop, native_device):
    r = native_loop.run(forks_and_swaps())
    short, long, long90 = r["ref"]
    assert r["forked"] == [short, short] and r["copies"] >= 1  # copy-on-write of the shared partial blocks
    assert r["ids"] == [long, long90, short]
    assert r["swaps"] >= 1


async def page_moves() -> dict:
    """Random words into 4 pages, then a copy, a swap out and in, and a read: every slot's words exact."""
    manifest, shards = model_files("tiny-gemma3")
    gpu = await gpu_backend(manifest, shards, num_cpu_blocks=8)
    rng = np.random.default_rng(5)
    shape = (4, len(gpu.kv_pool.caches), 2, BLOCK, gpu.kv_spec.token_u32s)  # (n, slots, K / V, tokens, words)
    words = rng.integers(0, 1 << 14, shape, dtype=np.uint32) * 0x10001  # f16 pairs of finite halves
    await gpu.write_blocks([3, 7, 11, 20], words)
    await gpu.copy_blocks([CopyOp(7, 30)])
    await gpu.swap_out([CopyOp(11, 2), CopyOp(20, 5)])
    await gpu.swap_in([CopyOp(5, 31), CopyOp(2, 32)])
    got = await gpu.read_blocks([3, 30, 31, 32])
    gpu.destroy()
    return {"want": words[[0, 1, 3, 2]], "got": got}


def test_page_moves_of_a_grouped_pool_move_every_slot_exactly(native_loop, native_device):
    r = native_loop.run(page_moves())
    assert r["got"].shape == r["want"].shape
    assert np.array_equal(r["got"], r["want"])


async def disk_reload() -> dict:
    """Turn 1 on a WebGPU engine writing every group's pages to a disk tier, then turn 2 (turn 1, its reply and 38
    more tokens) on a fresh backend and engine over the same store: a reload."""
    manifest, shards = model_files("tiny-gemma3")
    weights = ModelWeights.from_shards(manifest, shards)
    store = MemoryStore()
    params = SamplingParams(max_tokens=12, stop_token_ids=(1_000_000,))
    turn1 = prompts(weights.config.vocab)[0]  # 100 tokens
    out, stats = [], []
    for prompt in (turn1, None):
        gpu = await gpu_backend(manifest, shards, num_blocks=96)
        engine = LLMEngine(gpu, Tokenizer.from_manifest(manifest), EngineConfig(max_num_batched_tokens=CHUNK,
                                                                                 max_num_seqs=2))
        tier = DiskTier(store, DiskKey(model_hash(manifest), gpu.kv_spec), 1 << 30)
        await tier.open()
        engine.attach_disk(tier)
        prompt = prompt or turn1 + out[0] + list(range(140, 178))
        out.append((await engine.generate(prompt, params)).output_ids)
        stats.append({k: engine.stats()[k] for k in ("disk_blocks", "disk_restored_tokens", "prefill_tokens")}
                     | {"reads": tier.num_read, "groups": tier.key.num_groups})
        gpu.destroy()
    model = NumpyModel(weights)
    return {"out": out, "stats": stats, "ref": [greedy_reference(model, turn1, 12),
                                                greedy_reference(model, turn1 + out[0] + list(range(140, 178)), 12)]}


def test_a_reload_restores_every_groups_pages_from_disk_on_webgpu(native_loop, native_device):
    r = native_loop.run(disk_reload())
    assert r["out"] == r["ref"]
    # 100 + 11 computed tokens: 6 full blocks in each of the 7 groups (a window group's written while it held them)
    assert r["stats"][0] == {"disk_blocks": 42, "disk_restored_tokens": 0, "prefill_tokens": 100, "reads": 0,
                             "groups": 7}
    # turn 2 (150 tokens) after the reload: the disk's 6 blocks, the full group's 0..5 and each window group's 4 and
    # 5 (a query at 96 sees keys 65..96): 6 + 6 x 2 = 18 pages read; the model computes the other 54 tokens, and
    # 150 + 11 computed tokens leave 10 full blocks per group on disk
    assert r["stats"][1] == {"disk_blocks": 70, "disk_restored_tokens": 96, "prefill_tokens": 54, "reads": 18,
                             "groups": 7}
