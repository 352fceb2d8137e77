"""The wasm attention's Python side in CPython (py/pagedkv/backends/cpu_attention.py) over PointerTwin, the
kernels' numpy twin on the same addresses. The wasm kernels themselves run in tests/browser/test_cpu_wasm_page.py.

Bounds: decode and prefill differ from NumpyModel only in the f32 summation order of q . k and p @ v, so logits
agree within |got - want| <= 2e-6 * max |want| and the attention mass within 1e-6 per block (1e-5 summed over a
chunk's tokens).
"""
from collections import Counter

import numpy as np
import pytest
from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)
from test_cpu_linear import prefill_then_decode

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.cpu_attention import PointerTwin, WasmAttentionModel
from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache
from pagedkv.model_runner import ForwardBatch

i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
TABLES = [[7, 2, 9, 0], [4, 11, 1, 5]]  # scattered, out of order: (2 sequences, 4 blocks of 16)
PROMPTS = (21, 35)  # tokens each sequence prefilled; 35 spans a third block


def _prefilled(weights) -> tuple[PagedKVCache, list[int]]:
    """Both sequences prefilled by the reference into one 12-block cache; each one's greedy next token."""
    kv = PagedKVCache.allocate(weights.config, 12, 16)
    ref, nexts = NumpyModel(weights), []
    rng = np.random.default_rng(3)
    for table, n in zip(TABLES, PROMPTS):
        pos = np.arange(n)
        slots = i32(np.asarray(table)[pos // 16] * 16 + pos % 16)
        logits = ref.forward(ForwardBatch(i32(rng.integers(3, weights.config.vocab, n)), i32(pos), slots,
                                          i32([0, n]), i32([table]), i32([n])), kv)
        nexts.append(int(logits[0].argmax()))
    return kv, nexts


def _decode_batch(nexts: list[int]) -> ForwardBatch:
    pos = [PROMPTS[0], PROMPTS[1]]
    slots = [TABLES[s][p // 16] * 16 + p % 16 for s, p in enumerate(pos)]
    return ForwardBatch(i32(nexts), i32(pos), i32(slots), i32([0, 1, 2]), i32(TABLES), i32([p + 1 for p in pos]))


def _copy(kv: PagedKVCache) -> PagedKVCache:
    return PagedKVCache(tuple(k.copy() for k in kv.k), tuple(v.copy() for v in kv.v), kv.kv_dtype)


def test_two_decoding_sequences_on_scattered_tables_match_the_reference(tiny_weights):  # noqa: F811
    kv, nexts = _prefilled(tiny_weights)
    kv_ref, kv_got = _copy(kv), _copy(kv)
    mass_ref, mass_got = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)
    want = NumpyModel(tiny_weights).forward(_decode_batch(nexts), kv_ref, attention_mass=mass_ref)  # (2, vocab)
    got = WasmAttentionModel(tiny_weights, PointerTwin()).forward(_decode_batch(nexts), kv_got,
                                                                   attention_mass=mass_got)
    assert got.shape == want.shape == (2, tiny_weights.config.vocab)
    assert float(np.abs(got - want).max()) <= 2e-6 * float(np.abs(want).max())
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))
    assert float(np.abs(mass_got - mass_ref).max()) <= 1e-6
    assert np.array_equal(mass_got[:, 3], [0.0, 0.0])  # no sequence reaches its fourth block
    # layer 0's new K/V come before any attention: identical; later layers' within the rounding above
    assert np.array_equal(kv_got.k[0], kv_ref.k[0]) and np.array_equal(kv_got.v[0], kv_ref.v[0])
    assert max(float(np.abs(a - b).max()) for a, b in zip(kv_got.k + kv_got.v, kv_ref.k + kv_ref.v)) <= 1e-5


def test_prefill_and_decode_give_the_references_logits_and_ids(tiny_weights):  # noqa: F811
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, tiny_weights.config.vocab, 40)]
    want_pre, want_dec = prefill_then_decode(CpuBackend(tiny_weights, 4, 16), prompt, 6)
    got_pre, got_dec = prefill_then_decode(CpuBackend(tiny_weights, 4, 16, attention=PointerTwin()), prompt, 6)
    assert float(np.abs(got_pre - want_pre).max()) <= 2e-6 * float(np.abs(want_pre).max())
    assert np.array_equal(got_pre.argmax(axis=1), want_pre.argmax(axis=1))
    assert [int(g.argmax()) for g in got_dec] == [int(w.argmax()) for w in want_dec]
    assert max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got_dec, want_dec)) <= 2e-6


class CountingTwin(PointerTwin):
    """PointerTwin counting its calls by export name (attn_decode: the fused one-token attention, whose own
    q . k counts as an attn_scores call too; attn_scores: the separate one; the one-token step's glue)."""

    def __init__(self) -> None:
        self.calls = Counter()

    def __getattribute__(self, name: str):
        attr = super().__getattribute__(name)
        if name.startswith("_") or name == "calls" or not callable(attr):
            return attr
        calls = super().__getattribute__("calls")

        def counted(*args):
            calls[name] += 1
            return attr(*args)

        return counted


def test_one_sequences_decode_step_runs_attention_in_one_fused_call_per_layer(tiny_weights):  # noqa: F811
    """A lone sequence's one-token step on f32 pools takes attn_decode (rope, KV write, softmax inside; the twin
    runs attn_scores and attn_values once within it), a layer at a time, its f32 projections through numpy
    between the glue's calls; its new K/V are the reference's bit for bit; two sequences' step (and prefill) keep
    the separate kernels."""
    cfg = tiny_weights.config
    kv, nexts = _prefilled(tiny_weights)
    table, n = TABLES[0], PROMPTS[0]
    batch = ForwardBatch(i32([nexts[0]]), i32([n]), i32([table[n // 16] * 16 + n % 16]), i32([0, 1]), i32([table]),
                         i32([n + 1]))
    kv_ref, kv_got = _copy(kv), _copy(kv)
    want = NumpyModel(tiny_weights).forward(batch, kv_ref)
    twin = CountingTwin()
    got = WasmAttentionModel(tiny_weights, twin).forward(batch, kv_got)
    assert twin.calls == {"attn_decode": cfg.n_layers, "attn_scores": cfg.n_layers, "attn_values": cfg.n_layers,
                          "rms_norm": 1, "add_rms_norm": 2 * cfg.n_layers, "silu_mul": cfg.n_layers}
    assert float(np.abs(got - want).max()) <= 2e-6 * float(np.abs(want).max())
    assert np.array_equal(kv_got.k[0], kv_ref.k[0]) and np.array_equal(kv_got.v[0], kv_ref.v[0])
    two = CountingTwin()
    WasmAttentionModel(tiny_weights, two).forward(_decode_batch(nexts), _copy(kv))
    assert two.calls == {"attn_scores": 2 * cfg.n_layers, "attn_values": 2 * cfg.n_layers}  # no attn_decode


def test_a_chunk_of_a_prompt_after_cached_tokens_sees_only_the_keys_up_to_its_own(tiny_weights):  # noqa: F811
    """Two sequences' next 9 and 4 tokens after their cached prompts (a chunked prefill's second chunk): every
    new token's logits and the last layer's attention mass against the reference's causal attention."""
    kv, _ = _prefilled(tiny_weights)
    rng = np.random.default_rng(8)
    new = (9, 4)
    pos = [np.arange(p, p + n) for p, n in zip(PROMPTS, new)]
    slots = np.concatenate([np.asarray(t)[p // 16] * 16 + p % 16 for t, p in zip(TABLES, pos)])
    batch = ForwardBatch(i32(rng.integers(3, tiny_weights.config.vocab, sum(new))), i32(np.concatenate(pos)),
                         i32(slots), i32([0, new[0], sum(new)]), i32(TABLES), i32([p + n for p, n in zip(PROMPTS, new)]))
    mass_ref, mass_got = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)
    want = NumpyModel(tiny_weights).forward(batch, _copy(kv), all_logits=True, attention_mass=mass_ref)
    got = WasmAttentionModel(tiny_weights, PointerTwin()).forward(batch, _copy(kv), all_logits=True,
                                                                   attention_mass=mass_got)
    assert got.shape == want.shape == (sum(new), tiny_weights.config.vocab)
    assert float(np.abs(got - want).max()) <= 2e-6 * float(np.abs(want).max())
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))
    assert float(np.abs(mass_got - mass_ref).max()) <= 1e-5 and float(mass_got.sum()) > 0


def test_a_table_that_does_not_cover_the_context_is_refused(tiny_weights):  # noqa: F811
    model = WasmAttentionModel(tiny_weights, PointerTwin())
    kv = PagedKVCache.allocate(tiny_weights.config, 4, 16)
    q = np.zeros((1, 4, 16), np.float32)
    with pytest.raises(ValueError, match=r"block table \[0, 4\] does not cover 20 tokens in 4 blocks of 16"):
        model._sequence_attention(0, q, kv.k[0], kv.v[0], i32([0, 4, 1]), 20, None)
    with pytest.raises(ValueError, match=r"block table \[1\] does not cover 40 tokens in 4 blocks of 16"):
        model._sequence_attention(0, q, kv.k[0], kv.v[0], i32([1]), 40, None)
    with pytest.raises(ValueError, match=r"blocks are contiguous and a whole number of blocks apart, got float32 "
                                         r"\(4, 16, 2, 8\)"):
        model._sequence_attention(0, q, kv.k[0][..., ::2], kv.v[0], i32([0]), 3, None)


def test_pools_viewing_shared_pages_give_what_contiguous_pools_give(tiny_weights):  # noqa: F811
    """Several models' pools are views of one page buffer (PagedKVCache.in_pages): a block of a layer is
    contiguous and pages are a whole number of blocks apart, so the kernel reads block p of layer l at
    page p through a scaled block table. Same arithmetic as on contiguous pools: bit-identical."""
    cfg = tiny_weights.config
    kv, nexts = _prefilled(tiny_weights)
    block = 16 * cfg.n_kv_heads * cfg.head_dim
    pages = np.full((12, (2 * cfg.n_layers + 3) * block), np.nan, np.float32)  # 3 blocks of padding a page
    shared = PagedKVCache.in_pages(cfg, pages, 16)
    for dst, src in zip(shared.k + shared.v, kv.k + kv.v):
        dst[...] = src
    assert shared.k[1].base is not None and np.shares_memory(shared.k[0], pages)
    model = WasmAttentionModel(tiny_weights, PointerTwin())
    want = model.forward(_decode_batch(nexts), _copy(kv))
    got = model.forward(_decode_batch(nexts), shared)
    assert np.array_equal(got, want)
    assert np.isnan(pages[:, 2 * cfg.n_layers * block:]).all()  # the padding was never written


def _tiny_as_the_tab_holds_it(tiny_dir):  # noqa: F811
    """The tiny model's reference weights, and the same file as the tab holds it: stacked QuantWeights on the
    kernel's numpy twin (HeapStore(pointer_twin))."""
    from pagedkv.backends.cpu_wasm import HeapStore, pointer_twin, stack_projections, tensor_loader
    from pagedkv.model.weights import ModelWeights

    plain = ModelWeights.load(tiny_dir)
    shards = {s["file"]: (tiny_dir / s["file"]).read_bytes() for s in plain.manifest["shards"]}
    quantized = ModelWeights.from_shards(plain.manifest, shards, tensor_loader(HeapStore(pointer_twin)))
    stack_projections(quantized.tensors, quantized.config.n_layers)
    return plain, quantized


def test_a_lone_decode_step_on_quantized_weights_runs_its_layers_through_the_kernels(tiny_dir):  # noqa: F811
    """Stacked QuantWeights (the tab's layout): a one-token step takes, per layer, attn_decode, add_rms_norm twice
    and silu_mul once (rms_norm once before the first layer), no numpy between; over the twins (the reference's
    operations) its logits and new K/V are the layer-by-layer path's bit for bit, and NumpyModel's on the same
    weights within the summation-order bound."""
    plain, quantized = _tiny_as_the_tab_holds_it(tiny_dir)
    cfg = quantized.config
    kv, nexts = _prefilled(plain)
    table, n = TABLES[0], PROMPTS[0]
    batch = ForwardBatch(i32([nexts[0]]), i32([n]), i32([table[n // 16] * 16 + n % 16]), i32([0, 1]), i32([table]),
                         i32([n + 1]))
    twin = CountingTwin()
    fast = WasmAttentionModel(quantized, twin)
    kv_fast, kv_slow, kv_ref = _copy(kv), _copy(kv), _copy(kv)
    got = fast.forward(batch, kv_fast)
    assert twin.calls == {"attn_decode": cfg.n_layers, "attn_scores": cfg.n_layers, "attn_values": cfg.n_layers,
                          "rms_norm": 1,
                          "add_rms_norm": 2 * cfg.n_layers, "silu_mul": cfg.n_layers}
    slow = WasmAttentionModel(quantized, PointerTwin())
    slow._layers = None  # the layer-by-layer path: NumpyModel.forward with the fused attention
    want = slow.forward(batch, kv_slow)
    assert np.array_equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(kv_fast.k + kv_fast.v, kv_slow.k + kv_slow.v))
    ref = NumpyModel(plain).forward(batch, kv_ref)  # the same weights, dequantized by ModelWeights.load
    assert float(np.abs(got - ref).max()) <= 2e-6 * float(np.abs(ref).max())
    # two sequences, or the attention mass: the layer-by-layer path
    again = CountingTwin()
    WasmAttentionModel(quantized, again).forward(_decode_batch(nexts), _copy(kv))
    assert again.calls["add_rms_norm"] == again.calls["attn_decode"] == 0


class WalkingTwin(CountingTwin):
    """The kernels with a tape runner, as the tab's are (web/linear_tape.js): run_tape reads the tape's words
    at its address and walks them there, a product with no threads through the matmul export itself (the
    kernel's signature: t = 1, ldo = rows), each kernel by its name on this twin (counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.walks = []

    def run_tape(self, at: int, words: int, threads) -> None:
        import ctypes

        from pagedkv.backends.cpu_tape import ops_of, walk
        from pagedkv.backends.cpu_wasm import array_at, pointer_twin

        self.walks.append((words, threads))
        walk(ops_of(array_at(at, ctypes.c_double, words).copy()), [], self, lambda code, qs, dm, rows, cols, x, out,
             scratch: pointer_twin(code, qs, dm, rows, cols, x, 1, out, rows, scratch))


def test_a_lone_decode_step_is_one_tape_walk_where_the_kernels_have_a_runner(tiny_dir):  # noqa: F811
    """With a tape runner (the tab's kernels), a one-token step crosses into the kernels once: one run_tape of
    the whole step, its words read at their address (per layer q|k|v, attn_decode, o, add_rms_norm, gate|up,
    silu_mul, down, add_rms_norm: 8 ops; the first norm before them), giving Python's own walk of the same tape
    bit for bit, logits and new K/V alike, step after step (the attention's moving arguments rewritten in place)."""
    from pagedkv.backends.cpu_tape import OPS
    plain, quantized = _tiny_as_the_tab_holds_it(tiny_dir)
    cfg = quantized.config
    kv, nexts = _prefilled(plain)
    table, n = TABLES[0], PROMPTS[0]
    walking, walked = WasmAttentionModel(quantized, WalkingTwin()), WasmAttentionModel(quantized, CountingTwin())
    kv_js, kv_py = _copy(kv), _copy(kv)
    token = nexts[0]
    for pos in range(n, n + 3):  # three steps, the third in the table's next block
        batch = ForwardBatch(i32([token]), i32([pos]), i32([table[pos // 16] * 16 + pos % 16]), i32([0, 1]),
                             i32([table]), i32([pos + 1]))
        got, want = walking.forward(batch, kv_js), walked.forward(batch, kv_py)
        assert np.array_equal(got, want)
        assert all(np.array_equal(a, b) for a, b in zip(kv_js.k + kv_js.v, kv_py.k + kv_py.v))
        token = int(got[0].argmax())
    ops = 1 + 8 * cfg.n_layers
    tape = walking._tape
    assert len(walking.kernels.walks) == 3 and {w for w, _ in walking.kernels.walks} == {tape.words.size}
    assert {t for _, t in walking.kernels.walks} == {None}  # HeapStore: the export on one thread
    codes, i = [], 0
    while i < tape.words.size:
        codes.append(OPS[int(tape.words[i])][0])
        i += 1 + OPS[int(tape.words[i])][1]
    assert len(codes) == ops and Counter(codes) == {"rms_norm": 1, "matmul": 4 * cfg.n_layers,
                                                    "attn_decode": cfg.n_layers, "add_rms_norm": 2 * cfg.n_layers,
                                                    "silu_mul": cfg.n_layers}
    assert walking.kernels.calls.pop("run_tape") == 3
    assert walking.kernels.calls == walked.kernels.calls  # the same kernels, the same number of times
