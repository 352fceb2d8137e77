"""KV cache dtypes (pagedkv.kv.dtypes): sizes, exact codes and words, round-trip error bounds, bad input, and
the CPU engine running every dtype."""
from __future__ import annotations

import math

import numpy as np
import pytest

from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.numpy_ref import PagedKVCache
from pagedkv.config import CacheConfig
from pagedkv.engine import EngineConfig, LLMEngine, run_sync
from pagedkv.kernels import ref_attention as ref
from pagedkv.kv.spec import SMOLLM2_135M
from pagedkv.kv.dtypes import (KV_DTYPES, PackedKV, dequantize, kv_dtype, pack_tokens, quantize, round_trip,
                              unpack_tokens)
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

NAMES = ["f32", "f16", "int8", "fp8-e4m3", "int4", "int4-asym"]
BAD_NAME = "unknown KV cache dtype 'int3'; valid dtypes are f32, f16, int8, fp8-e4m3, int4, int4-asym"


def test_registry_sizes_for_smollm2():
    assert list(KV_DTYPES) == NAMES
    # bytes of one token of one layer's K (or V): 3 kv heads x 64 channels, scales, padding to 16 bytes
    assert [kv_dtype(n).token_bytes(3, 64) for n in NAMES] == [768, 384, 224, 208, 128, 128]
    assert [kv_dtype(n).bytes_per_token_per_head(64) for n in NAMES] == [256.0, 128.0, 72.0, 68.0, 40.0, 40.0]
    assert [SMOLLM2_135M.with_(dtype=n).bytes_per_token for n in NAMES] == [46080, 23040, 13440, 12480, 7680, 7680]
    assert [kv_dtype(n).group_for(64) for n in NAMES] == [0, 0, 32, 64, 32, 32]
    assert [kv_dtype(n).group_for(16) for n in NAMES] == [0, 0, 16, 16, 16, 16]


def test_unknown_dtype_is_refused_everywhere_with_the_valid_names():
    with pytest.raises(ValueError, match=BAD_NAME):
        kv_dtype("int3")
    with pytest.raises(ValueError, match=BAD_NAME):
        CacheConfig(num_blocks=4, kv_dtype="int3")
    with pytest.raises(ValueError, match=BAD_NAME):
        EngineConfig(kv_dtype="int3")
    with pytest.raises(ValueError, match=BAD_NAME):
        round_trip(np.zeros((1, 16), np.float32), "int3")
    with pytest.raises(ValueError, match="head_dim must be a positive multiple of 16, got 24"):
        kv_dtype("int8").token_bytes(2, 24)
    with pytest.raises(ValueError, match="f16 is stored as is, not quantized"):
        quantize(np.zeros((1, 16), np.float32), "f16")
    assert CacheConfig(num_blocks=4).kv_dtype == "f16"
    assert CacheConfig.from_budget(1 << 20, 13440, kv_dtype="int8") == CacheConfig(num_blocks=4, kv_dtype="int8")


def test_int8_words_codes_scale_and_ties_to_even():
    row = np.zeros((1, 1, 16), np.float32)  # (tokens, kv heads, head_dim)
    row[0, 0, :8] = [127, -127, 1, 0.5, 1.5, 2.5, -0.5, -2.5]  # amax 127: scale 127 * f32(1/127) == 1.0
    codes, scales = quantize(row, "int8")
    assert scales.tolist() == [[[1.0]]]
    assert codes[0, 0, :8].tolist() == [127, -127, 1, 0, 2, 2, 0, -2]
    words = pack_tokens(row, "int8")  # 4 data u32, 1 scale, 3 padding
    assert [hex(w) for w in words[0]] == ["0x1817f", "0xfe000202", "0x0", "0x0", "0x3f800000", "0x0", "0x0", "0x0"]
    assert np.array_equal(unpack_tokens(words, "int8", 1, 16), dequantize(codes, scales, "int8"))


def test_fp8_codes_subnormals_ties_and_clamp():
    row = np.zeros((1, 16), np.float32)
    row[0, :8] = [448, -448, 1.0, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 1.0625, -1.1875]
    codes, scales = quantize(row, "fp8-e4m3")
    assert scales.tolist() == [[np.float32(448) * np.float32(1 / 448)]] and scales[0, 0] == 1.0
    # 448 = 0x7E (the largest finite); 1 = 0x38; 2^-9 = the smallest subnormal 0x01; 2^-10 and 1.5 * 2^-9
    # are ties (to 0 and to 2 * 2^-9); 1.0625 ties between 1 and 1.125 (even mantissa: 1); -1.1875 -> -1.25.
    assert codes[0, :8].tolist() == [0x7E, 0xFE, 0x38, 0x01, 0x00, 0x02, 0x38, 0xBA]
    assert dequantize(codes, scales, "fp8-e4m3")[0, :8].tolist() == [448, -448, 1, 2.0 ** -9, 0, 2.0 ** -8, 1, -1.25]


def test_int4_asym_words_codes_step_minimum_and_ties_to_even():
    row = np.zeros((1, 1, 32), np.float32)  # (tokens, kv heads, head_dim): one group of 32
    # min -1, max 14: m = -1, d = 15 * f32(1/15) = 1 exactly; x - m = 0.5 and 2.5 tie to 0 and 2 (even)
    row[0, 0, :6] = [-1, 14, -0.5, 1.5, 3.25, 0]
    codes, scales = quantize(row, "int4-asym")
    assert scales.tolist() == [[[[1.0, -1.0]]]]
    assert codes[0, 0, :6].tolist() == [0, 15, 0, 2, 4, 1] and (codes[0, 0, 6:] == 1).all()
    words = pack_tokens(row, "int4-asym")  # 4 data u32 (unsigned nibbles, first value lowest), 1 scale, 3 pad
    # scale word: f16 1.0 (0x3c00) low, f16 -1.0 (0xbc00) high
    assert [hex(w) for w in words[0]] == ["0x111420f0", "0x11111111", "0x11111111", "0x11111111", "0xbc003c00",
                                          "0x0", "0x0", "0x0"]
    assert dequantize(codes, scales, "int4-asym")[0, 0, :6].tolist() == [-1, 14, -1, 1, 3, 0]
    assert np.array_equal(unpack_tokens(words, "int4-asym", 1, 16 * 2), dequantize(codes, scales, "int4-asym"))


def test_int4_asym_rounds_step_up_and_minimum_down_onto_normal_f16():
    rows = np.zeros((4, 1, 16), np.float32)  # one group of 16 per row: all at the minimum but channel 1
    rows[0, 0], rows[0, 0, 1] = np.float32(1 + 2.0 ** -20), 3  # min just above 1: m rounds down to 1
    rows[1, 0], rows[1, 0, 1] = np.float32(-(1 + 2.0 ** -20)), 0  # negative: m rounds away, to -(1 + 2^-10)
    rows[2, 0], rows[2, 0, 1] = -3e-5, 1e-5  # |min| < 2^-14: m = 0, d = 2^-14 (the smallest normal f16)
    rows[3, 0], rows[3, 0, 1] = -1e6, 1e6  # outside the f16 range: clamped to -+65504
    _, scales = quantize(rows, "int4-asym")
    d, m = scales[:, 0, 0, 0], scales[:, 0, 0, 1]
    assert m.tolist() == [1.0, -(1 + 2.0 ** -10), 0.0, -65504.0]
    # d = (max - m) / 15 rounded UP to 11 significant bits: 2 / 15 = 2^-3 * 1092.27 / 1024 -> mantissa 1093;
    # 1.000977 / 15 = 2^-4 * 1093.33 / 1024 -> 1094; 131008 / 15 = 2^13 * 1091.73 / 1024 -> 1092
    assert d.astype(np.float16).view(np.uint16).tolist() == [0x3045, 0x2C46, 0x0400, 0x7044]
    assert (d * 15 + m >= rows[:, 0, :2].max(axis=1).clip(-65504, 65504)).all()  # the range is covered
    assert round_trip(rows, "int4-asym")[2, 0, :3].tolist() == [0.0, 0.0, 0.0]  # error < 2^-14 there


def test_zero_and_denormal_rows_store_zero_scales_and_codes():
    rows = np.zeros((2, 2, 32), np.float32)
    rows[1] = -1e-39  # denormal: a GPU may flush it, so the scale is stored as 0 on both sides
    for name in ("int8", "fp8-e4m3", "int4"):
        codes, scales = quantize(rows, name)
        assert not codes.any() and not scales.any(), name
        assert not pack_tokens(rows, name).any(), name


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_error_bounds(name):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 3, 64)).astype(np.float32) * (10.0 ** rng.uniform(-2, 2, (64, 3, 1)))
    x = x.astype(np.float32)
    y = round_trip(x, name)
    assert y.dtype == np.float32 and y.shape == x.shape
    words = pack_tokens(x, name)
    assert np.array_equal(unpack_tokens(words, name, 3, 64), y)  # the GPU layout holds exactly these values
    err = np.abs(y.astype(np.float64) - x)
    if name == "f32":
        assert not err.any()
    elif name == "f16":
        assert (err <= np.maximum(np.abs(x) * 2.0 ** -11, 2.0 ** -25)).all()  # f16 subnormals: 2^-24 apart
    else:
        dt = kv_dtype(name)
        group = dt.group_for(64)
        grouped = x.reshape(64, 3, -1, group)  # (64, 3, groups, group)
        amax = np.abs(grouped).max(axis=-1, keepdims=True)  # (64, 3, groups, 1)
        d = amax * (1.0 / dt.qmax if dt.qmax else 1.0 / 448)
        err = err.reshape(64, 3, -1, group)
        if dt.asymmetric:  # half a step: (max - m) / 15 rounded up (2^-10 relative), m <= min by 2^-10 |min|
            lo, hi = grouped.min(axis=-1, keepdims=True), grouped.max(axis=-1, keepdims=True)
            d = np.maximum((hi - lo + np.abs(lo) * 2.0 ** -10) / 15.0 * (1 + 2.0 ** -10), 2.0 ** -14)
            assert (err <= d * 0.5 * (1 + 1e-6)).all()
        elif dt.qmax:  # half a step of the group's scale
            assert (err <= d * 0.5 * (1 + 1e-6)).all()
        else:  # 3 mantissa bits: half an ulp, 2^-4 relative, or 2^-10 * scale among subnormals
            assert (err <= np.maximum(np.abs(x.reshape(err.shape)) * 2.0 ** -4, d * 2.0 ** -10) * (1 + 1e-6)).all()
    rel = math.sqrt(float(np.mean(err ** 2) / np.mean(x.astype(np.float64) ** 2)))
    assert rel < {"f32": 1e-12, "f16": 3e-4, "int8": 1e-2, "fp8-e4m3": 4e-2, "int4": 0.2, "int4-asym": 0.12}[name]


@pytest.mark.parametrize("name", ["int4", "int4-asym"])
def test_packed_cache_feeds_the_attention_reference(name):
    rng = np.random.default_rng(2)
    values = rng.standard_normal((6, 8, 2, 16)).astype(np.float32)  # (num_blocks, block_size, n_kv, head_dim)
    k, v = PackedKV.pack(values, name), PackedKV.pack(values[::-1].copy(), name)
    assert k.shape == (6, 8, 2, 16) and k.words.shape == (6, 8, 8)
    tables, lens = np.array([[4, 1, 3], [0, 5, 2]]), np.array([19, 9])
    q = rng.standard_normal((2, 4, 16)).astype(np.float32)
    got = ref.paged_attention_ref(q, k, v, tables, lens, 0.25)
    assert np.array_equal(got, ref.paged_attention_ref(q, k.values(), v.values(), tables, lens, 0.25))
    new = rng.standard_normal((2, 2, 16)).astype(np.float32)
    k2, _ = ref.kv_write_ref(k, v, new, new, np.array([3, 40]))
    assert np.array_equal(k2.values().reshape(-1, 2, 16)[[3, 40]], round_trip(new, name))
    with pytest.raises(ValueError, match=f"{name} cache words must be"):
        PackedKV(k.words[..., :4], name, 2, 16)


def test_cpu_engine_runs_every_dtype_and_reports_it(tiny_weights):
    tok = Tokenizer.from_manifest(tiny_weights.manifest)
    params = SamplingParams(max_tokens=8, stop_token_ids=(10_000,))
    outputs = {}
    for name in NAMES:
        engine = LLMEngine(CpuBackend(tiny_weights, num_blocks=16, block_size=16, kv_dtype=name), tok,
                           EngineConfig(kv_dtype=name))
        outputs[name] = run_sync(engine.generate(list(range(3, 40)), params)).output_ids
        stats = engine.stats()
        assert stats["kv_dtype"] == name
        # tiny model: 2 layers, 2 kv heads of 16 channels
        assert stats["bytes_per_token"] == {"f32": 512, "f16": 256, "int8": 192, "fp8-e4m3": 192, "int4": 128,
                                          "int4-asym": 128}[name]
    assert all(len(o) == 8 for o in outputs.values())
    assert outputs["f16"] == outputs["f32"]  # 11-bit K/V do not move this tiny model's argmax


def test_engine_refuses_a_backend_of_another_dtype(tiny_weights):
    tok = Tokenizer.from_manifest(tiny_weights.manifest)
    with pytest.raises(ValueError, match="EngineConfig asks for int8 KV but the cpu backend holds f32"):
        LLMEngine(CpuBackend(tiny_weights, num_blocks=4, block_size=16), tok, EngineConfig(kv_dtype="int8"))
    with pytest.raises(ValueError, match=BAD_NAME):
        PagedKVCache.allocate(tiny_weights.config, 4, 16, "int3")


def test_blocks_per_budget_follow_from_the_dtype_through_the_ledger_plan(tiny_dir):
    from pagedkv.backends.webgpu.memory_plan import plan_kv_pool
    from pagedkv.model.weights import read_manifest

    manifest = read_manifest(tiny_dir)
    plans = {n: plan_kv_pool(manifest, budget_bytes=8 << 20, block_size=16, kv_dtype=n, max_num_batched_tokens=24,
                             max_num_seqs=4, max_binding=128 << 20) for n in NAMES}
    # tiny model: 2 layers x (K, V) x 16 tokens x bytes per token and layer (128 / 64 / 48 / 48 / 32 / 32)
    assert [plans[n]["block_bytes"] for n in NAMES] == [8192, 4096, 3072, 3072, 2048, 2048]
    assert [plans[n]["num_blocks"] for n in NAMES] == [965, 1962, 2627, 2627, 3957, 3957]
    for p in plans.values():  # the pool gets what weights, scratch and staging leave
        assert p["num_blocks"] == ((8 << 20) - p["fixed_bytes"]) // p["block_bytes"]
    with pytest.raises(ValueError, match=BAD_NAME):
        plan_kv_pool(manifest, budget_bytes=8 << 20, block_size=16, kv_dtype="int3", max_num_batched_tokens=24,
                     max_num_seqs=4, max_binding=128 << 20)
