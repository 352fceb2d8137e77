"""Worker-side half of test_model_kernels.py: exec'd inside the page's Pyodide worker (and run under CPython
on wgpu-py by tests/native).

Each case draws random inputs from a seeded generator, runs one kernel on the
GPU through kernel_calls.py (installed beside it) and its numpy reference from
pagedkv.kernels.ref_ops, and returns JSON-able error figures for the test to assert on.
"""
import numpy as np

import kernel_calls as calls
from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.kernels import ref_ops as ref
from pagedkv.model.layout import dequantize, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0
from pagedkv.model.quantize import random_gguf
from pagedkv.model.quants import pack_gguf

_ctx = None
_tables = {}


async def _context():
    global _ctx
    if _ctx is None:
        _ctx = await open_device()
    return _ctx


def _weights(dtype, rows, cols, seed):
    """Parts of quantized random (rows, cols) weights, cached per key (the LM head is large)."""
    key = (dtype, rows, cols, seed)
    if key not in _tables:
        w = _dense(seed, rows, cols)
        if dtype in ops.FLOATS:
            parts = _float_parts(dtype, w)
        elif dtype == "q4_1":
            parts = pack_q4_1(*quantize_q4_1(w))
        elif dtype == "q8_0":
            parts = pack_q8_0(*quantize_q8_0(w))
        else:  # random GGUF blocks: every code value and every bit of the scales' layout gets exercised
            scale = 3e-4 if dtype.endswith("_K") else 0.01  # a K-quant block scale is d * (6-bit scale)
            parts = pack_gguf(dtype, random_gguf(dtype, rows, cols, seed, scale=scale), (rows, cols))
        _tables[key] = parts
    return _tables[key]


def _dense(seed, rows, cols):
    """The (rows, cols) f32 weights that _weights quantizes."""
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32) * 0.1


def _float_parts(dtype, w):
    """Parts of f32 / f16 / bf16 weights w (bf16: w's high halves). Values an f16 or bf16 would hold as a
    subnormal are raised to the smallest normal (GPUs may flush subnormals to zero), as random_gguf does."""
    tiny = 2.0**-14 if dtype == "f16" else 2.0**-126
    w = np.where(np.abs(w) < tiny, np.copysign(tiny, w), w).astype(np.float32)
    raw = {"f32": w, "f16": w.astype("<f2"), "bf16": (w.view("<u4") >> 16).astype("<u2")}[dtype]
    return pack_gguf(dtype, raw, w.shape)


def _linear_ref(x, dtype, shape, parts):
    """x @ W.T with W dequantized (ref.quantized_linear takes the quantized types only)."""
    if dtype in ops.FLOATS:
        return x.astype(np.float32) @ dequantize(dtype, shape, parts).T
    return ref.quantized_linear(x, dtype, shape, parts)


def _errors(got, want, scale=None):
    """max |got - want|, max |got - want| / max |want|, and max over elements of |got - want| / scale."""
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    out = {"shape": list(got.shape), "max_abs": float(err.max()), "max_rel": float(err.max() / np.abs(want).max())}
    if scale is not None:
        out["max_scaled"] = float((err / scale).max())
    return out


async def case_linear(kernel, dtype, rows, cols, tokens, seed, accumulate=False, norm=False, family="cpu",
                      matmul_shape=ops.GPU_MATMUL_SHAPE, outliers=()):
    """accumulate: the ACCUMULATE variant adds into a random y0 (the fused residual add);
    norm: the NORM variant multiplies rms_norm(x, g) (the fused RMSNorm); family, matmul_shape:
    kernel_calls.run_linear's; outliers (with norm): activations set in every token's row, evenly spaced, under
    a gain of 1.5 (a residual stream's outliers: raw x * g past f16's 65,504, which an f16 matvec must scale by
    1 / rms before its cast). "raw_max" is the largest |x * g|."""
    ctx = await _context()
    parts = _weights(dtype, rows, cols, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((tokens, cols), dtype=np.float32) * (3 if norm else 1)  # (T, cols)
    y0 = rng.standard_normal((tokens, rows), dtype=np.float32) * 4 if accumulate else None  # (T, rows)
    gain = (rng.standard_normal(cols, dtype=np.float32), 1e-5) if norm else None  # ((cols,), eps)
    at = np.arange(len(outliers)) * (cols // max(len(outliers), 1)) + 5  # columns of the outliers
    x[:, at] = np.asarray(outliers, np.float32)
    if norm:
        gain[0][at] = 1.5
    raw_max = float(np.abs(x * gain[0]).max()) if norm else None
    got = await calls.run_linear(ctx, x, dtype, (rows, cols), parts, kernel, y0=y0, norm=gain, family=family,
                                 matmul_shape=tuple(matmul_shape))
    if norm:
        x = ref.rms_norm(x, gain[0], gain[1])  # (T, cols)
    want = _linear_ref(x, dtype, (rows, cols), parts)
    # f32 rounding of a dot product scales with sum |w_k x_k|, not with the result.
    scale = np.abs(x) @ np.abs(dequantize(dtype, (rows, cols), parts)).T  # (T, rows)
    if accumulate:
        want = y0 + want
        scale = scale + np.abs(y0)
    out = {"kernel": f"{kernel}_{dtype}", "family": family, "tokens": tokens, "accumulate": accumulate, "norm": norm,
           "raw_max": raw_max, "finite": bool(np.isfinite(got).all()), **_errors(got, want, scale)}
    if dtype == "q4_1" and outliers:  # its decoders sum d * (q . x) + m * sum(x): rounding scales with |d q| + |m|
        codes, d, m = quantize_q4_1(_dense(seed, rows, cols))
        terms = np.abs(codes.reshape(rows, -1, 32) * d.astype(np.float32)[:, :, None]) + np.abs(
            m.astype(np.float32))[:, :, None]  # (rows, cols/32, 32)
        term_scale = np.abs(x) @ terms.reshape(rows, cols).T + (np.abs(y0) if accumulate else 0)
        out["max_term_scaled"] = _errors(got, want, term_scale)["max_scaled"]
    return out


async def case_features():
    """The page device's adapter features (the gpu family's "gpu" variant needs `subgroups`)."""
    return sorted((await _context()).info.features)


async def case_timed_stream_reads():
    """device.time_dispatches of a 1 MiB and a 16 MiB stream read (4 repeats, 3 runs): GPU timestamps where
    the device has timestamp-query (the page requests it; the first-boot tuning and bench.kernels use them)."""
    from pagedkv.backends.webgpu.model_kernels import stream_read_call

    ctx = await _context()
    rows = []
    for nbytes in (1 << 20, 16 << 20):
        call = stream_read_call(nbytes)
        pipeline = await ctx.kernel(call.shader, dict(call.constants))
        buffers = [ctx.upload(np.arange(nbytes // 4, dtype=np.uint32), "stream"), ctx.buffer(256 * 64 * 4, "out"),
                   ctx.upload(np.frombuffer(call.params, np.uint8), "params", uniform=True)]
        t = await ctx.time_dispatches([(pipeline, ctx.bind(pipeline, buffers), call.workgroups)], 4, 3)
        for buf in buffers:
            buf.destroy()
        rows.append({"timer": t["timer"], "min_ms": t["min_ms"], "wall_ms": t.get("wall_median_ms")})
    return {"timestamps": "timestamp-query" in ctx.info.features, "rows": rows}


async def case_rmsnorm(hidden, tokens, seed, eps=1e-5):
    ctx = await _context()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32) * 3  # (T, hidden)
    w = rng.standard_normal(hidden, dtype=np.float32)  # (hidden,)
    got = await calls.run_rmsnorm(ctx, x, w, eps)
    want = ref.rms_norm(x, w, eps)
    return {"kernel": "rmsnorm", **_errors(got, want, np.abs(want) + 1e-30)}


async def case_rope(positions, n_heads, n_kv_heads, head_dim, seed, base=100000.0, max_positions=8192, bias=False):
    ctx = await _context()
    rng = np.random.default_rng(seed)
    pos = np.asarray(positions, dtype=np.int32)  # (T,)
    q = rng.standard_normal((pos.size, n_heads * head_dim), dtype=np.float32)
    k = rng.standard_normal((pos.size, n_kv_heads * head_dim), dtype=np.float32)
    table = ref.rope_cos_sin(head_dim, base, max_positions)  # (max_positions, head_dim/2, 2)
    v = rng.standard_normal((pos.size, n_kv_heads * head_dim), dtype=np.float32)
    qkv = np.concatenate([q, k, v], axis=1)  # (T, (n_heads + 2 n_kv_heads) * head_dim), as the stacked matvec
    b = rng.standard_normal(qkv.shape[1], dtype=np.float32) if bias else np.zeros(qkv.shape[1], np.float32)
    got_q, got_k, got_v = await calls.run_rope(ctx, qkv, pos, table, n_heads, n_kv_heads, b if bias else None)
    q, k, v = np.split(qkv + b, [q.shape[1], q.shape[1] + k.shape[1]], axis=1)  # the bias is added before rope
    want_q, want_k = ref.rope(q, k, pos, head_dim, base)
    return {"kernel": "rope", "q": _errors(got_q, want_q), "k": _errors(got_k, want_k),
            "v_equal": bool(np.array_equal(got_v, v))}


async def case_linear_swiglu(kernel, dtype, rows, cols, tokens, seed, norm=False, family="cpu",
                             matmul_shape=ops.GPU_MATMUL_SHAPE):
    """The SWIGLU variant: W's rows are gate / up interleaved in runs of 4 (backends/webgpu/fused.stack_rows);
    the kernel returns silu(gate) * up (T, rows / 2), here against ref.swiglu of the two halves."""
    ctx = await _context()
    parts = _weights(dtype, rows, cols, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((tokens, cols), dtype=np.float32) * 3  # (T, cols)
    gain = (rng.standard_normal(cols, dtype=np.float32), 1e-5) if norm else None  # ((cols,), eps)
    got = await calls.run_linear(ctx, x, dtype, (rows, cols), parts, kernel, norm=gain, swiglu=True,
                                 family=family, matmul_shape=tuple(matmul_shape))  # (T, rows/2)
    if norm:
        x = ref.rms_norm(x, gain[0], gain[1])
    y = _linear_ref(x, dtype, (rows, cols), parts).reshape(tokens, rows // 8, 2, 4)  # runs of 4
    gate, up = y[:, :, 0].reshape(tokens, -1), y[:, :, 1].reshape(tokens, -1)  # (T, rows/2) each
    want = ref.swiglu(gate, up)
    mag = (np.abs(x) @ np.abs(dequantize(dtype, (rows, cols), parts)).T).reshape(tokens, rows // 8, 2, 4)
    gate_mag, up_mag = mag[:, :, 0].reshape(tokens, -1), mag[:, :, 1].reshape(tokens, -1)
    # first-order error of silu(g) * u from the dot products' rounding (|silu'| <= 1.1) plus exp's own rounding
    scale = 1.1 * gate_mag * np.abs(up) + np.abs(gate) * up_mag + np.abs(want)
    return {"kernel": f"{kernel}_{dtype}", "family": family, "swiglu": True, **_errors(got, want, scale)}


async def case_embedding(vocab, hidden, token_ids, seed, dtype="q8_0"):
    ctx = await _context()
    parts = _weights(dtype, vocab, hidden, seed)
    ids = np.asarray(token_ids, dtype=np.int32)
    got = await calls.run_embedding(ctx, ids, (vocab, hidden), parts, dtype)
    if dtype in ops.FLOATS:
        want = dequantize(dtype, (vocab, hidden), parts)[ids]
    else:
        want = ref.embedding(ids, dtype, (vocab, hidden), parts)
    return {"kernel": "embedding", "dtype": dtype, "equal": bool(np.array_equal(got, want)),
            "max_ulp": float((np.abs(got - want) / np.spacing(np.abs(want))).max()), **_errors(got, want)}


async def case_argmax(seqs, vocab, planted, seed, family="cpu"):
    """planted: per sequence, a list of indices that all get the row's maximum value (a tie)."""
    ctx = await _context()
    logits = np.random.default_rng(seed).standard_normal((seqs, vocab), dtype=np.float32)  # (S, vocab)
    for s, indices in enumerate(planted):
        logits[s, indices] = 50.0 + s
    got = await calls.run_argmax(ctx, logits, family)
    return {"kernel": "argmax", "gpu": got.tolist(), "numpy": ref.argmax(logits).tolist()}


async def case_probes(seed):
    """The benchmark probes: stream_read's and stream_read_grid's per-thread wrapping sums add up (mod 2^32) to
    the buffer's, the empty dispatch runs, and
    alu_peak's per-thread result equals the same multiply-add recurrence in numpy f32."""
    ctx = await _context()
    data = np.random.default_rng(seed).integers(0, 2**32, 4 * 4096, dtype=np.uint32)  # (4096 vec4 words * 4,)
    call = ops.stream_read_call(data.nbytes, workgroups=16)
    out = ctx.buffer(16 * 64 * 4, "probe.out")
    await calls.launch(ctx, call, [calls.upload(ctx, data, "probe.data"), out])
    sums = np.frombuffer(await ctx.read(out, 16 * 64 * 4), np.uint32)  # (16 * 64,)
    stream_ok = int(sums.sum(dtype=np.uint64) % 2**32) == int(data.sum(dtype=np.uint64) % 2**32)
    grid = ops.stream_read_grid_call(data.nbytes, workgroups=4, workgroup_size=64)  # the GPU yardstick's pattern
    out = ctx.buffer(4 * 64 * 4, "probe.grid")
    await calls.launch(ctx, grid, [calls.upload(ctx, data, "probe.data"), out])
    sums = np.frombuffer(await ctx.read(out, 4 * 64 * 4), np.uint32)  # (4 * 64,)
    grid_ok = int(sums.sum(dtype=np.uint64) % 2**32) == int(data.sum(dtype=np.uint64) % 2**32)
    await calls.launch(ctx, ops.empty_call(), [ctx.buffer(16, "empty.out")])  # compiles and runs
    iterations, threads = 50, 2 * 32
    out = ctx.buffer(threads * 4, "alu.out")
    await calls.launch(ctx, ops.alu_peak_call(iterations, workgroups=2), [out])
    got = np.frombuffer(await ctx.read(out, threads * 4), np.float32)  # (threads,)
    m, c = np.float32(0.999), np.float32(0.001)
    chains = np.arange(threads, dtype=np.float32)[:, None] + np.arange(4, dtype=np.float32)  # (threads, 4)
    for _ in range(2 * iterations):
        chains = chains * m + c
    want = (chains * 4).sum(axis=1, dtype=np.float32)  # each chain is a vec4 of equal lanes
    return {"stream_read_sum_ok": stream_ok, "stream_read_grid_sum_ok": grid_ok, **_errors(got, want)}
