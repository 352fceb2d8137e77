"""Host side of the model's WGSL kernels: dispatch geometry, uniforms, and numpy-in/numpy-out runners.

Each `*_call` function is pure (no GPU): it validates shapes and returns a
KernelCall (shader, override constants, workgroup grid, uniform bytes) that a
dispatch plan can record once and replay. The `run_*` coroutines upload numpy
arrays, launch one call on a GpuContext and read the result back; tests and
benchmarks use them. Only GpuContext methods touch the GPU (no `js` here).
Buffer binding order of every call = the shader's @binding order.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ...model.layout import QK

MAX_WORKGROUPS_PER_DIM = 65535
QUANTIZED = ("q4_1", "q8_0")
MATVEC_ROWS = 8  # output rows per thread in matvec_*.wgsl (one token per thread)
MATMUL_TILE = (8, 4)  # (rows, tokens) per thread in matmul_*.wgsl


@dataclass(frozen=True)
class KernelCall:
    """One dispatch of shaders/<shader>.wgsl: pipeline constants, workgroup grid and uniform contents."""

    shader: str
    constants: tuple[tuple[str, int], ...]
    workgroups: tuple[int, int, int]
    params: bytes  # the shader's `params` uniform, a multiple of 16 bytes

    def __post_init__(self) -> None:
        if len(self.params) % 16 or not self.params:
            raise ValueError(f"{self.shader}: uniform params must be a non-empty multiple of 16 bytes")
        if any(not 1 <= g <= MAX_WORKGROUPS_PER_DIM for g in self.workgroups):
            raise ValueError(f"{self.shader}: workgroup grid {self.workgroups} outside 1..{MAX_WORKGROUPS_PER_DIM}")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _params(*fields) -> bytes:
    """Pack u32 (int) and f32 (float) fields little-endian, zero-padded to 16 bytes."""
    raw = b"".join(np.array([f], "<f4" if isinstance(f, float) else "<u4").tobytes() for f in fields)
    return raw + b"\0" * (-len(raw) % 16)


def _positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _weight(dtype: str, rows: int, cols: int) -> None:
    if dtype not in QUANTIZED:
        raise ValueError(f"quantized kernels take {list(QUANTIZED)}, got {dtype!r}")
    _positive(rows=rows, cols=cols)
    if cols % QK:
        raise ValueError(f"{dtype} weight cols must be a multiple of {QK}, got {cols}")


# ---------------------------------------------------------------- call builders (pure)


def linear_constants(workgroup_size: int, accumulate: bool = False, norm: bool = False,
                     swiglu: bool = False) -> tuple:
    """Pipeline constants of matvec_* / matmul_*: ACCUMULATE makes them add into y (a fused residual add),
    NORM (matvec only) applies the RMSNorm whose weight follows the codes in qs to x first, SWIGLU writes
    silu(gate) * up of gate/up rows interleaved in runs of 4 (webgpu_fused.py)."""
    flags = (("ACCUMULATE", accumulate), ("NORM", norm), ("SWIGLU", swiglu))
    return (("WORKGROUP_SIZE", workgroup_size),) + tuple((name, 1) for name, on in flags if on)


def _check_swiglu(rows: int, swiglu: bool, accumulate: bool) -> None:
    if swiglu and (rows % 8 or accumulate):
        raise ValueError(f"SWIGLU needs rows a multiple of 8 (4 gate + 4 up rows per thread) and no ACCUMULATE, "
                         f"got {rows} rows")


def matvec_call(dtype: str, rows: int, cols: int, tokens: int, workgroup_size: int = 32,
                accumulate: bool = False, norm_eps: float | None = None, swiglu: bool = False) -> KernelCall:
    """y (tokens, rows) = x (tokens, cols) @ W.T (y += ... when accumulate), decode-sized batches;
    with norm_eps, W @ rms_norm(x, g, norm_eps) where g (cols,) f32 follows the codes in qs;
    with swiglu, y (tokens, rows / 2) = silu(gate) * up; buffers: qs, dm|d, x, y, params."""
    _weight(dtype, rows, cols)
    _positive(tokens=tokens)
    _check_swiglu(rows, swiglu, accumulate)
    if norm_eps is not None and not norm_eps > 0:
        raise ValueError(f"norm_eps must be positive, got {norm_eps}")
    grid = (_ceil(_ceil(rows, MATVEC_ROWS), workgroup_size), tokens, 1)
    constants = linear_constants(workgroup_size, accumulate, norm_eps is not None, swiglu)
    return KernelCall(f"matvec_{dtype}", constants, grid, _params(rows, cols, tokens, float(norm_eps or 0.0)))


def matmul_call(dtype: str, rows: int, cols: int, tokens: int, workgroup_size: int = 32,
                accumulate: bool = False, swiglu: bool = False) -> KernelCall:
    """Y (tokens, rows) = X (tokens, cols) @ W.T (Y += ... when accumulate, Y (tokens, rows / 2) =
    silu(gate) * up with swiglu), prefill-sized; buffers: qs, dm|d, x, y, params."""
    _weight(dtype, rows, cols)
    _positive(tokens=tokens)
    _check_swiglu(rows, swiglu, accumulate)
    tile_rows, tile_tokens = MATMUL_TILE
    grid = (_ceil(_ceil(rows, tile_rows), workgroup_size), _ceil(tokens, tile_tokens), 1)
    return KernelCall(f"matmul_{dtype}", linear_constants(workgroup_size, accumulate, swiglu=swiglu), grid,
                      _params(rows, cols, tokens))


def linear_call(dtype: str, rows: int, cols: int, tokens: int, accumulate: bool = False) -> KernelCall:
    """The faster of matvec / matmul for `tokens` rows of activations (same bindings, same result).

    Measured on SwiftShader (bench/model_kernels.py): matvec's cost grows linearly with tokens,
    matmul's 4-token tile costs about 2.5 single-token matvecs, so matmul wins from 3 tokens on.
    """
    return (matvec_call if tokens <= 2 else matmul_call)(dtype, rows, cols, tokens, accumulate=accumulate)


def rmsnorm_call(hidden: int, tokens: int, eps: float, workgroup_size: int = 64) -> KernelCall:
    """out (tokens, hidden) = rms_norm(x, weight, eps); buffers: x, weight, out, params."""
    _positive(hidden=hidden, tokens=tokens)
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return KernelCall("rmsnorm", (("WORKGROUP_SIZE", workgroup_size),), (tokens, 1, 1),
                      _params(hidden, tokens, float(eps)))


def rope_call(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int, workgroup_size: int = 64) -> KernelCall:
    """Split qkv (tokens, (n_heads + 2 n_kv_heads) * head_dim) into q and k rotated and v copied;
    buffers: qkv, q, k, v, positions, cos_sin, params."""
    _positive(tokens=tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    pairs = (n_heads + 2 * n_kv_heads) * head_dim // 2
    return KernelCall("rope", (("WORKGROUP_SIZE", workgroup_size),), (_ceil(pairs, workgroup_size), tokens, 1),
                      _params(tokens, n_heads, n_kv_heads, head_dim))


def embedding_call(tokens: int, hidden: int, workgroup_size: int = 64) -> KernelCall:
    """out (tokens, hidden) = Q8_0 table rows; buffers: qs, d, token_ids, out, params."""
    _positive(tokens=tokens, hidden=hidden)
    if hidden % QK:
        raise ValueError(f"embedding hidden size must be a multiple of {QK}, got {hidden}")
    return KernelCall("embedding", (("WORKGROUP_SIZE", workgroup_size),),
                      (_ceil(hidden // 4, workgroup_size), tokens, 1), _params(tokens, hidden))


def argmax_call(vocab: int, seqs: int, workgroup_size: int = 256) -> KernelCall:
    """out (seqs,) u32 = argmax of each logits row (lowest index on ties); buffers: logits, out, params."""
    _positive(vocab=vocab, seqs=seqs)
    return KernelCall("argmax", (("WORKGROUP_SIZE", workgroup_size),), (seqs, 1, 1), _params(vocab, seqs))


def stream_read_call(nbytes: int, workgroups: int = 256, workgroup_size: int = 64) -> KernelCall:
    """Read nbytes once and reduce them; buffers: data, out, params. Every thread reads a run of whole
    vec4<u32> words, four per loop trip: nbytes must split into workgroups * workgroup_size runs of 4k words."""
    _positive(nbytes=nbytes, workgroups=workgroups)
    unit = 16 * 4 * workgroups * workgroup_size
    if nbytes % unit:
        raise ValueError(f"stream_read splits the buffer into {workgroups} x {workgroup_size} runs of 4k vec4<u32> "
                         f"words: nbytes must be a multiple of {unit}, got {nbytes}")
    words = nbytes // 16
    return KernelCall("stream_read", (("WORKGROUP_SIZE", workgroup_size),), (workgroups, 1, 1),
                      _params(words, words // workgroups))


ALU_PEAK_FLOPS_PER_ITERATION = 8 * 4 * 2  # 8 vec4 multiply-adds per loop iteration of alu_peak.wgsl, per thread


def alu_peak_call(iterations: int, workgroups: int = 64, workgroup_size: int = 32) -> KernelCall:
    """Every thread runs `iterations` loop trips of register-only multiply-adds; buffers: out, params.
    Flops of one dispatch: workgroups * workgroup_size * iterations * ALU_PEAK_FLOPS_PER_ITERATION."""
    _positive(iterations=iterations, workgroups=workgroups)
    return KernelCall("alu_peak", (("WORKGROUP_SIZE", workgroup_size),), (workgroups, 1, 1), _params(iterations))


def check_q8_0_codes(name: str, parts: dict) -> None:
    """Refuse Q8_0 weights with a code of -128: the matvec / matmul kernels read codes as
    unpack4x8snorm(q) * 127, exact only on [-127, 127] (all that Q8_0 quantization writes)."""
    if np.frombuffer(parts["qs"], dtype=np.int8).min(initial=0) == -128:
        raise ValueError(f"Q8_0 tensor {name} contains the code -128, which Q8_0 quantization never writes "
                         "(scale = amax / 127); re-convert the model from its GGUF file")


# ---------------------------------------------------------------- running calls on a GpuContext


async def launch(ctx, call: KernelCall, buffers: list, check: bool = True):
    """Dispatch `call` with `buffers` (+ its uniform, appended last); returns the uniform buffer to destroy."""
    pipeline = await ctx.kernel(call.shader, dict(call.constants))
    params = ctx.buffer(len(call.params), f"{call.shader}.params", uniform=True)
    ctx.write(params, np.frombuffer(call.params, dtype=np.uint8))
    if check:
        ctx.device.pushErrorScope("validation")
    ctx.dispatch(pipeline, [*buffers, params], call.workgroups)
    if check:
        error = await ctx.device.popErrorScope()
        if error is not None:
            from .webgpu import GPUError

            params.destroy()
            raise GPUError(f"{call.shader} dispatch: {error.message}")
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
    return [parts["qs"], parts["dm" if dtype == "q4_1" else "d"]]


async def run_linear(ctx, x: np.ndarray, dtype: str, shape: tuple[int, int], parts: dict,
                     kernel: str = "matvec", y0: np.ndarray | None = None,
                     norm: tuple[np.ndarray, float] | None = None, swiglu: bool = False) -> np.ndarray:
    """x (T, cols) f32 @ W.T on the GPU with matvec_<dtype> or matmul_<dtype> -> (T, rows) f32;
    with y0 (T, rows) the kernel's ACCUMULATE variant returns y0 + x @ W.T; with norm = (g (cols,), eps)
    matvec's NORM variant returns rms_norm(x, g, eps) @ W.T; with swiglu (W's rows gate/up interleaved in
    runs of 4) the SWIGLU variant returns silu(gate) * up, (T, rows / 2)."""
    rows, cols = shape
    if x.ndim != 2 or x.shape[1] != cols:
        raise ValueError(f"x must be (tokens, {cols}), got {x.shape}")
    if kernel not in ("matvec", "matmul"):
        raise ValueError(f"kernel must be 'matvec' or 'matmul', got {kernel!r}")
    if y0 is not None and y0.shape != (x.shape[0], rows):
        raise ValueError(f"y0 must be ({x.shape[0]}, {rows}), got {y0.shape}")
    if norm is not None and (kernel != "matvec" or norm[0].shape != (cols,)):
        raise ValueError(f"norm=(weight ({cols},), eps) fuses an RMSNorm into matvec only")
    if kernel == "matvec":
        call = matvec_call(dtype, rows, cols, x.shape[0], accumulate=y0 is not None,
                           norm_eps=None if norm is None else norm[1], swiglu=swiglu)
    else:
        call = matmul_call(dtype, rows, cols, x.shape[0], accumulate=y0 is not None, swiglu=swiglu)
    if dtype == "q8_0":
        check_q8_0_codes("weight", parts)
    x = x.astype(np.float32)  # (T, cols)
    y = None if y0 is None else y0.astype(np.float32)  # (T, rows)
    qs, scales = _quant_parts(dtype, parts)
    if norm is not None:  # the norm weight follows the codes, as webgpu_fused.stack_rows stores it
        qs = bytes(qs) + norm[0].astype("<f4").tobytes()
    out_rows = rows // 2 if swiglu else rows
    out = await _run(ctx, call, [qs, scales, x, y], 3, x.shape[0] * out_rows * 4, np.float32)
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
                   n_heads: int, n_kv_heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split qkv (T, (n_heads + 2 n_kv_heads) * hd) on the GPU into q (T, n_heads*hd) and k (T, n_kv_heads*hd)
    rotated with a (max_pos, hd/2, 2) cos/sin table, and v (T, n_kv_heads*hd) copied."""
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
    try:
        buffers.append(await launch(ctx, call, list(buffers)))
        return tuple([np.frombuffer(await ctx.read(buf, t * w * 4), dtype=np.float32).reshape(t, w).copy()
                      for buf, w in zip(buffers[1:4], widths)])
    finally:
        for b in buffers:
            b.destroy()


async def run_embedding(ctx, token_ids: np.ndarray, shape: tuple[int, int], parts: dict) -> np.ndarray:
    """Dequantized rows token_ids (T,) of a Q8_0 (vocab, hidden) table on the GPU -> (T, hidden) f32."""
    vocab, hidden = shape
    if token_ids.dtype != np.int32 or token_ids.ndim != 1 or token_ids.min() < 0 or token_ids.max() >= vocab:
        raise ValueError(f"token_ids must be a 1-D int32 array of ids in [0, {vocab})")
    call = embedding_call(token_ids.shape[0], hidden)
    out = await _run(ctx, call, [parts["qs"], parts["d"], token_ids, None], 3, token_ids.size * hidden * 4, np.float32)
    return out.reshape(token_ids.shape[0], hidden)


async def run_argmax(ctx, logits: np.ndarray) -> np.ndarray:
    """(S, vocab) f32 logits -> (S,) uint32 greedy ids on the GPU."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be (sequences, vocab), got {logits.shape}")
    call = argmax_call(logits.shape[1], logits.shape[0])
    return await _run(ctx, call, [logits.astype(np.float32), None], 1, logits.shape[0] * 4, np.uint32)


# ---------------------------------------------------------------- timing (benchmarks only)


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

