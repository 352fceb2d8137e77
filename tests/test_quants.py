"""Every weight type: GGUF blocks <-> web parts losslessly, dequantization bit-identical to gguf's, the numpy
quantizers' accuracy, and llama.cpp's Q4_K_M type choice."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from pagedkv.model.layout import DTYPE_PARTS, LAYOUT_DOC, dequantize
from pagedkv.model.quantize import pack_k_scales, q4_k_m_types, quantize, random_gguf
from pagedkv.model.quants import (PROMOTIONS, WEIGHT_TYPES, common_type, from_gguf, k_scale_min, pack, pack_gguf,
                                  part_nbytes, promote, to_gguf, unpack)
from pagedkv.model.tiny import tiny_config
from pagedkv.model.weights import expected_shapes

QUANTIZED = [name for name, t in WEIGHT_TYPES.items() if t.quantized]
CODE_BITS = {"q8_0": 8, "q4_0": 4, "q4_1": 4, "q5_0": 5, "q5_1": 5, "q4_K": 4, "q5_K": 5, "q6_K": 6}
# RMS error of quantize() on N(0, 1) weights relative to their RMS: what the quantizers give (512-wide rows,
# seed 7) with a margin of about 10%; llama.cpp's own are 5-10% better on the K-quants.
RMS_BOUND = {"f32": 0.0, "f16": 2.3e-4, "bf16": 1.8e-3, "q8_0": 6e-3, "q4_0": 0.095, "q4_1": 0.087, "q5_0": 0.048,
             "q5_1": 0.042, "q4_K": 0.087, "q5_K": 0.042, "q6_K": 0.021}


def _gguf(name: str, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    return gguf_dequantize(raw, gguf.GGMLQuantizationType[WEIGHT_TYPES[name].gguf]).reshape(shape)


@pytest.mark.parametrize("name", QUANTIZED)
def test_random_blocks_repack_losslessly_and_dequantize_like_gguf(name):
    block = WEIGHT_TYPES[name].block
    shape = (64, 3 * block)  # enough weights for every code value to occur
    raw = random_gguf(name, *shape, seed=len(name) + block)
    fields = from_gguf(name, raw, shape)
    codes = range(-128, 128) if name == "q8_0" else range(2 ** CODE_BITS[name])
    assert set(np.unique(fields["q"]).tolist()) == set(codes)
    assert np.array_equal(to_gguf(name, fields), raw)
    parts = pack(name, fields)
    assert tuple(parts) == DTYPE_PARTS[name] and all(len(p) % 4 == 0 for p in parts.values())
    back = unpack(name, shape, parts)
    assert set(back) == set(fields) and all(np.array_equal(back[k], fields[k]) for k in fields)
    ours = dequantize(name, shape, parts)
    assert ours.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), _gguf(name, raw, shape).view(np.uint32))


@pytest.mark.parametrize("name", list(WEIGHT_TYPES))
def test_quantizers_make_valid_blocks_within_their_error_bound(name):
    w = np.random.default_rng(7).standard_normal((48, 512)).astype(np.float32)
    raw = quantize(w, name)
    assert raw.shape == (48, 512 // WEIGHT_TYPES[name].block * WEIGHT_TYPES[name].block_bytes)
    ours = dequantize(name, w.shape, pack_gguf(name, raw, w.shape))
    if WEIGHT_TYPES[name].quantized:
        assert np.array_equal(ours.view(np.uint32), _gguf(name, raw, w.shape).view(np.uint32))
    rel = float(np.sqrt(np.mean((ours - w) ** 2) / np.mean(w**2)))
    assert rel <= RMS_BOUND[name], (name, rel)
    assert rel >= RMS_BOUND[name] / 1.5, (name, rel)  # a bound far above the error would test nothing


def test_k_quantizers_keep_every_sub_block_scale_in_range():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((4, 512)) * np.repeat(rng.uniform(0.01, 3.0, (4, 16)), 32, axis=1)).astype(np.float32)
    for name, bound in (("q4_K", 0.09), ("q5_K", 0.045), ("q6_K", 0.03)):
        ours = dequantize(name, w.shape, pack_gguf(name, quantize(w, name), w.shape))
        sub_blocks = lambda a: np.mean((a**2).reshape(4, 16, 32), axis=2)  # noqa: E731
        err = np.sqrt(sub_blocks(ours - w) / sub_blocks(w))
        assert err.max() <= bound * 3, (name, err.max())  # the smallest sub-blocks share the 6-bit scale grid


def test_k_scale_packing_round_trips_every_value():
    ls, lm = np.meshgrid(np.arange(64, dtype=np.uint8), np.arange(64, dtype=np.uint8))
    ls, lm = ls.reshape(-1, 8), lm.reshape(-1, 8)
    sc, mn = k_scale_min(pack_k_scales(ls, lm))
    assert np.array_equal(sc, ls) and np.array_equal(mn, lm)


def test_documented_bit_layouts_of_the_new_types():
    # q5_0: weight 0 = code 17 (nibble 1 + high bit), weight 31 = code 16 (nibble 0 + high bit), d = 0.5
    q = np.zeros((1, 32), np.uint8)
    q[0, 0], q[0, 31] = 17, 16
    parts = pack("q5_0", {"q": q, "d": np.array([[0.5]], np.float16)})
    words = np.frombuffer(parts["qs"], "<u4")
    dh = np.frombuffer(parts["dh"], "<u4")
    assert words.tolist() == [1, 0, 0, 0] and dh.tolist() == [0x3800, 0x80000001]
    assert dequantize("q5_0", (1, 32), parts)[0, [0, 1, 31]].tolist() == [0.5, -8.0, 0.0]
    # q6_K: every code 32 (high pair 0b10) but weight 17 = 0b11_0011 (low nibble 3 in qs word 2, high pair 3 at
    # bits 2-3 of word 1), group 1 scale -2, d 0.25
    q = np.full((1, 256), 32, np.uint8)
    q[0, 17] = 0b110011
    sc = np.ones((1, 1, 16), np.int8)
    sc[0, 0, 1] = -2
    parts = pack("q6_K", {"q": q, "sc": sc, "d": np.array([[0.25]], np.float16)})
    sc_words = np.frombuffer(parts["sc"], "<u4")
    assert len(sc_words) == 21 and sc_words[1] == 0xAAAAAAAE and sc_words[0] == 0xAAAAAAAA and sc_words[20] == 0x3400
    assert np.frombuffer(parts["qs"], "<u4")[2] == 3 << 4
    assert dequantize("q6_K", (1, 256), parts)[0, 17] == 0.25 * -2 * (51 - 32)
    assert set(LAYOUT_DOC) >= set(WEIGHT_TYPES)


def test_bad_shapes_and_short_parts_are_named():
    with pytest.raises(ValueError, match=r"q4_K tensor must be 2-D with cols a multiple of 256, got shape \[4, 576\]"):
        quantize(np.zeros((4, 576), np.float32), "q4_K")
    with pytest.raises(ValueError, match=r"q6_K tensor of shape \[1, 256\] needs 210 GGUF bytes, got 200"):
        from_gguf("q6_K", np.zeros(200, np.uint8), (1, 256))
    with pytest.raises(ValueError, match="q5_K part 'sc' holds 40 bytes, needs 48"):
        dequantize("q5_K", (1, 256), {"qs": bytes(128), "sc": bytes(40)})
    with pytest.raises(ValueError, match="cannot quantize to q4_0: the input has 1 non-finite values"):
        quantize(np.array([[np.nan] + [0.0] * 31], np.float32), "q4_0")


def test_q4_k_m_mix_follows_llama_cpp_on_smollm2_shapes():
    cfg = tiny_config().__class__(**{**tiny_config().to_json(), "n_layers": 30, "hidden": 576, "n_heads": 9,
                                     "n_kv_heads": 3, "head_dim": 64, "ffn": 1536, "vocab": 49152})
    types = q4_k_m_types(expected_shapes(cfg), cfg.n_layers)
    assert types["token_embd.weight"] == "q8_0"  # tied: q6_K, whose 576-wide rows fall back to q8_0
    assert types["output_norm.weight"] == "f32"
    # use_more_bits(i, 30): i < 3, i >= 26, or (i - 3) % 3 == 2
    more = [i for i in range(30) if types[f"blk.{i}.ffn_down.weight"] == "q6_K"]
    assert more == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert {types[f"blk.{i}.ffn_down.weight"] for i in range(30) if i not in more} == {"q4_K"}  # 1536 = 6 x 256
    assert [types[f"blk.{i}.attn_v.weight"] for i in (0, 3, 5)] == ["q8_0", "q5_0", "q8_0"]
    assert {types[f"blk.{i}.{n}.weight"] for i in range(30) for n in ("attn_q", "attn_k", "attn_output", "ffn_gate",
                                                                      "ffn_up")} == {"q5_0"}
    untied = q4_k_m_types({"output.weight": (1000, 512), "token_embd.weight": (1000, 512)}, 1)
    assert untied == {"output.weight": "q6_K", "token_embd.weight": "q4_K"}


def test_converter_packs_every_type_read_back_from_a_gguf_file(tmp_path):
    """convert._pack_tensor on tensors as GGUFReader returns them (u8 block rows; f32 / f16 arrays)."""
    from pagedkv.model.convert import _pack_tensor

    w = np.random.default_rng(9).standard_normal((4, 512)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "types.gguf"), "llama")
    for name in WEIGHT_TYPES:
        raw = quantize(w, name)
        data = raw.view({"f32": np.float32, "f16": np.float16}.get(name, np.uint8))
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[WEIGHT_TYPES[name].gguf])  # u8: a block shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(tmp_path / "types.gguf")
    assert [t.name for t in reader.tensors] == list(WEIGHT_TYPES)
    for tensor in reader.tensors:
        packed = _pack_tensor(tensor, w.shape)
        assert packed.dtype == tensor.name
        want = gguf_dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(w.shape).astype(np.float32)
        assert np.array_equal(dequantize(packed.dtype, w.shape, packed.parts).view(np.uint32), want.view(np.uint32))


def test_lossless_promotions_dequantize_bit_identically():
    for name, targets in PROMOTIONS.items():
        shape = (16, 2 * WEIGHT_TYPES[name].block)
        raw = random_gguf(name, *shape, seed=11)
        want = dequantize(name, shape, pack_gguf(name, raw, shape))
        for target in targets:
            parts = pack(target, promote(name, target, from_gguf(name, raw, shape)))
            got = dequantize(target, shape, parts)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, target)
    sets = ({"q5_0", "q8_0"}, {"q4_0", "q5_0", "q8_0"}, {"q4_K", "q5_K"}, {"q4_1"}, {"q4_K", "q6_K"}, {"q4_1", "q8_0"})
    assert [common_type(s) for s in sets] == ["q8_0", "q8_0", "q5_K", "q4_1", None, None]
    with pytest.raises(ValueError, match="q4_K weights cannot be held losslessly as q6_K"):
        promote("q4_K", "q6_K", {})


def test_stacked_projections_of_different_types_meet_in_their_common_type():
    """llama.cpp's Q4_K_M on SmolLM2: attn_q / attn_k q5_0 beside attn_v q8_0 -> one q8_0 stack, same weights."""
    from pagedkv.backends.webgpu.fused import stack_rows, stacked_nbytes

    members = [(name, (rows, 64), pack_gguf(name, random_gguf(name, rows, 64, seed=rows), (rows, 64)))
               for name, rows in (("q5_0", 16), ("q4_0", 8), ("q8_0", 8))]
    gain = ("f32", (64,), {"data": np.ones(64, np.float32).tobytes()})
    dtype, shape, parts = stack_rows("blk.0.attn_qkv.weight", [*members, gain])
    assert (dtype, shape) == ("q8_0", (32, 64))
    assert {k: len(v) for k, v in parts.items()} == stacked_nbytes([(d, s) for d, s, _ in members] + [gain[:2]])
    rows = [dequantize(d, s, p) for d, s, p in members]
    parts["qs"] = parts["qs"][: 32 * 64]  # without the norm weight stored after the codes
    assert np.array_equal(dequantize("q8_0", shape, parts), np.concatenate(rows))
    with pytest.raises(ValueError, match=r"types \['q4_K', 'q6_K'\] have no lossless common type"):
        stacked_nbytes([("q4_K", (8, 256)), ("q6_K", (8, 256)), ("f32", (256,))])


def test_q4_k_m_llama_layers_with_a_q6_k_v_run_q_k_v_unstacked_and_the_ledger_counts_the_members():
    """llama.cpp's Q4_K_M of Llama-3.2-1B's shapes: attn_v is q6_K (no lossless common type with the q4_K q / k)
    in the layers use_more_bits() names, so their q / k / v are uploaded as they are; the rest stack."""
    from pagedkv.backends.webgpu.fused import stacks
    from pagedkv.backends.webgpu.memory_plan import weights_bytes

    cfg = tiny_config().__class__(**{**tiny_config().to_json(), "n_layers": 16, "hidden": 2048, "n_heads": 32,
                                     "n_kv_heads": 8, "head_dim": 64, "ffn": 8192, "vocab": 128256})
    shapes = expected_shapes(cfg)
    types = q4_k_m_types(shapes, cfg.n_layers)
    qkv = [[types[f"blk.{i}.attn_{m}.weight"] for m in "qkv"] for i in range(16)]
    assert [i for i in range(16) if not stacks(qkv[i])] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert all(stacks([types[f"blk.{i}.ffn_gate.weight"], types[f"blk.{i}.ffn_up.weight"]]) for i in range(16))
    manifest = {"tensors": {name: {"dtype": types[name], "shape": list(shape), "parts": {
        part: {"nbytes": n} for part, n in part_nbytes(types[name], shape).items()}} for name, shape in shapes.items()}}
    # web parts: q4_K 144 bytes per 256 weights, q6_K 212; f32 norms alone and after each stack's codes.
    # q6_K: the tied embedding, attn_v and ffn_down in the 8 layers above; a stack: its members' codes.
    q4, q6, norm = 144 * 2048, 212 * 2048, 4 * 2048  # bytes of 256 x 2048 weights; of a norm weight
    embd = 128256 // 256 * q6 + norm  # + output_norm
    layer = 4 * norm + (8 + 8 + 64 + 2 + 2 + 32) * q4  # 2 norms (alone, in their stacks); q, o, gate|up, k, v, down
    more = (2 + 32) * (q6 - q4) - norm  # attn_v, ffn_down q6_K; q|k|v unstacked (no norm copy)
    assert weights_bytes(manifest) == embd + 16 * layer + 8 * more == 803_225_600


def test_unstacked_members_upload_under_their_own_names_in_the_bytes_planned(tmp_path):
    """The tiny Q4_K_M model (tiny.Q4_K_M_DTYPES): layer 0's q4_K q / k + q6_K v and q4_K gate + q6_K up upload
    as they are, layer 1's stacks; the ledger reserves exactly what weights_bytes planned."""
    from types import SimpleNamespace

    from pagedkv.backends.webgpu.backend import WebGpuBackend
    from pagedkv.backends.webgpu.memory_plan import weights_bytes
    from pagedkv.backends.webgpu.weight_upload import upload_weights
    from pagedkv.engine import run_sync
    from pagedkv.gpu_budget import GpuLedger
    from pagedkv.model.tiny import Q4_K_M_DTYPES, mixed_config, write_tiny_model

    manifest = write_tiny_model(tmp_path, dtypes=Q4_K_M_DTYPES, config=mixed_config())
    ctx = SimpleNamespace(buffer=lambda nbytes, label, **kw: label, write=lambda buf, data: None,
                          info=SimpleNamespace(limits={"maxStorageBufferBindingSize": 1 << 30}))
    b = WebGpuBackend(ctx, mixed_config(), GpuLedger(1 << 30), block_size=16, kv_dtype="f32",
                      max_num_batched_tokens=8, max_num_seqs=1)

    async def source(name: str) -> bytes:
        return (tmp_path / name).read_bytes()

    run_sync(upload_weights(b, manifest, source, None))  # not asyncio.run: Playwright may own this thread's loop
    layers = [{n.split(".", 2)[2]: d for n, (d, _) in b.weights.items() if n.startswith(f"blk.{i}.")} for i in (0, 1)]
    assert layers == [
        {"attn_norm.weight": "f32", "attn_q.weight": "q4_K", "attn_k.weight": "q4_K", "attn_v.weight": "q6_K",
         "attn_output.weight": "q4_K", "ffn_norm.weight": "f32", "ffn_gate.weight": "q4_K", "ffn_up.weight": "q6_K",
         "ffn_down.weight": "q6_K"},
        {"attn_norm.weight": "f32", "attn_qkv.weight": "q4_K", "attn_output.weight": "q4_K", "ffn_norm.weight": "f32",
         "ffn_gate_up.weight": "q4_K", "ffn_down.weight": "q4_K"}]
    assert b.ledger.by_kind()["weights"] == weights_bytes(manifest)
