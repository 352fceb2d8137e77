"""A prompt long enough that one invocation of the cpu family's prefill attention would walk more keys than
lavapipe runs: tiny-gemma3-hd256 (Gemma 3 270M's 256-wide heads) on wgpu-py, a 1,700-token prompt prefilled in
600-token chunks then two greedy steps, against the numpy reference: its logits and its greedy ids.

llvmpipe ends every loop of an invocation once the invocation has taken 65,535 loop back-edges in all (gallivm's
loop limiter). Walking every key block in one invocation, head_dim 256 costs about 39 of them a key, so from
1,646 keys on (block size 16, 4 query tokens a tile) the global layer's last queries silently dropped their last
keys. Prefill attention now walks them in passes of 512 keys (paged_prefill_attention_main.wgsl). Before, the
last chunk's logits were off by 22.4 here and the two decode steps' by 6.7 and 6.3 (their keys and values of layer
6 came from the wrong rows); the ids held, on margins of 2.3-7.4. The window layers (32 keys) never came near the cap: only layer 5,
the global one, did.
"""
from __future__ import annotations

import numpy as np
from test_model_families_native import model_files

from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache
from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.model.weights import ModelWeights
from pagedkv.model_runner import ForwardBatch

PROMPT, CHUNK, DECODE, BLOCK = 1700, 600, 2, 16


async def prefill_then_decode(name: str, kernels: str, prompt_len: int = PROMPT) -> dict:
    """Per step (3 chunks, then DECODE steps of the reference's ids): max |logit - reference|, both greedy ids and
    the reference's top-1 / top-2 margin; and the prefill passes of the plans it recorded."""
    manifest, shards = model_files(name)
    model = NumpyModel(ModelWeights.from_shards(manifest, shards))

    async def source(file: str) -> bytes:
        return shards[file]

    b = await WebGpuBackend.create(await open_device(), manifest, source, budget_bytes=128 << 20, block_size=BLOCK,
                                   kv_dtype="f32", max_num_batched_tokens=CHUNK, max_num_seqs=1, kernels=kernels,
                                   kv_groups=False)
    blocks = -(-(prompt_len + DECODE) // BLOCK)
    kv = PagedKVCache.allocate(model.config, b.num_blocks, BLOCK)  # the same scattered blocks as the GPU
    table = np.random.default_rng(2).permutation(b.num_blocks)[:blocks].astype(np.int32)[None]  # (1, blocks)
    i32 = lambda v: np.asarray(v, np.int32)  # noqa: E731

    def batch(ids: list[int], start: int) -> ForwardBatch:
        pos = np.arange(start, start + len(ids))  # (T,)
        return ForwardBatch(i32(ids), i32(pos), i32(table[0][pos // BLOCK] * BLOCK + pos % BLOCK), i32([0, len(ids)]),
                            table, i32([start + len(ids)]))

    prompt = np.random.default_rng(6).integers(100, model.config.vocab, prompt_len).tolist()
    out = {"errors": [], "gpu": [], "ref": [], "margins": []}
    steps = [(prompt[s:s + CHUNK], s) for s in range(0, prompt_len, CHUNK)]  # then DECODE steps of the reference's
    for n in range(len(steps) + DECODE):
        ids, start = steps[n] if n < len(steps) else ([out["ref"][-1]], prompt_len + n - len(steps))
        step = batch(ids, start)
        gpu, ref = await b.forward(step), model.forward(step, kv)  # (1, vocab) each: the last token's
        out["errors"].append(float(np.abs(gpu - ref).max()))
        out["gpu"].append(int(np.argmax(gpu[0])))
        out["ref"].append(int(np.argmax(ref[0])))
        top = np.sort(ref[0])[-2:]
        out["margins"].append(round(float(top[1] - top[0]), 2))
    out["passes"] = sorted(key.prefill_passes for key in b._plans)
    b.destroy()
    return out


def test_a_prompt_past_lavapipes_loop_cap_matches_the_reference(native_loop, native_device):
    r = native_loop.run(prefill_then_decode("tiny-gemma3-hd256", "cpu"))
    print(r)  # pytest -s
    assert r["passes"] == [1, 2, 3, 4]  # the decode steps; the chunks that end at 600, 1,200 and 1,700 keys
    assert max(r["errors"]) < 2e-3, r["errors"]  # logits reach ~70; f32 throughout
    assert r["gpu"] == r["ref"] == [36147, 15708, 25800, 39791, 39791]  # margins 2.3 to 7.4: no near tie


def test_the_gpu_familys_prefill_passes_run_in_the_engines_plans(native_loop, native_device):
    """The gpu family walks 1,024 keys a pass (paged_prefill_attention_gpu.wgsl): 1,100 tokens in chunks of 600,
    the second chunk in 2 passes whose resume pipeline binds the state and the uniform as the first does (a
    recorded plan once bound the resume pass's uniform over its state). Its f16 matvecs (lavapipe has shader-f16)
    put its logits ~0.03 from the f32 reference in every step, one pass or two."""
    r = native_loop.run(prefill_then_decode("tiny-gemma3-hd256", "gpu", 1100))
    print(r)  # pytest -s
    assert r["passes"] == [1, 1, 2]  # decode; the chunk ending at 600 keys; the one ending at 1,100
    assert max(r["errors"]) < 0.06, r["errors"]
    assert r["gpu"] == r["ref"] == [36147, 2833, 2833, 5527]  # margins 0.9 to 6.2
