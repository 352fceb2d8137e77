"""CpuBackend(linear="einsum"): the same model as numpy's matmul, within float32 rounding, same greedy ids."""
import numpy as np
import pytest
from model_fixtures import tiny_dir, tiny_weights  # noqa: F401  (fixtures)

from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.cpu_linear import EinsumWeight, einsum_weights
from pagedkv.model_runner import ForwardBatch


def i32(v):
    return np.asarray(v, dtype=np.int32)


def prefill_then_decode(backend: CpuBackend, prompt: list[int], new: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """All-token logits of the prompt, then the logits of `new` greedy decode steps (one token each)."""
    ctx = len(prompt) + new
    table = i32([range(-(-ctx // 16))])
    first = backend.model.forward(ForwardBatch(i32(prompt), i32(range(len(prompt))), i32(range(len(prompt))),
                                               i32([0, len(prompt)]), table, i32([len(prompt)])),
                                  backend.kv, all_logits=True)  # (T, vocab)
    token, steps = int(first[-1].argmax()), []
    for pos in range(len(prompt), ctx):
        logits = backend.model.forward(ForwardBatch(i32([token]), i32([pos]), i32([pos]), i32([0, 1]), table,
                                                    i32([pos + 1])), backend.kv)  # (1, vocab)
        steps.append(logits[0])
        token = int(logits[0].argmax())
    return first, steps


def test_einsum_prefill_and_decode_match_matmul_within_rounding(tiny_weights):  # noqa: F811
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, tiny_weights.config.vocab, 40)]
    want_pre, want_dec = prefill_then_decode(CpuBackend(tiny_weights, 4, 16), prompt, 6)
    got_pre, got_dec = prefill_then_decode(CpuBackend(tiny_weights, 4, 16, linear="einsum"), prompt, 6)
    rel = float(np.abs(got_pre - want_pre).max() / np.abs(want_pre).max())
    assert 0 < rel <= 2e-6, rel  # a different summation order, nothing more
    assert np.array_equal(got_pre.argmax(axis=1), want_pre.argmax(axis=1))
    for got, want in zip(got_dec, want_dec):
        assert int(got.argmax()) == int(want.argmax())
        assert 0 < float(np.abs(got - want).max() / np.abs(want).max()) <= 2e-6


def test_only_the_projections_are_wrapped_and_share_the_arrays(tiny_weights):  # noqa: F811
    tensors = tiny_weights.tensors
    wrapped = einsum_weights(tensors, tiny_weights.config.n_layers, "token_embd.weight")
    embd = tensors["token_embd.weight"]
    assert wrapped["token_embd.weight"].w is embd and np.array_equal(wrapped["token_embd.weight"][[2, 0]], embd[[2, 0]])
    assert wrapped["blk.0.attn_norm.weight"] is tensors["blk.0.attn_norm.weight"]
    assert wrapped["blk.1.ffn_down.weight"].w is tensors["blk.1.ffn_down.weight"]
    assert sum(isinstance(v, EinsumWeight) for v in wrapped.values()) == 7 * tiny_weights.config.n_layers + 1


def test_bad_arguments_are_refused_by_name(tiny_weights):  # noqa: F811
    with pytest.raises(ValueError, match=r"linear must be matmul, einsum or wasm, got 'blas'"):
        CpuBackend(tiny_weights, 4, 16, linear="blas")
    with pytest.raises(ValueError, match=r"a projection weight is 2-D \(out, in\), got shape \(3,\)"):
        EinsumWeight(np.zeros(3, np.float32))
    w = EinsumWeight(np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"projection input \(2, 5\) does not match weight \(4, 3\) \(out, in\)"):
        np.ones((2, 5), np.float32) @ w.T
    assert np.array_equal(np.ones((2, 3), np.float32) @ w.T, np.full((2, 4), 3, np.float32))
    assert np.array_equal(np.ones((1, 3), np.float32) @ w.T, np.full((1, 4), 3, np.float32))
