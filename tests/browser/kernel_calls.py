"""Run one model-kernel call on numpy arrays on a GpuContext: upload, dispatch, read back (or time it).

Test and benchmark code, run inside the page's worker: the harness's install_test_modules (bench/harness/
browser.py; tests call it through conftest's install_modules) makes it importable there as `kernel_calls`.
The engine records the same KernelCalls (pagedkv.backends.webgpu.model_kernels) into its plan instead.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from pagedkv.backends.webgpu.model_kernels import (GPU_MATMUL_SHAPE, KernelCall, argmax_call, check_q8_0_codes,
                                                   embedding_call, matmul_call, matmul_gpu_call, matvec_call,
                                                   matvec_gpu_call, rmsnorm_call, rope_call)
from pagedkv.model.layout import DTYPE_PARTS


async def launch(ctx, call: KernelCall, buffers: list):
    """Dispatch `call` with `buffers` (+ its uniform, appended last); returns the uniform buffer to destroy."""
    pipeline = await ctx.kernel(call.shader, dict(call.constants))
    params = ctx.buffer(len(call.params), f"{call.shader}.params", uniform=True)
    ctx.write(params, np.frombuffer(call.params, dtype=np.uint8))
    ctx.push_errors()
    ctx.dispatch(pipeline, [*buffers, params], call.workgroups)
    try:
        await ctx.pop_errors(f"{call.shader} dispatch")
    except Exception:
        params.destroy()
        raise
    return params


def upload(ctx, data: np.ndarray | bytes, label: str):
    """A storage buffer holding `data` (numpy array or raw bytes)."""
    arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    arr = np.ascontiguousarray(arr)
    buf = ctx.buffer(arr.nbytes, label)
    ctx.write(buf, arr)
    return buf


async def _run(ctx, call: KernelCall, inputs: list, out_index: int, out_nbytes: int, out_dtype) -> np.ndarray:
    """Upload inputs (arrays/bytes, or None for an output-only buffer of out_nbytes), launch, read one buffer."""
    buffers = [ctx.buffer(out_nbytes, "out") if a is None else upload(ctx, a, f"in{i}") for i, a in enumerate(inputs)]
    out = buffers[out_index]
    try:
        buffers.append(await launch(ctx, call, list(buffers)))
        return np.frombuffer(await ctx.read(out, out_nbytes), dtype=out_dtype).copy()
    finally:
        for b in buffers:
            b.destroy()


def _quant_parts(dtype: str, parts: dict) -> list[bytes]:
    return [parts[name] for name in DTYPE_PARTS[dtype]]


async def run_linear(ctx, x: np.ndarray, dtype: str, shape: tuple[int, int], parts: dict,
                     kernel: str = "matvec", y0: np.ndarray | None = None,
                     norm: tuple[np.ndarray, float] | None = None, swiglu: bool = False,
                     family: str = "cpu", matmul_shape: tuple[int, int] = GPU_MATMUL_SHAPE) -> np.ndarray:
    """x (T, cols) f32 @ W.T on the GPU with matvec_<dtype> or matmul_<dtype> -> (T, rows) f32;
    with y0 (T, rows) the kernel's ACCUMULATE variant returns y0 + x @ W.T; with norm = (g (cols,), eps)
    matvec's NORM variant returns rms_norm(x, g, eps) @ W.T; with swiglu (W's rows gate/up interleaved in
    runs of 4) the SWIGLU variant returns silu(gate) * up, (T, rows / 2). family: "cpu", "gpu" (a matvec
    reduces with subgroups when the device has them), "gpu_tree" (the gpu family's workgroup-tree matvec) or
    "gpu_f16" (the gpu family's f16 matvec, subgroups when the device has them; it needs `shader-f16`),
    "gpu_groups" (the gpu family's matvec in 4 row groups of 16 lanes, each summed by a tree of its own),
    "gpu_f16_groups" (the f16 matvec in those 4 row groups),
    "gpu_whole" (the gpu family's matvec whose lanes take whole blocks, WHOLE_BLOCKS, where that adds no trip);
    matmul_shape: the gpu family matmul's workgroup shape (model_kernels.GPU_MATMUL_SHAPE)."""
    rows, cols = shape
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"x must be (tokens, {cols}), got {x.shape}")
    if kernel not in ("matvec", "matmul"):
        raise ValueError(f"kernel must be 'matvec' or 'matmul', got {kernel!r}")
    if y0 is not None and y0.shape != (x.shape[0], rows):
        raise ValueError(f"y0 must be ({x.shape[0]}, {rows}), got {y0.shape}")
    if norm is not None and (kernel != "matvec" or norm[0].shape != (cols,)):
        raise ValueError(f"norm=(weight ({cols},), eps) fuses an RMSNorm into matvec only")
    if family not in ("cpu", "gpu", "gpu_tree", "gpu_f16", "gpu_groups", "gpu_f16_groups", "gpu_whole") or (
            family[4:] and kernel != "matvec"):
        raise ValueError(f"family must be 'cpu', 'gpu', or 'gpu_tree' / 'gpu_f16' / 'gpu_groups' / 'gpu_f16_groups' / "
                         f"'gpu_whole' with matvec, got {family!r} with {kernel}")
    eps = None if norm is None else norm[1]
    if family == "gpu" and kernel == "matmul":
        call = matmul_gpu_call(dtype, rows, cols, x.shape[0], matmul_shape, accumulate=y0 is not None, swiglu=swiglu)
    elif family != "cpu":
        subgroups = family != "gpu_tree" and "subgroups" in ctx.info.features
        call = matvec_gpu_call(dtype, rows, cols, x.shape[0], subgroups, accumulate=y0 is not None, norm_eps=eps,
                               swiglu=swiglu, f16=family.startswith("gpu_f16"),
                               row_groups=4 if family.endswith("_groups") else 1,
                               whole_blocks=family == "gpu_whole")
    elif kernel == "matvec":
        call = matvec_call(dtype, rows, cols, x.shape[0], accumulate=y0 is not None, norm_eps=eps,
                           swiglu=swiglu)
    else:
        call = matmul_call(dtype, rows, cols, x.shape[0], accumulate=y0 is not None, swiglu=swiglu)
    if dtype == "q8_0":
        check_q8_0_codes("weight", parts)
    x = x.astype(np.float32)  # (T, cols)
    y = None if y0 is None else y0.astype(np.float32)  # (T, rows)
    qs, *scales = _quant_parts(dtype, parts)  # a float matrix (f32, f16, bf16) has no scales part
    if norm is not None:  # the norm weight follows the codes, as backends/webgpu/fused.stack_rows stores it
        qs = bytes(qs) + norm[0].astype("<f4").tobytes()
    out_rows = rows // 2 if swiglu else rows
    inputs = [qs, *scales, x, y]
    out = await _run(ctx, call, inputs, len(inputs) - 1, x.shape[0] * out_rows * 4, np.float32)
    return out.reshape(x.shape[0], out_rows)


async def run_rmsnorm(ctx, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm of x (T, hidden) with weight (hidden,) on the GPU -> (T, hidden) f32."""
    if x.ndim != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"x must be (tokens, hidden) and weight (hidden,), got {x.shape} and {weight.shape}")
    call = rmsnorm_call(x.shape[1], x.shape[0], eps)
    x = x.astype(np.float32)
    out = await _run(ctx, call, [x, weight.astype(np.float32), None], 2, x.nbytes, np.float32)
    return out.reshape(x.shape)


async def run_rope(ctx, qkv: np.ndarray, positions: np.ndarray, cos_sin: np.ndarray,
                   n_heads: int, n_kv_heads: int, bias: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split qkv (T, (n_heads + 2 n_kv_heads) * hd) + bias ((n_heads + 2 n_kv_heads) * hd,) (default zeros) on the
    GPU into q (T, n_heads*hd) and k (T, n_kv_heads*hd) rotated with a (max_pos, hd/2, 2) cos/sin table, and
    v (T, n_kv_heads*hd) copied."""
    t = positions.shape[0]
    head_dim = 2 * cos_sin.shape[1]
    if qkv.shape != (t, (n_heads + 2 * n_kv_heads) * head_dim):
        raise ValueError(f"qkv must be ({t}, {(n_heads + 2 * n_kv_heads) * head_dim}), got {qkv.shape}")
    if positions.dtype != np.int32 or positions.min() < 0 or positions.max() >= cos_sin.shape[0]:
        raise ValueError(f"positions must be int32 in [0, {cos_sin.shape[0]}) (the cos/sin table length)")
    call = rope_call(t, n_heads, n_kv_heads, head_dim)
    widths = (n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim)
    buffers = [upload(ctx, qkv.astype(np.float32), "qkv")] + [ctx.buffer(t * w * 4, n) for w, n in zip(widths, "qkv")]
    buffers += [upload(ctx, positions, "positions"), upload(ctx, cos_sin.astype(np.float32), "cos_sin")]
    bias = np.zeros(qkv.shape[1], np.float32) if bias is None else bias  # ((n_heads + 2 n_kv_heads) * hd,)
    buffers.append(upload(ctx, bias.astype(np.float32), "bias"))
    try:
        buffers.append(await launch(ctx, call, list(buffers)))
        return tuple([np.frombuffer(await ctx.read(buf, t * w * 4), dtype=np.float32).reshape(t, w).copy()
                      for buf, w in zip(buffers[1:4], widths)])
    finally:
        for b in buffers:
            b.destroy()


async def run_embedding(ctx, token_ids: np.ndarray, shape: tuple[int, int], parts: dict,
                        dtype: str = "q8_0") -> np.ndarray:
    """Dequantized rows token_ids (T,) of a (vocab, hidden) `dtype` table on the GPU -> (T, hidden) f32."""
    vocab, hidden = shape
    if token_ids.dtype != np.int32 or token_ids.ndim != 1 or token_ids.min() < 0 or token_ids.max() >= vocab:
        raise ValueError(f"token_ids must be a 1-D int32 array of ids in [0, {vocab})")
    call = embedding_call(token_ids.shape[0], hidden, dtype=dtype)
    inputs = [*_quant_parts(dtype, parts), token_ids, None]
    out = await _run(ctx, call, inputs, len(inputs) - 1, token_ids.size * hidden * 4, np.float32)
    return out.reshape(token_ids.shape[0], hidden)


async def run_argmax(ctx, logits: np.ndarray, family: str = "cpu") -> np.ndarray:
    """(S, vocab) f32 logits -> (S,) uint32 greedy ids on the GPU with the `family` kernel."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be (sequences, vocab), got {logits.shape}")
    call = argmax_call(logits.shape[1], logits.shape[0], family=family)
    return await _run(ctx, call, [logits.astype(np.float32), None], 1, logits.shape[0] * 4, np.uint32)


async def time_call(ctx, call: KernelCall, buffers: list, repeats: int = 5, runs: int = 5) -> dict:
    """Wall-clock ms per dispatch of `call`: `runs` samples of `repeats` back-to-back dispatches each.

    Each sample ends by reading 4 bytes of buffers[-1] back, which waits for the queue to drain.
    One warm-up dispatch (pipeline compile, first touch) is not counted. A figure, never a check.
    """
    params = await launch(ctx, call, buffers)
    await ctx.read(buffers[-1], 4)
    pipeline = await ctx.kernel(call.shader, dict(call.constants))
    samples = []
    try:
        for _ in range(runs):
            start = time.perf_counter()
            for _ in range(repeats):
                ctx.dispatch(pipeline, [*buffers, params], call.workgroups)
            await ctx.read(buffers[-1], 4)
            samples.append((time.perf_counter() - start) * 1000.0 / repeats)
    finally:
        params.destroy()
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "samples_ms": samples}
