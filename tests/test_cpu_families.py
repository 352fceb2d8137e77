"""The tab's CPU path on the families beyond llama (tests/gguf_models.py TINY_FAMILIES: qwen3's q / k norms and
heads wider than hidden, smollm3's layer without rotary, gemma3's windows, post norms, GeGLU and embedding scale),
in CPython: weights held quantized as in the tab (tensor_loader on pointer_twin, the wasm kernels' numpy twin),
projections through the kernel layout, attention through the kernels' twin (PointerTwin). The layers the
one-token kernel cannot compute (a window, a q / k norm, another rotary) take the reference's steps with the
kernels' q . k and p @ v. Against the numpy reference: logits within the twin's summation order, the same ids."""
import numpy as np
import pytest
from gguf_models import TINY_FAMILIES, tiny_gguf
from model_fixtures import gguf_path  # noqa: F401  (pytest fixture)
from test_cpu_linear import prefill_then_decode
from test_gguf_architectures import MODELS

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.cpu_attention import PointerTwin
from pagedkv.backends.cpu_wasm import HeapStore, pointer_twin, tensor_loader
from pagedkv.model.convert import convert_cached
from pagedkv.model.weights import ModelWeights


@pytest.mark.parametrize("name", sorted(TINY_FAMILIES))
def test_the_tabs_cpu_path_gives_the_references_logits_and_ids(gguf_path, name):  # noqa: F811
    converted = convert_cached(tiny_gguf(name, gguf_path), MODELS)
    reference = ModelWeights.load(converted)
    shards = {s["file"]: (converted / s["file"]).read_bytes() for s in reference.manifest["shards"]}
    quantized = ModelWeights.from_shards(reference.manifest, shards, tensor_loader(HeapStore(pointer_twin)))
    prompt = [int(t) for t in np.random.default_rng(5).integers(100, reference.config.vocab, 80)]
    want_pre, want_dec = prefill_then_decode(CpuBackend(reference, 6, 16), prompt, 6)
    tab = CpuBackend(quantized, 6, 16, linear="wasm", attention=PointerTwin())
    got_pre, got_dec = prefill_then_decode(tab, prompt, 6)
    assert float(np.abs(got_pre - want_pre).max() / np.abs(want_pre).max()) <= 1e-5
    assert np.array_equal(got_pre.argmax(axis=1), want_pre.argmax(axis=1))
    assert [int(g.argmax()) for g in got_dec] == [int(w.argmax()) for w in want_dec]
    for g, w in zip(got_dec, want_dec):
        assert float(np.abs(g - w).max() / np.abs(w).max()) <= 1e-5
