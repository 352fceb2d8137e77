"""Worker-side half of test_fused_matvec.py: the gpu-family matvec's io variants (matvec_io_rope_kv.wgsl,
matvec_io_merge.wgsl, with and without a fused FFN's pending partials) and the fused FFN (ffn_gpu_main.wgsl)
against numpy, run inside the page's worker (and under CPython on wgpu-py by
tests/native). Each case draws seeded random inputs at SmolLM2-135M shapes (9 heads / 3 KV heads, head_dim 64)
or small odd ones, runs one dispatch with the bindings plan.layer_program gives it, and returns JSON-able
error figures.
"""
import numpy as np

from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.backends.webgpu.fused import stack_rows
from pagedkv.backends.webgpu.plan import FFN_ROW_GROUPS, FFN_WORKGROUP, ffn_split
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.backends.webgpu.shader_variants import FFN_DOWN_BINDINGS, ffn_gpu_shader
from pagedkv.kernels import ref_ops as ref
from pagedkv.model.layout import DTYPE_PARTS, dequantize, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0
from pagedkv.model.quants import dequantize_parts, pack_gguf

BASE = 100000.0
_ctx = None


async def _context():
    global _ctx
    if _ctx is None:
        _ctx = await open_device()
    return _ctx


def _buffer(ctx, array, label):
    array = np.ascontiguousarray(array)
    buf = ctx.buffer(array.nbytes, label)
    ctx.write(buf, array.view(np.uint8).reshape(-1))
    return buf


async def _dispatch(ctx, shader, constants, bindings, grid, reads):
    """One dispatch of `shader` with {binding: numpy array} (uniforms as ("uniform", array)); returns the
    bytes of each binding in `reads`."""
    pipeline = await ctx.kernel(shader, constants)
    buffers = {}
    for at, value in bindings.items():
        if isinstance(value, tuple):
            buffers[at] = ctx.upload(np.ascontiguousarray(value[1]), f"b{at}", uniform=True)
        else:
            buffers[at] = _buffer(ctx, value, f"b{at}")
    try:
        ctx.push_errors()
        ctx.submit([(pipeline, ctx.bind(pipeline, buffers), grid)])
        await ctx.pop_errors(f"{shader} dispatch")
        return {at: await ctx.read(buffers[at], bindings[at].nbytes) for at in reads}
    finally:
        for buf in buffers.values():
            buf.destroy()


def _linear(rng, rows, cols):
    """Q4_1 parts of random (rows, cols) weights and the dequantized matrix."""
    parts = pack_q4_1(*quantize_q4_1(rng.standard_normal((rows, cols), dtype=np.float32) * 0.1))
    return parts, dequantize("q4_1", (rows, cols), parts)


def _errors(got, want, scale):
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return {"max_rel": float(err.max() / np.abs(want).max()), "max_scaled": float((err / scale).max())}


def _pair_scale(scale):
    """A rotated pair mixes both members' errors: each element's bound is the sum of its pair's."""
    pairs = scale.reshape(*scale.shape[:-1], -1, 2).sum(axis=-1, keepdims=True)
    return np.broadcast_to(pairs, (*pairs.shape[:-1], 2)).reshape(scale.shape)


async def case_rope_kv(kv_out, positions, slots, seed, n_heads=9, n_kv=3, head_dim=64, bias=False,
                       block_tokens=16, block_u32=0, num_blocks=8, tree=False, head_major=True, split_parts=0):
    """The q | k | v matvec (NORM) with bias, RoPE and the KV write in its epilogue. kv_out: "f32" / "f16" (into
    a cache of num_blocks blocks, slot s of block s // block_tokens; block_u32: u32s from one block to the next,
    0: packed; head_major: each kv head's rows of a block together, else token after token) or "rows" (f32 rows
    for kv_write_quant). Every cache word outside the tokens' slots must keep its random contents. split_parts:
    the previous layer's fused FFN left that many partials (SPLIT_PARTS), which x's row is read with."""
    ctx = await _context()
    rng = np.random.default_rng(seed)
    hidden, kv_dim = n_heads * head_dim, n_kv * head_dim
    rows, t = hidden + 2 * kv_dim, len(positions)
    parts, w = _linear(rng, rows, hidden)  # w: (rows, hidden)
    x_stored = rng.standard_normal((t, hidden), dtype=np.float32) * 3  # (T, hidden)
    ffn_parts = rng.standard_normal((split_parts, t, hidden), dtype=np.float32)  # (parts, T, hidden)
    x = x_stored.copy()
    for p in range(split_parts):  # in the kernel's order: x + part 0 + part 1 ...
        x += ffn_parts[p]
    x_stored = np.concatenate([x_stored[None], ffn_parts])  # x's buffer: its rows, then the partials
    gain = rng.standard_normal(hidden, dtype=np.float32)  # (hidden,)
    b = rng.standard_normal(rows, dtype=np.float32) * 0.5 if bias else np.zeros(rows, np.float32)  # (rows,)
    pos = np.asarray(positions, np.int32)  # (T,)
    table = ref.rope_cos_sin(head_dim, BASE, int(pos.max()) + 1)  # (positions, head_dim / 2, 2)
    h = ref.rms_norm(x, gain, 1e-5)  # (T, hidden)
    q, k, v = np.split(h @ w.T + b, [hidden, hidden + kv_dim], axis=1)
    want_q, want_k = ref.rope(q, k, pos, head_dim, BASE)
    scale = np.abs(h) @ np.abs(w).T + np.abs(b)  # (T, rows): the dot products' rounding scale
    scale_q, scale_k, scale_v = np.split(scale, [hidden, hidden + kv_dim], axis=1)
    scale_q, scale_k = _pair_scale(scale_q), _pair_scale(scale_k)

    subgroups = "subgroups" in ctx.info.features and not tree
    call = ops.matvec_gpu_call("q4_1", rows, hidden, t, subgroups, norm_eps=1e-5)
    n = kv_dim // 2 if kv_out == "f16" else kv_dim  # u32s of a token's K (V) row in the cache
    token_u32 = -(-n // 4) * 4  # GpuKVLayout rounds a slot up to a vec4
    stride = block_u32 or block_tokens * token_u32
    cache_words = num_blocks * stride if kv_out != "rows" else t * kv_dim
    caches = [rng.integers(0, 2**32, cache_words, dtype=np.uint32) for _ in range(2)]  # K, V
    constants = dict(call.constants, HEAD_DIM=head_dim, Q_ROWS=hidden, KV_ROWS=kv_dim,
                     KV_OUT={"f32": 0, "f16": 1, "rows": 2}[kv_out], BLOCK_TOKENS=block_tokens,
                     HEAD_MAJOR=int(head_major), **({"BLOCK_U32": block_u32} if block_u32 else {}),
                     **({"SPLIT_PARTS": split_parts} if split_parts else {}))
    qs = bytes(parts["qs"]) + gain.tobytes()  # the norm weight follows the codes (fused.stack_rows)
    bindings = {0: np.frombuffer(qs, np.uint8), 1: np.frombuffer(parts["dm"], np.uint8), 2: x_stored,
                3: np.zeros((t, hidden), np.float32), 4: ("uniform", np.frombuffer(call.params, np.uint8)),
                8: pos, 9: table, 10: b, 11: np.asarray(slots, np.uint32), 12: caches[0], 13: caches[1]}
    out = await _dispatch(ctx, ops.gpu_matvec_shader("q4_1", subgroups, False, "_rope_kv"), constants, bindings,
                          call.workgroups, (3, 12, 13))
    got_q = np.frombuffer(out[3], np.float32).reshape(t, hidden)
    result = {"shader": call.shader + "_rope_kv", "q": _errors(got_q, want_q, scale_q)}
    for name, want, sc, at, before in (("k", want_k, scale_k, 12, caches[0]), ("v", v, scale_v, 13, caches[1])):
        words = np.frombuffer(out[at], np.uint32)  # (cache_words,)
        if kv_out == "rows":
            result[name] = _errors(words.view(np.float32).reshape(t, kv_dim), want, sc)
            continue
        row = n // n_kv  # u32s of one head's row
        starts = [[(s // block_tokens) * stride + ((h * block_tokens + s % block_tokens) * row if head_major else
                                                   (s % block_tokens) * token_u32 + h * row) for h in range(n_kv)]
                  for s in slots]  # (T, n_kv) first u32 of each head's row
        got = np.stack([np.concatenate([words[a:a + row] for a in heads]) for heads in starts])  # (T, n) u32
        touched = np.zeros(cache_words, bool)
        for a in np.ravel(starts):
            touched[a:a + row] = True
        if kv_out == "f16":  # the f32 result rounded to f16: at most one f16 ulp from numpy's value rounded
            got, want16 = got.view(np.float16), want.astype(np.float16)  # (T, kv_dim)
            ulps = np.abs(got.astype(np.float64) - want16) / np.spacing(np.abs(want16)).astype(np.float64)
            result[name] = {"max_ulps": float(ulps.max())}
        else:
            result[name] = _errors(got.view(np.float32), want, sc)
        result[name]["others_kept"] = bool((words[~touched] == before[~touched]).all())
    return result


async def case_merge(lengths, seed, block_size=16, partition_blocks=2, n_heads=9, head_dim=64, tree=False,
                     split_parts=0):
    """The output projection (ACCUMULATE) with the flash-decoding merge in its prologue: sequence t's context
    of lengths[t] tokens spans ceil(ceil(len / block_size) / partition_blocks) partitions; a single one's row
    is read from x, the others' merged from random partition states (the states past a sequence's count hold
    values that would break the merge if read). split_parts: a fused FFN's partials (SPLIT_PARTS) added into
    the residual too, in their order."""
    ctx = await _context()
    rng = np.random.default_rng(seed)
    hidden, t = n_heads * head_dim, len(lengths)
    parts, w = _linear(rng, hidden, hidden)  # (hidden, hidden)
    n_parts = [-(-(-(-n // block_size)) // partition_blocks) for n in lengths]
    max_parts = max(n_parts)
    acc = rng.standard_normal((t, max_parts, n_heads, head_dim), dtype=np.float32) * 5  # unnormalised sums
    stats = np.stack([rng.standard_normal((t, max_parts, n_heads)) * 4,
                      rng.uniform(0.5, 20.0, (t, max_parts, n_heads))], axis=-1).astype(np.float32)
    for i, n in enumerate(n_parts):
        stats[i, n:, :, 0] = 1e30  # past the count: a max that would swamp every weight
    x = rng.standard_normal((t, hidden), dtype=np.float32)  # (T, hidden): single-partition rows
    y0 = rng.standard_normal((t, hidden), dtype=np.float32) * 4  # (T, hidden): the residual stream
    ffn_parts = rng.standard_normal((split_parts, t, hidden), dtype=np.float32)  # (parts, T, hidden)
    residual = y0.copy()
    for p in range(split_parts):
        residual += ffn_parts[p]
    merged = x.copy()
    for i, n in enumerate(n_parts):
        if n > 1:
            m = stats[i, :n, :, 0].max(axis=0)  # (n_heads,)
            wts = np.exp(stats[i, :n, :, 0] - m)  # (n, n_heads)
            merged[i] = ((wts[..., None] * acc[i, :n]).sum(0) / (wts * stats[i, :n, :, 1]).sum(0)[:, None]).reshape(-1)
    want = residual + merged @ w.T  # (T, hidden)
    scale = np.abs(merged) @ np.abs(w).T + np.abs(residual)
    subgroups = "subgroups" in ctx.info.features and not tree
    call = ops.matvec_gpu_call("q4_1", hidden, hidden, t, subgroups, accumulate=True)
    merge_words = ops.uniform_words(t, n_heads, block_size, partition_blocks, max_parts)
    y_buffer = np.concatenate([y0[None], ffn_parts])  # x's buffer: its rows, then the partials
    bindings = {0: np.frombuffer(parts["qs"], np.uint8), 1: np.frombuffer(parts["dm"], np.uint8), 2: x, 3: y_buffer,
                4: ("uniform", np.frombuffer(call.params, np.uint8)), 8: np.asarray(lengths, np.uint32),
                9: acc, 10: stats, 11: ("uniform", merge_words)}
    split = {"SPLIT_PARTS": split_parts} if split_parts else {}
    out = await _dispatch(ctx, ops.gpu_matvec_shader("q4_1", subgroups, False, "_merge"),
                          dict(call.constants, HEAD_DIM=head_dim, **split), bindings, call.workgroups, (3,))
    got = np.frombuffer(out[3], np.float32)[: t * hidden].reshape(t, hidden)
    return {"shader": call.shader + "_merge", "parts": n_parts, **_errors(got, want, scale)}


async def case_argmax(rows, t, seed, ties=(), hidden=64, tree=False):
    """A greedy step's LM head: the matvec with the final RMSNorm fused (NORM, its gain bound at 8) writing
    each workgroup's best row (matvec_io_argmax.wgsl), then argmax_gpu over those winners (WINNERS_OF = 8),
    against the logits of the plain NORM matvec (its gain stored after the codes, as a stacked projection's),
    argmax_gpu over them, and numpy's argmax of those logits; "near" is numpy's argmax of the float
    rms_norm(x) @ W.T of the dequantized rows. ties: rows made copies of the best row of token 0 (equal codes
    give equal sums), so the lowest of them must win."""
    ctx = await _context()
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, hidden), dtype=np.float32) * 0.1
    x = rng.standard_normal((t, hidden), dtype=np.float32) * 40  # (T, hidden): the raw residual stream
    gain = rng.uniform(0.5, 1.5, hidden).astype(np.float32)  # (hidden,): output_norm.weight
    h = ref.rms_norm(x, gain, 1e-5)  # (T, hidden)
    if ties:
        best = int(np.argmax(h[0] @ w.T))
        w[list(ties)] = w[best] * 1.5  # larger than the old best: the copies share the max
    parts = pack_q4_1(*quantize_q4_1(w))
    subgroups = "subgroups" in ctx.info.features and not tree
    call = ops.matvec_gpu_call("q4_1", rows, hidden, t, subgroups, norm_eps=1e-5)
    codes = {1: np.frombuffer(parts["dm"], np.uint8), 2: x, 4: ("uniform", np.frombuffer(call.params, np.uint8))}
    qs = np.frombuffer(parts["qs"], np.uint8)
    arg = ops.argmax_call(rows, t, family="gpu")
    out = {"near": np.argmax(h @ dequantize("q4_1", (rows, hidden), parts).T, axis=1).tolist()}
    for io, winners in (("", 0), ("_argmax", 8)):
        own = {0: qs, 8: gain} if io else {0: np.concatenate([qs, gain.view(np.uint8)])}  # the gain's two homes
        y = await _dispatch(ctx, ops.gpu_matvec_shader("q4_1", subgroups, False, io), dict(call.constants),
                            {**codes, **own, 3: np.zeros((t, rows), np.float32)}, call.workgroups, (3,))
        y = np.frombuffer(y[3], np.float32)
        ids = await _dispatch(ctx, arg.shader, dict(arg.constants, WINNERS_OF=winners),
                              {0: y, 1: np.zeros(t, np.uint32), 2: ("uniform", np.frombuffer(arg.params, np.uint8))},
                              arg.workgroups, (1,))
        out[io or "plain"] = np.frombuffer(ids[1], np.uint32).tolist()
        if not io:
            out["numpy"] = np.argmax(y.reshape(t, rows), axis=1).tolist()  # the first of equal maxima
    return out


def _weights(rng, dtype, rows, cols):
    """(parts, dequantized (rows, cols) float matrix) of random weights of `dtype`: q4_1 / q8_0 quantized from
    normals, q4_K / q6_K GGUF blocks of random bytes with small finite f16 scales."""
    if dtype in ("q4_1", "q8_0"):
        w = rng.standard_normal((rows, cols), dtype=np.float32) * 0.1
        parts = pack_q4_1(*quantize_q4_1(w)) if dtype == "q4_1" else pack_q8_0(*quantize_q8_0(w))
        return parts, dequantize(dtype, (rows, cols), parts)
    size, scales = {"q4_K": (144, (0, 2)), "q6_K": (210, (208,))}[dtype]  # block bytes, f16 d (dmin) offsets
    raw = np.frombuffer(rng.bytes(rows * cols // 256 * size), np.uint8).reshape(-1, size).copy()
    for at in scales:
        raw[:, at:at + 2] = np.full(len(raw), 2e-3, np.float16).view(np.uint8).reshape(-1, 2)
    parts = pack_gguf(dtype, raw.reshape(rows, -1), (rows, cols))
    return parts, dequantize_parts(dtype, (rows, cols), parts)


async def case_ffn(gate_up, down, tokens, seed, hidden=256, ffn=512, tree=False, gelu=False):
    """A decode layer's FFN in one dispatch (ffn_gpu_main.wgsl): gate | up (stacked as uploaded, the norm weight
    after the codes) with its RMSNorm and SwiGLU, then down split along K into (parts, T, hidden) partials.
    Against the two dispatches it replaces: the activations of the SWIGLU matvec over the same bytes, times
    down's dequantized rows in float64 (the partials follow x's rows in x's buffer, which is the kernel's y;
    they must leave x's rows as they were); returns the partials' sum's errors on the matvec bounds' scale
    (|act| @ |down|^T) and the reference's argmax rows (a check that the partials add up to the right vector)."""
    ctx = await _context()
    rng = np.random.default_rng(seed)
    gate, _ = _weights(rng, gate_up, ffn, hidden)
    up, _ = _weights(rng, gate_up, ffn, hidden)
    down_parts, down_w = _weights(rng, down, hidden, ffn)  # (hidden, ffn)
    gain = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
    _, _, stacked = stack_rows("blk.0.ffn_gate_up.weight", [(gate_up, (ffn, hidden), gate), (gate_up, (ffn, hidden), up),
                                                            ("f32", (hidden,), {"data": gain.tobytes()})])
    x = rng.standard_normal((tokens, hidden), dtype=np.float32) * 3  # (T, hidden): the residual stream
    subgroups = "subgroups" in ctx.info.features and not tree
    call = ops.matvec_gpu_call(gate_up, 2 * ffn, hidden, tokens, subgroups, norm_eps=1e-5)
    act = {"GELU": 1} if gelu else {}
    names = DTYPE_PARTS[gate_up]
    weights = {i: np.frombuffer(stacked[name], np.uint8) for i, name in enumerate(names)}
    uniform = ("uniform", np.frombuffer(call.params, np.uint8))
    matvec = await _dispatch(ctx, ops.gpu_matvec_shader(gate_up, subgroups, False), dict(call.constants, SWIGLU=1, **act),
                             {**weights, 2: x, 3: np.zeros((tokens, ffn), np.float32), 4: uniform}, call.workgroups, (3,))
    a = np.frombuffer(matvec[3], np.float32).reshape(tokens, ffn).astype(np.float64)  # the SWIGLU matvec's
    slice_vec4, n_parts = ffn_split(ffn)
    constants = dict(ops.linear_constants(FFN_WORKGROUP, norm=True, row_groups=FFN_ROW_GROUPS), SLICE_VEC4=slice_vec4,
                     **act)
    down_bindings = {FFN_DOWN_BINDINGS + i: np.frombuffer(down_parts[name], np.uint8)
                     for i, name in enumerate(DTYPE_PARTS[down])}
    y = np.concatenate([x[None], np.full((n_parts, tokens, hidden), np.nan, np.float32)])  # partials: all written
    out = await _dispatch(ctx, ffn_gpu_shader(gate_up, down, subgroups, False), constants,
                          {**weights, 3: y, 4: uniform, **down_bindings}, (n_parts, tokens, 1), (3,))
    y = np.frombuffer(out[3], np.float32).reshape(1 + n_parts, tokens, hidden)
    got = y[1:].astype(np.float64).sum(axis=0)
    want = a @ down_w.T.astype(np.float64)  # (T, hidden)
    scale = np.abs(a) @ np.abs(down_w).T.astype(np.float64)
    return {"shader": ffn_gpu_shader(gate_up, down, subgroups, False), "parts": n_parts,
            "x_kept": bool((y[0] == x).all()),
            "argmax": [np.argmax(got, axis=1).tolist(), np.argmax(want, axis=1).tolist()], **_errors(got, want, scale)}
