"""The model families' layers (model/family.py) through the WebGPU plan on wgpu-py (lavapipe): the tiny qwen3,
smollm3 and gemma3 GGUFs (tests/gguf_models.py TINY_FAMILIES: q / k norms, heads wider than hidden, layers
without rotary, GeGLU, post norms, the embedding scale, two rotary bases, 32-token windows) against the numpy
reference, in both kernel families; tiny-gemma3-hd256 has Gemma 3 270M's 256-wide heads.

A 100-token prompt (over three of tiny-gemma3's windows) is prefilled in 40-token chunks (matmul; the window
masks across chunks), then 16 greedy tokens are decoded (matvec; the gpu family's fused epilogues where a layer
allows them): every step's logits within a bound of the reference's and the greedy ids equal, and the last
step's attention mass (the last layer's: a window layer in tiny-gemma3) the reference's. Before the last
chunk and again before decoding, the blocks that lie wholly before the window of every window layer are filled
with NaN on the GPU: a kernel that read one would poison the logits (window layers may release those blocks).
Then the engine's own route: LLMEngine's chunked prefill and decode give the reference's greedy ids. And in the
cpu family, on the same backend, llama.cpp's own greedy ids for tiny-qwen3 / -smollm3 / -gemma3 (16 ids after
tests/test_gguf_families.py's prompts), teacher forced through LLMEngine (tests/forced_rows.py) under the near-tie
rule of either side's margin: tiny-qwen3's fifth id (llama.cpp 0.74, ours 0.48) and tiny-gemma3's last (llama.cpp
0.12) are the near ties excused on lavapipe.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf_models import tiny_gguf
from llama_reference import forced_differences, llama_cpp_greedy
from model_fixtures import cached_gguf
from test_gguf_families import NUM_TOKENS, prompt

from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache, greedy_reference
from pagedkv.backends.webgpu.backend import WebGpuBackend
from pagedkv.backends.webgpu.plan import PlanKey, layer_program
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kernels.ref_ops import layer_inv_freq, shift_keys
from pagedkv.kv.retention import ShiftOp
from pagedkv.model.convert import convert_cached
from pagedkv.model.weights import ModelWeights
from pagedkv.model_runner import ForwardBatch
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
PROMPT, CHUNK, DECODE, BLOCK = 100, 40, 16, 16
# Max |logit - reference| (logits reach ~70): the cpu family computes in f32 throughout; the gpu family's
# matvecs take f16 dot products where the adapter has shader-f16 and its tiled matmuls stage f16 weights.
BOUND = {"cpu": 2e-3, "gpu": 0.5}
KV_DTYPE = {"cpu": "f32", "gpu": "f16"}  # the f32 cache in one family, the f16 one (packed pairs) in the other
MODELS = ("tiny-qwen3", "tiny-smollm3", "tiny-gemma3", "tiny-gemma3-hd256")  # the last: head_dim 256
# llama.cpp's greedy ids (test_gguf_families.py's prompts and length), teacher forced through LLMEngine on the cpu
# family's backend: 40 random ids, tiny-gemma3's 100 over three of its windows
LLAMA_CPP_PROMPTS = {"tiny-qwen3": 40, "tiny-smollm3": 40, "tiny-gemma3": 100}


def model_files(name: str) -> tuple[dict, dict]:
    """(manifest, {shard: bytes}) of the converted tiny GGUF `name`."""
    out = convert_cached(tiny_gguf(name, cached_gguf()), ROOT / ".cache" / "models")
    manifest = json.loads((out / "model.json").read_text())
    return manifest, {s["file"]: (out / s["file"]).read_bytes() for s in manifest["shards"]}


async def backend(manifest: dict, shards: dict, kernels: str, kv_dtype: str, kv_groups: bool = False) -> WebGpuBackend:
    """kv_groups False (the batches by hand here): every layer holds the whole context, one block table."""
    async def source(file: str) -> bytes:
        return shards[file]

    return await WebGpuBackend.create(await open_device(), manifest, source, budget_bytes=64 << 20,
                                      block_size=BLOCK, kv_dtype=kv_dtype, max_num_batched_tokens=CHUNK,
                                      max_num_seqs=2, kernels=kernels, kv_groups=kv_groups)


async def poison_before_windows(b: WebGpuBackend, table: np.ndarray, first_key: int) -> int:
    """NaN into every window layer's K and V blocks of `table` that hold only keys before first_key - window
    + 1 (the window of the first query to come); returns how many blocks each such layer got."""
    cfg = b.config
    count = 0
    for layer, cache in zip(cfg.layers, b.kv_pool.caches):
        window = layer.attention.window
        if window is None:
            continue
        count = max(0, first_key - window + 1) // BLOCK  # blocks whose every key is past the window
        if count:
            nan = np.full((count, *b.kv_kernels.layout.storage_shape[1:]), np.nan, b.kv_kernels.layout.storage_dtype)
            await b.kv_kernels.swap_in(cache, table[:count], nan, nan)
    return count


async def chunked_then_decode(name: str, kernels: str, llama_cpp: tuple[list[int], dict] | None = None) -> dict:
    """llama_cpp: (a prompt, llama.cpp's greedy ids after it): also teacher force those through LLMEngine on the
    same backend (tests/forced_rows.py)."""
    manifest, shards = model_files(name)
    model = NumpyModel(ModelWeights.from_shards(manifest, shards))
    cfg = model.config
    kv_dtype = KV_DTYPE[kernels]
    b = await backend(manifest, shards, kernels, kv_dtype)
    kv = PagedKVCache.allocate(cfg, b.num_blocks, BLOCK, kv_dtype=kv_dtype)
    rng = np.random.default_rng(7)
    blocks = -(-(PROMPT + DECODE) // BLOCK)
    table = rng.permutation(b.num_blocks)[:blocks].astype(np.int32)[None]  # (1, blocks) scattered
    i32 = lambda v: np.asarray(v, np.int32)  # noqa: E731

    def batch(ids: list[int], start: int) -> ForwardBatch:
        pos = np.arange(start, start + len(ids))  # (T,)
        return ForwardBatch(i32(ids), i32(pos), i32(table[0][pos // BLOCK] * BLOCK + pos % BLOCK), i32([0, len(ids)]),
                            table, i32([start + len(ids)]))

    prompt = rng.integers(100, cfg.vocab, PROMPT).tolist()
    errors, poisoned = [], []
    for start in range(0, PROMPT, CHUNK):
        if start == 2 * CHUNK:
            poisoned.append(await poison_before_windows(b, table[0], start))
        step = batch(prompt[start:start + CHUNK], start)
        gpu, ref = await b.forward(step), model.forward(step, kv)
        errors.append(float(np.abs(gpu - ref).max()))
    poisoned.append(await poison_before_windows(b, table[0], PROMPT))
    gpu_ids, ref_ids = [], []
    token = int(np.argmax(ref[0]))
    for p in range(PROMPT, PROMPT + DECODE):
        step = batch([token], p)
        if p == PROMPT + DECODE - 1:  # the last layer's attention mass (importance eviction; a window layer in gemma3)
            mass_gpu, mass_ref = np.zeros((1, blocks), np.float32), np.zeros((1, blocks), np.float32)
            gpu, ref = await b.forward(step, attention_mass=mass_gpu), model.forward(step, kv, attention_mass=mass_ref)
        else:
            gpu, ref = await b.forward(step), model.forward(step, kv)
        errors.append(float(np.abs(gpu - ref).max()))
        gpu_ids.append(int(np.argmax(gpu[0])))
        ref_ids.append(int(np.argmax(ref[0])))
        token = ref_ids[-1]
    decode = [d.shader for d in layer_program(b, PlanKey.of(1, 1))[0]]
    forced = None
    if llama_cpp is not None:
        from forced_rows import forced_rows

        engine = LLMEngine(b, Tokenizer.from_manifest(manifest), EngineConfig(max_num_batched_tokens=CHUNK))
        (forced,) = await forced_rows(engine, [(llama_cpp[0], llama_cpp[1]["output_ids"])])
    b.destroy()
    return {"errors": errors, "gpu": gpu_ids, "ref": ref_ids, "poisoned": poisoned, "decode": decode,
            "mass": (mass_gpu[0].tolist(), mass_ref[0].tolist()),
            "ops": sorted(cfg.family.ops(cfg)), "layers": cfg.layers, "head_dim": cfg.head_dim, "forced": forced}


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
@pytest.mark.parametrize("name", MODELS)
def test_chunked_prefill_and_decode_match_numpy(native_loop, native_device, name, kernels):
    llama_cpp = None
    if kernels == "cpu" and name in LLAMA_CPP_PROMPTS:  # and llama.cpp's own ids, in one family (below)
        ids = prompt(LLAMA_CPP_PROMPTS[name])
        llama_cpp = ids, llama_cpp_greedy(tiny_gguf(name, cached_gguf()), ids, NUM_TOKENS)
    r = native_loop.run(chunked_then_decode(name, kernels, llama_cpp))
    if llama_cpp is not None:
        print(name, r["forced"], llama_cpp[1])  # pytest -s
        forced_differences(r["forced"], llama_cpp[1], max_excused=2)
    print(name, kernels, r["ops"], [round(e, 5) for e in r["errors"]])  # pytest -s
    assert len(r["errors"]) == 3 + DECODE
    assert max(r["errors"]) < BOUND[kernels], r["errors"]
    assert r["gpu"] == r["ref"]
    mass_gpu, mass_ref = (np.array(m) for m in r["mass"])  # (blocks,) heads summed
    assert np.abs(mass_gpu - mass_ref).max() < 1e-3 * mass_ref.sum(), r["mass"]
    if r["layers"][-1].attention.window is not None:  # the window: no mass before it (blocks 0..4 of 8)
        assert mass_ref[:(PROMPT + DECODE - r["layers"][-1].attention.window) // BLOCK].sum() == 0
    windows = any(layer.attention.window is not None for layer in r["layers"])
    # tiny-gemma3: before chunk 80 keys 0..47 (3 blocks) lie before every window, before decoding keys 0..63
    assert r["poisoned"] == ([3, 4] if windows else [0, 0])
    qk_norm = r["layers"][0].qk_norm
    rotating = sum(layer.attention.rope_base is not None for layer in r["layers"])
    fused = kernels == "gpu" and not qk_norm  # the fused q|k|v epilogue has no q / k norm: those take rope.wgsl
    assert r["decode"].count("rope") == (0 if fused else len(r["layers"]))
    # a fused q|k|v runs inside the attention (paged_attention_gpu_fold.wgsl; f16 KV, no attention bias): a layer
    # without rotary too (ROTATE 0, smollm3's layer 3)
    assert sum(s.endswith("_rope_kv") for s in r["decode"]) == 0
    assert sum("_fold_" in s for s in r["decode"]) == (len(r["layers"]) if fused else 0)
    assert rotating == len(r["layers"]) - (name == "tiny-smollm3")  # smollm3's layer 3 has none (5 layers)
    assert r["head_dim"] == (256 if name.endswith("-hd256") else 64 if name == "tiny-smollm3" else 128)


async def engine_greedy(name: str, kernels: str) -> dict:
    """Two requests through LLMEngine (chunked prefill of 40-token steps, then decode) vs solo reference runs."""
    manifest, shards = model_files(name)
    model = NumpyModel(ModelWeights.from_shards(manifest, shards))
    b = await backend(manifest, shards, kernels, "f16", kv_groups=True)
    engine = LLMEngine(b, Tokenizer.from_manifest(manifest), EngineConfig(max_num_batched_tokens=CHUNK, max_num_seqs=2))
    rng = np.random.default_rng(11)
    prompts = [rng.integers(100, model.config.vocab, n).tolist() for n in (PROMPT, 37)]
    params = SamplingParams(max_tokens=DECODE, stop_token_ids=(1_000_000,))
    requests = [engine.request(engine.add_request(p, params)) for p in prompts]
    while engine.has_unfinished:
        await engine.step()
    b.destroy()
    kv_ref = [greedy_reference(model, p, DECODE) for p in prompts]
    return {"gpu": [r.output_ids for r in requests], "ref": kv_ref}


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_the_engine_runs_tiny_gemma3_as_the_reference_does(native_loop, native_device, kernels):
    r = native_loop.run(engine_greedy("tiny-gemma3", kernels))
    assert [len(ids) for ids in r["gpu"]] == [DECODE, DECODE]
    assert r["gpu"] == r["ref"]


def test_no_family_op_is_refused():
    """Every op a family may declare is one the WebGPU plan compiles."""
    from pagedkv.backends.webgpu.backend import OPS
    from pagedkv.model.family import OPS as FAMILY_OPS

    assert sorted(FAMILY_OPS) == sorted(OPS)


async def shifted_keys(name: str) -> dict:
    """Random keys in blocks 2 and 5 of every layer, shifted by 7 and 20 positions (KVRetention's shifted
    positions) on the GPU, against ref_ops.shift_keys with each layer's frequencies (none: unchanged)."""
    manifest, shards = model_files(name)
    b = await backend(manifest, shards, "cpu", "f32")
    cfg, kk = b.config, b.kv_kernels
    rng = np.random.default_rng(3)
    ids, deltas = np.array([2, 5], np.int32), np.array([7, 20])
    keys = [rng.standard_normal((2, BLOCK, cfg.n_kv_heads, cfg.head_dim)).astype(np.float32) for _ in cfg.layers]
    for cache, k in zip(b.kv_pool.caches, keys):
        await kk.swap_in(cache, ids, k, np.zeros_like(k))
    await b.shift_keys([ShiftOp(2, 7), ShiftOp(5, 20)])
    errors = []
    for cache, k, layer in zip(b.kv_pool.caches, keys, cfg.layers):
        got = (await kk.swap_out(cache, ids))[0]
        inv = layer_inv_freq(cfg, layer)
        errors.append(float(np.abs(got - (k if inv is None else shift_keys(k, deltas, inv))).max()))
    b.destroy()
    return {"errors": errors, "rotates": [layer.attention.rope_base is not None for layer in cfg.layers]}


@pytest.mark.parametrize("name", ["tiny-smollm3", "tiny-gemma3"])
def test_shift_keys_rerotates_each_layer_with_its_own_rotary(native_loop, native_device, name):
    r = native_loop.run(shifted_keys(name))
    assert max(r["errors"]) < 1e-6, r  # the same numpy rotation; a layer without rotary keeps its keys bit-exact
    assert all(e == 0.0 for e, rotates in zip(r["errors"], r["rotates"]) if not rotates), r
    assert all(r["rotates"]) == (name != "tiny-smollm3")  # smollm3's layer 3 has no rotary

