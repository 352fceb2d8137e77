"""The tab's CPU path on the families beyond llama (tests/gguf_models.py TINY_FAMILIES: qwen3's q / k norms and
heads wider than hidden, smollm3's layer without rotary, gemma3's windows, post norms, GeGLU and embedding scale),
in CPython: weights held quantized as in the tab (tensor_loader on pointer_twin, the wasm kernels' numpy twin),
projections through the kernel layout, attention through the kernels' twin (PointerTwin). The layers the
one-token kernel cannot compute (a window, a q / k norm, another rotary) take the reference's steps with the
kernels' q . k and p @ v. Against the numpy reference: logits within the twin's summation order, the same ids."""
from collections import Counter

import numpy as np
import pytest
from gguf_models import TINY_FAMILIES, tiny_gguf
from model_fixtures import gguf_path  # noqa: F401  (pytest fixture)
from test_cpu_attention import CountingTwin
from test_cpu_linear import prefill_then_decode
from test_gguf_architectures import MODELS

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.cpu_attention import ACTIVATION_EXPORTS, PointerTwin
from pagedkv.backends.cpu_wasm import HeapStore, pointer_twin, stack_projections, tensor_loader
from pagedkv.model.convert import convert_cached
from pagedkv.model.weights import ModelWeights


@pytest.mark.parametrize("name", sorted(TINY_FAMILIES))
def test_the_tabs_cpu_path_gives_the_references_logits_and_ids(gguf_path, name):  # noqa: F811
    converted = convert_cached(tiny_gguf(name, gguf_path), MODELS)
    reference = ModelWeights.load(converted)
    shards = {s["file"]: (converted / s["file"]).read_bytes() for s in reference.manifest["shards"]}
    quantized = ModelWeights.from_shards(reference.manifest, shards, tensor_loader(HeapStore(pointer_twin)))
    stack_projections(quantized.tensors, quantized.config.n_layers)  # as the tab holds them
    prompt = [int(t) for t in np.random.default_rng(5).integers(100, reference.config.vocab, 80)]
    # One block table for every layer (kv_groups=False): the batches here are made by hand, and the KV groups'
    # own tables are tests/test_kv_groups.py's
    want_pre, want_dec = prefill_then_decode(CpuBackend(reference, 6, 16, kv_groups=False), prompt, 6)
    twin = CountingTwin()
    tab = CpuBackend(quantized, 6, 16, linear="wasm", attention=twin, kv_groups=False)
    got_pre, got_dec = prefill_then_decode(tab, prompt, 6)
    # every decode step's every layer through the one-token step, as the family's declaration says
    layers, steps = reference.config.layers, 6
    activations = Counter(ACTIVATION_EXPORTS[spec.activation] for spec in layers)
    want_calls = {"attn_decode": len(layers), "add_rms_norm": 2 * len(layers), **activations,
                  "rms_norm_rows": 2 * sum(spec.qk_norm for spec in layers),
                  "rms_norm": 1 + sum(spec.post_attention_norm + spec.post_ffn_norm for spec in layers)}
    want = {name: n * steps for name, n in want_calls.items()}
    for name, n in activations.items():  # and the prompt's tokens' activations (the twin's *_rows: one call a row)
        want[name] += len(prompt) * n
    assert {name: twin.calls[name] for name in want_calls} == want
    assert float(np.abs(got_pre - want_pre).max() / np.abs(want_pre).max()) <= 1e-5
    assert np.array_equal(got_pre.argmax(axis=1), want_pre.argmax(axis=1))
    assert [int(g.argmax()) for g in got_dec] == [int(w.argmax()) for w in want_dec]
    for g, w in zip(got_dec, want_dec):
        assert float(np.abs(g - w).max() / np.abs(w).max()) <= 1e-5


def test_the_tabs_cpu_path_in_an_engine_with_window_groups_gives_the_references_ids(gguf_path):  # noqa: F811
    """The tab's backend as the page builds it (quantized weights, the kernels' twins, KV groups on: tiny-gemma3's
    one full layer and six window layers are 7 groups of one) in an engine: chunked prefill of two sequences past
    the 32-token window, then decode, give the numpy reference's greedy ids with every layer holding everything."""
    from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
    from pagedkv.engine import EngineConfig, LLMEngine, run_sync
    from pagedkv.sampling import SamplingParams
    from pagedkv.tokenizer import Tokenizer

    converted = convert_cached(tiny_gguf("tiny-gemma3", gguf_path), MODELS)
    reference = ModelWeights.load(converted)
    shards = {s["file"]: (converted / s["file"]).read_bytes() for s in reference.manifest["shards"]}
    quantized = ModelWeights.from_shards(reference.manifest, shards, tensor_loader(HeapStore(pointer_twin)))
    tab = CpuBackend(quantized, 64, 16, linear="wasm", attention=PointerTwin())
    assert tab.kv_groups.num_groups == 7 and len(tab.kv.k) == 1
    engine = LLMEngine(tab, Tokenizer.from_manifest(reference.manifest), EngineConfig(max_num_batched_tokens=24))
    prompts = [[int(t) for t in np.random.default_rng(s).integers(100, reference.config.vocab, n)]
               for s, n in ((7, 45), (8, 70))]
    params = SamplingParams(max_tokens=8, stop_token_ids=(49_999,))  # no stop inside the vocabulary
    requests = [engine.request(engine.add_request(p, params)) for p in prompts]
    while engine.has_unfinished:
        run_sync(engine.step())
    model = NumpyModel(reference)
    assert [r.output_ids for r in requests] == [greedy_reference(model, p, 8) for p in prompts]


def test_a_lone_sequence_with_window_groups_decodes_through_the_fused_kernel(gguf_path):  # noqa: F811
    """tiny-gemma3 on the tab's backend with KV groups (7 groups of one layer, window 32), one sequence: every
    decode step runs each layer's attention in one attn_decode call (its group's table from the window's first
    block, the keys before the window in that block masked; q / k normed before the call; the global layer's
    own rotary), the ids the numpy reference's greedy ids past the window (a 45-token prompt, 24 new)."""
    from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
    from pagedkv.engine import EngineConfig, LLMEngine, run_sync
    from pagedkv.sampling import SamplingParams
    from pagedkv.tokenizer import Tokenizer

    converted = convert_cached(tiny_gguf("tiny-gemma3", gguf_path), MODELS)
    reference = ModelWeights.load(converted)
    shards = {s["file"]: (converted / s["file"]).read_bytes() for s in reference.manifest["shards"]}
    quantized = ModelWeights.from_shards(reference.manifest, shards, tensor_loader(HeapStore(pointer_twin)))
    twin = CountingTwin()
    tab = CpuBackend(quantized, 64, 16, linear="wasm", attention=twin)
    assert tab.kv_groups.num_groups == 7
    engine = LLMEngine(tab, Tokenizer.from_manifest(reference.manifest), EngineConfig(max_num_batched_tokens=24))
    prompt = [int(t) for t in np.random.default_rng(9).integers(100, reference.config.vocab, 45)]
    request = engine.request(engine.add_request(prompt, SamplingParams(max_tokens=24, stop_token_ids=(49_999,))))
    while engine.has_unfinished:
        run_sync(engine.step())
    assert twin.calls["attn_decode"] == 7 * 23  # every layer of every decode step (the first id is prefill's)
    assert request.output_ids == greedy_reference(NumpyModel(reference), prompt, 24)
