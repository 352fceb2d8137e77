"""The wasm CPU path's Python side in CPython: the kernel layout (rows dequantize bit-identically), and
CpuBackend(linear="wasm") over pointer_twin (the kernel's numpy twin over the same addresses). The built wasm
kernel itself runs in tests/test_cpu_wasm_wasmtime.py (wasmtime) and tests/browser/test_cpu_wasm_page.py (Chromium).

Bounds: a product through the twin is x @ W.T in f32 with W exactly numpy's dequantized weights, so against
f64 its error is within f32 dot-product rounding: |y - y64| <= cols * 2^-24 * (|x| @ |W|^T) per output.
"""
import gc

import numpy as np
import pytest
from gguf_models import TINY_K, tiny_gguf
from model_fixtures import gguf_path, tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from test_gguf_architectures import MODELS
from test_cpu_linear import prefill_then_decode

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.cpu_wasm import (ACT8, ACT16, XQ_MAX, HeapStore, QuantWeight, Region, SharedStore, ThreadsTwin,
                                      act_bits, chunks, d_pad, integer_products, kind_code, pointer_twin,
                                      quantize_activations, stack_projections, tensor_loader)
from pagedkv.model.convert import convert_cached
from pagedkv.model.layout import dequantize, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0
from pagedkv.model.quants import pack_gguf
from pagedkv.model.quantize import quantize
from pagedkv.model.weights import ModelWeights

def random_weight(dtype: str, rows: int, cols: int, seed: int) -> tuple[dict, np.ndarray]:
    """Web parts of a random (rows, cols) weight of `dtype` and numpy's dequantization of them."""
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    if dtype == "q4_1":
        parts = pack_q4_1(*quantize_q4_1(w))
    elif dtype == "q8_0":
        parts = pack_q8_0(*quantize_q8_0(w))
    else:
        parts = pack_gguf(dtype, quantize(w, dtype), (rows, cols))
    return parts, dequantize(dtype, (rows, cols), parts)


# Every quantized type the converter keeps, and the kernel layout that holds it (K-quants: rows of 256-weight blocks)
HELD = [("q4_1", "q4_1"), ("q8_0", "q8_0"), ("q4_0", "q8_0"), ("q5_0", "q8_0"), ("q5_1", "q8_m"), ("q4_K", "q4_1"),
        ("q5_K", "q8_m"), ("q6_K", "q8_16")]


def width(dtype: str) -> int:
    return 512 if dtype.endswith("K") else 96


@pytest.mark.parametrize("dtype,kind", HELD)
def test_the_kernel_layout_holds_the_same_weights(dtype, kind):
    cols = width(dtype)
    parts, ref = random_weight(dtype, 37, cols, seed=5)
    w = QuantWeight.from_parts(dtype, (37, cols), parts, HeapStore(pointer_twin))
    row_q = cols // 2 if kind == "q4_1" else cols
    assert (w.kind, w.shape, w.qs.shape, w.dm.shape) == (kind, (37, cols), (37, row_q), (37, cols // 32, 2))
    assert w.nbytes == 37 * row_q + 37 * (cols // 32) * 8
    assert np.array_equal(w[np.arange(37)], ref)  # bit-identical, so only the summation order differs
    assert np.array_equal(w[[36, 0, 36]], ref[[36, 0, 36]])


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0", "q5_1", "q4_K", "q5_K", "q6_K"])
@pytest.mark.parametrize("tokens", [1, 5, 37])
def test_products_through_the_twin_are_x_at_w_t_within_f32_rounding(dtype, tokens):
    cols = width(dtype)
    parts, ref = random_weight(dtype, 37, cols, seed=tokens)
    w = QuantWeight.from_parts(dtype, (37, cols), parts, HeapStore(pointer_twin))
    x = np.random.default_rng(9).standard_normal((tokens, cols)).astype(np.float32)
    y = x @ w.T  # (tokens, 37)
    want = x.astype(np.float64) @ ref.T.astype(np.float64)
    bound = cols * 2.0**-24 * (np.abs(x).astype(np.float64) @ np.abs(ref.T).astype(np.float64))
    assert y.shape == (tokens, 37) and y.dtype == np.float32
    assert np.all(np.abs(y - want) <= bound)
    assert np.array_equal((x[:0] @ w.T).shape, (0, 37))
    with pytest.raises(ValueError, match=rf"projection input \(2, 64\) does not match weight \(37, {cols}\) \(out, in\)"):
        np.ones((2, 64), np.float32) @ w.T


def test_the_wasm_path_holds_quantized_blocks_and_gives_the_reference_ids(tiny_dir):  # noqa: F811
    manifest_weights = ModelWeights.load(tiny_dir)
    shards = {s["file"]: (tiny_dir / s["file"]).read_bytes() for s in manifest_weights.manifest["shards"]}
    quantized = ModelWeights.from_shards(manifest_weights.manifest, shards, tensor_loader(HeapStore(pointer_twin)))
    held = {n for n, t in quantized.tensors.items() if isinstance(t, QuantWeight)}
    assert held == {"token_embd.weight"} | {f"blk.{i}.{p}.weight" for i in range(2) for p in (
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    assert np.array_equal(quantized.tensors["blk.1.attn_norm.weight"], manifest_weights.tensors["blk.1.attn_norm.weight"])
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, manifest_weights.config.vocab, 40)]
    want_pre, want_dec = prefill_then_decode(CpuBackend(manifest_weights, 4, 16), prompt, 6)
    got_pre, got_dec = prefill_then_decode(CpuBackend(quantized, 4, 16, linear="wasm"), prompt, 6)
    assert float(np.abs(got_pre - want_pre).max() / np.abs(want_pre).max()) <= 2e-6  # the twin sums as BLAS does
    assert np.array_equal(got_pre.argmax(axis=1), want_pre.argmax(axis=1))
    assert [int(g.argmax()) for g in got_dec] == [int(w.argmax()) for w in want_dec]


def test_a_q8_0_head_with_integer_activations_is_held_without_its_zero_mins(tiny_dir):  # noqa: F811
    """The tiny model's q8_0 tied embedding through a store with integer activations: held as q8_d (head_blocks:
    its codes and one f32 d a block, 36 bytes a block and a row's padding to 16 bytes, not 40), its rows' lookups the
    reference's f32 exactly; with
    f32 activations it keeps the (d, m) layout; q8_d with f32 activations is refused by name."""
    plain = ModelWeights.load(tiny_dir)
    shards = {s["file"]: (tiny_dir / s["file"]).read_bytes() for s in plain.manifest["shards"]}
    vocab, hidden = plain.config.vocab, plain.config.hidden
    for activations, kind, nbytes in (("int16", "q8_d", vocab * (d_pad(hidden // 32) + hidden)),
                                      ("f32", "q8_0", vocab * hidden // 32 * 40)):
        w = ModelWeights.from_shards(plain.manifest, shards, tensor_loader(HeapStore(pointer_twin, activations)))
        head = w.tensors["token_embd.weight"]
        assert (head.kind, head.nbytes) == (kind, nbytes)
        assert np.array_equal(head[[5, 0, vocab - 1]], plain.tensors["token_embd.weight"][[5, 0, vocab - 1]])
    with pytest.raises(ValueError, match="q8_d weights \\(d without m\\) run with integer activations only"):
        QuantWeight("q8_d", np.zeros((2, 32), np.int8), np.zeros((2, 1), np.float32), HeapStore(pointer_twin))


@pytest.mark.parametrize("name", sorted(TINY_K))
def test_k_quant_files_hold_every_projection_in_the_kernel_and_give_the_reference_ids(gguf_path, name):  # noqa: F811
    """The K-quant GGUFs made at test time (q4_K, q5_K, q6_K, both Q4_K_M mixes): every projection and the head
    held quantized, the f32 reference's logits within the twin's summation order, its greedy ids."""
    converted = convert_cached(tiny_gguf(name, gguf_path), MODELS)
    reference = ModelWeights.load(converted)
    shards = {s["file"]: (converted / s["file"]).read_bytes() for s in reference.manifest["shards"]}
    quantized = ModelWeights.from_shards(reference.manifest, shards, tensor_loader(HeapStore(pointer_twin)))
    projections = {n for n in reference.tensors if n.endswith(".weight") and "norm" not in n}
    assert {n for n, t in quantized.tensors.items() if isinstance(t, QuantWeight)} == projections
    prompt = [int(t) for t in np.random.default_rng(3).integers(3, reference.config.vocab, 24)]
    want_pre, want_dec = prefill_then_decode(CpuBackend(reference, 4, 16), prompt, 5)
    got_pre, got_dec = prefill_then_decode(CpuBackend(quantized, 4, 16, linear="wasm"), prompt, 5)
    assert float(np.abs(got_pre - want_pre).max() / np.abs(want_pre).max()) <= 2e-6
    assert [int(g.argmax()) for g in got_dec] == [int(w.argmax()) for w in want_dec]


def test_types_without_a_kernel_keep_einsum_and_bad_layouts_are_refused(tiny_dir):  # noqa: F811
    weights = ModelWeights.load(tiny_dir)
    backend = CpuBackend(weights, 4, 16, linear="wasm")  # f32 tensors: every projection through einsum
    assert type(backend.model.w["blk.0.ffn_up.weight"]).__name__ == "EinsumWeight"
    with pytest.raises(ValueError,
                       match=r"q4_1 weight: qs \(2, 31\) and dm \(2, 2, 2\) float32 are not the kernel's layout"):
        QuantWeight("q4_1", np.zeros((2, 31), np.uint8), np.zeros((2, 2, 2), np.float32), HeapStore(pointer_twin))


@pytest.mark.parametrize("rows,threads,want", [
    (37, 2, [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 18), (18, 21), (21, 24), (24, 27), (27, 30), (30, 33),
             (33, 36), (36, 37)]),
    (960, 2, [(60 * i, 60 * i + 60) for i in range(16)]), (5, 3, [(i, i + 1) for i in range(5)])])
def test_rows_split_into_chunks_the_threads_claim(rows, threads, want):
    assert chunks(rows, threads) == want


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0"])
@pytest.mark.parametrize("threads", [2, 3])
def test_a_shared_store_splits_rows_across_threads_and_gives_the_heap_stores_products(dtype, threads):
    parts, ref = random_weight(dtype, 37, 96, seed=threads)
    twin = ThreadsTwin(threads)
    shared = QuantWeight.from_parts(dtype, (37, 96), parts, SharedStore(twin))
    heap = QuantWeight.from_parts(dtype, (37, 96), parts, HeapStore(pointer_twin))
    assert isinstance(shared.qs, Region) and len(twin._live) == 2  # qs and dm live in the threads' memory
    assert np.array_equal(shared[np.arange(37)], ref) and np.array_equal(shared[[36, 0, 36]], ref[[36, 0, 36]])
    for t in (1, 5, 37):
        x = np.random.default_rng(t).standard_normal((t, 96)).astype(np.float32)
        bound = 96 * 2.0**-24 * (np.abs(x).astype(np.float64) @ np.abs(ref.T).astype(np.float64))
        y = x @ shared.T
        assert y.shape == (t, 37) and np.all(np.abs(y - x.astype(np.float64) @ ref.T.astype(np.float64)) <= bound)
        assert np.allclose(y, x @ heap.T, rtol=0, atol=float(bound.max()))
    assert twin.split_calls == 3
    del shared
    gc.collect()
    assert twin._live == {}  # a dropped weight's bytes go back to the threads' memory


def test_small_products_stay_on_one_thread():
    parts, _ = random_weight("q4_1", 37, 96, seed=1)
    twin = ThreadsTwin(2, min_work=37 * 96 * 2)
    w = QuantWeight.from_parts("q4_1", (37, 96), parts, SharedStore(twin))
    np.ones((1, 96), np.float32) @ w.T
    assert twin.split_calls == 0
    np.ones((2, 96), np.float32) @ w.T
    assert twin.split_calls == 1


@pytest.mark.parametrize("stacked", [False, True])
def test_the_wasm_path_on_threads_gives_the_single_threads_ids(tiny_dir, stacked):  # noqa: F811
    """Threads (ThreadsTwin, every product split) and q|k|v, gate|up stacked into one product each."""
    weights = ModelWeights.load(tiny_dir)
    shards = {s["file"]: (tiny_dir / s["file"]).read_bytes() for s in weights.manifest["shards"]}
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, weights.config.vocab, 30)]
    runs = []
    for store in (HeapStore(pointer_twin), SharedStore(ThreadsTwin(2))):
        w = ModelWeights.from_shards(weights.manifest, shards, tensor_loader(store))
        if stacked and isinstance(store, SharedStore):
            stack_projections(w.tensors, w.config.n_layers)
            qkv, gate_up = w.tensors["blk.1.attn_qkv.weight"], w.tensors["blk.1.ffn_gate_up.weight"]
            cfg = w.config
            assert qkv.parts == (cfg.n_heads * cfg.head_dim, *[cfg.n_kv_heads * cfg.head_dim] * 2)
            assert gate_up.parts == (gate_up.shape[0] // 2,) * 2 and "blk.1.attn_q.weight" not in w.tensors
            held = [t for t in w.tensors.values() if isinstance(t, QuantWeight)]
            assert len(store.js._live) == 2 * len(held)  # qs and dm of what is held: the stacked ones freed
        runs.append(prefill_then_decode(CpuBackend(w, 4, 16, linear="wasm"), prompt, 6))
    (pre_a, dec_a), (pre_b, dec_b) = runs
    assert float(np.abs(pre_b - pre_a).max() / np.abs(pre_a).max()) <= 2e-6
    assert [int(g.argmax()) for g in dec_b] == [int(g.argmax()) for g in dec_a]


# (activations, dtype, the bits its products take x at): int8 takes 4-bit codes (q4_1, q4_K) at 8 bits, 8-bit codes at 16
INTEGER = [("int16", "q4_1", 16), ("int16", "q8_0", 16), ("int16", "q5_1", 16), ("int16", "q4_K", 16),
           ("int16", "q6_K", 16), ("int8", "q4_1", 8), ("int8", "q4_K", 8), ("int8", "q8_0", 16), ("int8", "q6_K", 16)]


@pytest.mark.parametrize("activations,dtype,bits", INTEGER)
def test_integer_activations_are_within_the_quantization_of_x_and_each_token_as_alone(activations, dtype, bits):
    """kind | ACT16 / ACT8: x quantized per 32-value block (d = max |x| / 32767 or / 127), integer dot products.
    Against f64 x @ W.T the error is the activations' rounding, |W| @ (d / 2) per output, plus f32 rounding of the
    block sums; against f64 W @ (q d), the weights times the quantized x (the mins' term too: xsum = d * sum(q)),
    only f32 rounding. Several tokens (prefill, a batch): each token's products bit-identical to its own one-token
    product, so a reply does not depend on what it was batched with."""
    cols = width(dtype)
    parts, ref = random_weight(dtype, 37, cols, seed=4)
    quant = QuantWeight.from_parts(dtype, (37, cols), parts, HeapStore(pointer_twin, activations))
    f32 = QuantWeight.from_parts(dtype, (37, cols), parts, HeapStore(pointer_twin))
    assert act_bits(kind_code(quant.kind, activations)) == bits
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    x[0, 32:64] = 0.0  # an all-zero block: scale 0, codes 0
    xsum, d, q = quantize_activations(x[0], bits)
    assert d[1] == 0 and not q[1].any() and np.abs(q).max() == XQ_MAX[bits]
    y = x @ quant.T
    want = x.astype(np.float64) @ ref.T.astype(np.float64)  # (1, 37)
    step = np.repeat(d.astype(np.float64), 32)  # (cols,) each value's quantization step
    bound = np.abs(ref).astype(np.float64) @ (step / 2) + cols * 2.0**-24 * (np.abs(x) @ np.abs(ref.T))[0]
    assert np.all(np.abs(y[0] - want[0]) <= bound)
    xq = (q.astype(np.float64) * d[:, None]).reshape(-1)  # (cols,) the quantized x
    qs, dm = quant.store.fetch(quant.qs), quant.store.fetch(quant.dm)
    codes = qs if quant.kind == "q4_1" else np.abs(qs.astype(np.int16))
    unit = integer_products(quant.kind, codes, np.abs(dm), np.abs(xsum), d, np.abs(q.astype(np.int16))).astype(np.float64)
    nb = cols // 32
    assert np.all(np.abs(y[0] - ref.astype(np.float64) @ xq) <= (nb + 8) * 2.0**-24 * unit)
    assert float(np.abs(y - x @ f32.T).max()) > 0  # not the f32 path
    xs = rng.standard_normal((6, cols)).astype(np.float32)
    assert np.array_equal(xs @ quant.T, np.concatenate([xs[i:i + 1] @ quant.T for i in range(6)]))
    assert float(np.abs(xs @ quant.T - xs @ f32.T).max()) > 0


def test_8_bit_activations_round_to_127_steps_and_take_only_unsigned_codes():
    """8-bit activations meet codes the relaxed dot takes as its 0..127 operand: q4_1's, q8_m's (q5_1, q5_K, and
    q5_0 + 16 under int8); signed 8-bit codes take 16-bit activations."""
    x = np.array([0.5, -1.0, 0.25, 1e-3] * 8, np.float32)
    xsum, d, q = quantize_activations(x, 8)
    assert q.dtype == np.int8 and d[0] == np.float32(1.0) / np.float32(127)
    assert q[0, :4].tolist() == [64, -127, 32, 0]  # 63.5 rounds to even: 64
    assert xsum[0] == d[0] * np.float32(q.sum(dtype=np.int32))
    assert [kind_code(k, "int8") for k in ("q4_1", "q8_0", "q8_m", "q8_16")] == [ACT8, 1 | ACT16, 17 | ACT8, 9 | ACT16]
    assert [kind_code("q4_1", a) for a in ("f32", "int16")] == [0, ACT16]
    with pytest.raises(ValueError, match="activations must be one of f32, int16, int8, got 'int4'"):
        HeapStore(pointer_twin, "int4")
    with pytest.raises(ValueError, match="8-bit activations take 4-bit codes or 0..127 ones"):
        pointer_twin(1 | ACT8, 0, 0, 1, 32, 0, 1, 0, 1, 0)


@pytest.mark.parametrize("activations", ["int16", "int8"])
def test_threads_quantize_the_tokens_once_and_give_the_one_threads_integer_products(activations):
    parts, _ = random_weight("q4_1", 37, 96, seed=6)
    heap = QuantWeight.from_parts("q4_1", (37, 96), parts, HeapStore(pointer_twin, activations))
    shared = QuantWeight.from_parts("q4_1", (37, 96), parts, SharedStore(ThreadsTwin(2), activations))
    for tokens in (1, 5):
        x = np.random.default_rng(7).standard_normal((tokens, 96)).astype(np.float32)
        assert np.array_equal(x @ shared.T, x @ heap.T)  # the same per-row sums, only split


@pytest.mark.parametrize("activations,most", [("int16", 4e-4), ("int8", 6e-2)])
def test_integer_activations_stay_near_the_f32_logits(tiny_dir, activations, most):  # noqa: F811
    """The tiny model's prefill and first decode step through integer activations: logits within `most` of the
    largest of f32's (the activations' rounding through two layers: 16 bits measured 9e-5 and 6e-5, 8 bits 2.7%),
    the same greedy ids."""
    weights = ModelWeights.load(tiny_dir)
    shards = {s["file"]: (tiny_dir / s["file"]).read_bytes() for s in weights.manifest["shards"]}
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, weights.config.vocab, 30)]
    runs = []
    for acts in ("f32", activations):
        w = ModelWeights.from_shards(weights.manifest, shards, tensor_loader(HeapStore(pointer_twin, acts)))
        runs.append(prefill_then_decode(CpuBackend(w, 4, 16, linear="wasm"), prompt, 1))
    (pre_a, (dec_a,)), (pre_b, (dec_b,)) = runs
    for a, b in ((pre_a, pre_b), (dec_a, dec_b)):
        err = float(np.abs(b - a).max() / np.abs(a).max())
        assert 0 < err <= most, err
    assert np.array_equal(pre_b.argmax(axis=1), pre_a.argmax(axis=1)) and int(dec_b.argmax()) == int(dec_a.argmax())


def test_q5_0_takes_8_bit_activations_and_goes_back_to_q8_0_to_stack_beside_a_q8_0_part():
    """Under int8, q5_0 is held as q8_m (its 0..31 codes, m = -16 d: the relaxed dot's operand) with the same
    weights; llama.cpp's Q4_K_M q | k (q5_0) beside a q8_0 v go back to q8_0 to stack as one product, while gate |
    up, both q5_0, stack as q8_m through 8-bit activations, giving the twin's integer products."""
    store, cols = HeapStore(pointer_twin, "int8"), 64
    tensors, want = {}, {}
    for name, dtype, rows in (("attn_q", "q5_0", 8), ("attn_k", "q5_0", 4), ("attn_v", "q8_0", 4),
                              ("ffn_gate", "q5_0", 12), ("ffn_up", "q5_0", 12)):
        parts, f32 = random_weight(dtype, rows, cols, seed=rows + len(name))
        tensors[f"blk.0.{name}.weight"] = QuantWeight.from_parts(dtype, (rows, cols), parts, store)
        want[name] = f32
    assert [tensors[f"blk.0.{n}.weight"].kind for n in ("attn_q", "attn_v", "ffn_up")] == ["q8_m", "q8_0", "q8_m"]
    assert np.array_equal(tensors["blk.0.attn_q.weight"][np.arange(8)], want["attn_q"])  # the same weights
    stack_projections(tensors, 1)
    qkv, gate_up = tensors["blk.0.attn_qkv.weight"], tensors["blk.0.ffn_gate_up.weight"]
    assert (qkv.kind, qkv.parts, gate_up.kind, gate_up.parts) == ("q8_0", (8, 4, 4), "q8_m", (12, 12))
    assert np.array_equal(qkv[np.arange(16)], np.concatenate([want[n] for n in ("attn_q", "attn_k", "attn_v")]))
    assert kind_code(gate_up.kind, "int8") == 17 | ACT8
    x = np.random.default_rng(3).standard_normal((3, cols)).astype(np.float32)
    y = x @ gate_up.T
    for i in range(3):
        xsum, d, q = quantize_activations(x[i], 8)
        twin = integer_products("q8_m", gate_up.qs, gate_up.dm, xsum, d, q)
        assert np.allclose(y[i], twin, rtol=0, atol=1e-5 * float(np.abs(twin).max()))
