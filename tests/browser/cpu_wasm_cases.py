"""Cases of the wasm CPU kernel (py/pagedkv/backends/cpu_wasm.py), run in the page's worker by
tests/browser/test_cpu_wasm_page.py and, for the reference side, in CPython."""
from __future__ import annotations

import numpy as np

from pagedkv.backends.cpu_wasm import QuantWeight
from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache
from pagedkv.model.layout import dequantize, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0
from pagedkv.model_runner import ForwardBatch


def case_linear(kernel, dtype: str, rows: int, cols: int, tokens: tuple[int, ...]) -> dict:
    """A random (rows, cols) weight of dtype through the kernel at each token count, against f64."""
    rng = np.random.default_rng(rows * 7 + cols)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    parts = pack_q4_1(*quantize_q4_1(w)) if dtype == "q4_1" else pack_q8_0(*quantize_q8_0(w))
    ref = dequantize(dtype, (rows, cols), parts)  # (rows, cols)
    qw = QuantWeight.from_parts(dtype, (rows, cols), parts, kernel)
    out = {"case": [dtype, rows, cols], "rows_exact": bool(np.array_equal(qw[np.arange(rows)], ref)),
           "shapes": [], "max_scaled": 0.0}
    for t in tokens:
        x = rng.standard_normal((t, cols)).astype(np.float32)
        y = x @ qw.T  # (t, rows)
        want = x.astype(np.float64) @ ref.T.astype(np.float64)
        scale = np.abs(x).astype(np.float64) @ np.abs(ref.T).astype(np.float64)
        out["shapes"].append([*y.shape, str(y.dtype)])
        out["max_scaled"] = max(out["max_scaled"], float((np.abs(y - want) / scale).max()))
    return out


def greedy(model: NumpyModel, prompt: list[int], new: int) -> dict:
    """Prefill `prompt`, then `new` greedy decode steps on a fresh KV cache: the ids and, at each step, the
    top-1 minus top-2 logit margin."""
    ctx = len(prompt) + new
    kv = PagedKVCache.allocate(model.config, -(-ctx // 16), 16)
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    table = i32([range(-(-ctx // 16))])
    logits = model.forward(ForwardBatch(i32(prompt), i32(range(len(prompt))), i32(range(len(prompt))),
                                        i32([0, len(prompt)]), table, i32([len(prompt)])), kv)  # (1, vocab)
    ids, margins = [], []
    for pos in range(len(prompt), ctx + 1):
        top = np.sort(logits[0])[-2:]
        ids.append(int(logits[0].argmax()))
        margins.append(float(top[1] - top[0]))
        if pos == ctx:
            break
        logits = model.forward(ForwardBatch(i32([ids[-1]]), i32([pos]), i32([pos]), i32([0, 1]), table,
                                            i32([pos + 1])), kv)
    return {"ids": ids, "margins": margins}
