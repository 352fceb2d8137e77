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
from pagedkv.backends.webgpu.kv_attention_gpu import ATTENTION_WORKGROUP
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout
from pagedkv.backends.webgpu.plan import FFN_ROW_GROUPS, FFN_WORKGROUP, FOLD_ROW_GROUPS, ffn_split
from pagedkv.backends.webgpu.runtime import open_device
from pagedkv.backends.webgpu.shader_variants import FFN_DOWN_BINDINGS, FOLD_BINDINGS, ffn_gpu_shader, fold_shader
from pagedkv.kernels.ref_attention import paged_attention_ref
from pagedkv.kv.spec import KVSpec
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


async def _dispatch(ctx, shader, constants, bindings, grid, reads, entry="main"):
    """One dispatch of `shader` (its entry point `entry`) with {binding: numpy array} (uniforms as ("uniform",
    array)); returns the bytes of each binding in `reads`."""
    pipeline = await ctx.kernel(shader, constants, entry)
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


async def case_fold(kv_dtype, lengths, positions, seed, n_heads=9, n_kv=3, head_dim=64, head_tile=3, block_size=16,
                    partition_blocks=2, split_parts=0, tree=False):
    """The decode attention that computes its own q | k | v (paged_attention_gpu_fold.wgsl, main_fold) for one new
    token per sequence: sequence i's context of lengths[i] tokens (the new one last, at rotary position
    positions[i]) in scattered blocks of a random f32 / f16 cache whose new slots hold NaN (a read of them would
    show). Against numpy: q, k, v = rms_norm(x + the FFN partials) @ W.T (W the dequantized Q4_1 rows), rotated;
    k, v rounded as the cache stores them; attention over the cache with the new row in its slot. Returns the
    errors of the merged output (the partitions' states merged as the output projection merges them, float64),
    the partition counts, the new rows' errors in the cache (f16: ulps) and whether every other word was kept."""
    ctx = await _context()
    rng = np.random.default_rng(seed)
    hidden, q_dim, kv_dim = n_heads * head_dim, n_heads * head_dim, n_kv * head_dim
    rows, t = q_dim + 2 * kv_dim, len(lengths)
    parts, w = _linear(rng, rows, hidden)  # w: (rows, hidden)
    x_stored = rng.standard_normal((t, hidden), dtype=np.float32) * 3  # (S, hidden)
    ffn_parts = rng.standard_normal((split_parts, t, hidden), dtype=np.float32)  # (parts, S, hidden)
    x = x_stored.copy()
    for p in range(split_parts):
        x += ffn_parts[p]
    gain = rng.standard_normal(hidden, dtype=np.float32)
    pos = np.asarray(positions, np.int32)  # (S,)
    h = ref.rms_norm(x, gain, 1e-5)
    q, k, v = np.split(h @ w.T, [q_dim, q_dim + kv_dim], axis=1)
    q, k = ref.rope(q, k, pos, head_dim, BASE)
    store = np.float16 if kv_dtype == "f16" else np.float32
    k, v = k.astype(store), v.astype(store)  # (S, kv_dim): what the cache keeps
    width = max(-(-n // block_size) for n in lengths)
    num_blocks = t * width + 3  # 3 blocks no sequence uses
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, block_size, kv_dtype), num_blocks)
    cache = [rng.standard_normal((num_blocks, block_size, n_kv, head_dim)).astype(store) for _ in range(2)]
    tables = rng.permutation(num_blocks)[: t * width].reshape(t, width).astype(np.uint32)  # scattered, disjoint
    slots = [(tables[i, (n - 1) // block_size], (n - 1) % block_size) for i, n in enumerate(lengths)]
    for blk, off in slots:  # the new rows' slots: NaN, which would poison any score or value that read them
        cache[0][blk, off] = cache[1][blk, off] = np.nan
    device = [layout.device_order(c).view(np.uint32).reshape(-1) for c in cache]  # (cache words,)
    want_k, want_v = (c.astype(np.float32) for c in cache)
    for i, (blk, off) in enumerate(slots):
        want_k[blk, off], want_v[blk, off] = k[i].reshape(n_kv, head_dim), v[i].reshape(n_kv, head_dim)
    scale = 1.0 / np.sqrt(head_dim)
    want = paged_attention_ref(q.reshape(t, n_heads, head_dim), want_k, want_v, tables, np.asarray(lengths), scale)
    n_parts = [-(-(-(-n // block_size)) // partition_blocks) for n in lengths]
    max_parts = max(n_parts)

    subgroups = "subgroups" in ctx.info.features and not tree
    call = ops.matvec_gpu_call("q4_1", rows, hidden, t, subgroups, norm_eps=1e-5)  # the lin_qkv slot's uniform
    attn = ops.uniform_words(t, n_heads, n_kv, block_size, width, partition_blocks, max_parts, float(scale), 0)
    constants = dict(layout.constants, SLOTS=head_tile, WORKGROUP_SIZE=ATTENTION_WORKGROUP, FOLD=1,
                     NEW_KV_VEC4=head_dim // 2, X_VEC4=hidden // 4, qkv_WORKGROUP_SIZE=ATTENTION_WORKGROUP,
                     qkv_ROW_GROUPS=FOLD_ROW_GROUPS, qkv_NORM=1, **({"SPLIT_PARTS": split_parts} if split_parts else {}))
    qs = np.frombuffer(bytes(parts["qs"]) + gain.tobytes(), np.uint8)  # the norm weight follows the codes
    acc = np.full((t, max_parts, n_heads, head_dim), np.nan, np.float32)  # every state the kernel owns: written
    bindings = {1: device[0], 2: device[1], 3: tables, 4: np.concatenate([lengths, positions]).astype(np.uint32),
                5: ("uniform", attn), 7: acc, 8: np.full((t, max_parts, n_heads, 2), np.nan, np.float32),
                9: ref.rope_cos_sin(head_dim, BASE, int(pos.max()) + 1), FOLD_BINDINGS: qs,
                FOLD_BINDINGS + 1: np.frombuffer(parts["dm"], np.uint8),
                FOLD_BINDINGS + 2: np.concatenate([x_stored[None], ffn_parts]),
                FOLD_BINDINGS + 4: ("uniform", np.frombuffer(call.params, np.uint8))}
    shader = fold_shader("q4_1", subgroups)
    out = await _dispatch(ctx, shader, constants, bindings, (t * max_parts * (n_heads // head_tile), 1, 1),
                          (1, 2, 7, 8), entry="main_fold")
    acc = np.frombuffer(out[7], np.float32).reshape(acc.shape).astype(np.float64)
    stats = np.frombuffer(out[8], np.float32).reshape(t, max_parts, n_heads, 2).astype(np.float64)
    got = np.empty_like(want)
    for i, n in enumerate(n_parts):  # as partition_merge.wgsl merges them (one partition too: acc / l)
        wts = np.exp(stats[i, :n, :, 0] - stats[i, :n, :, 0].max(axis=0))  # (n, n_heads)
        got[i] = (wts[..., None] * acc[i, :n]).sum(0) / (wts * stats[i, :n, :, 1]).sum(0)[:, None]
    err = np.abs(got - want)
    result = {"shader": shader, "parts": n_parts, "max_rel": float(err.max() / np.abs(want).max())}
    for name, at, before, new in (("k", 1, device[0], k), ("v", 2, device[1], v)):
        words = np.frombuffer(out[at], np.uint32)
        host = layout.host_order(words.view(store).reshape(num_blocks, block_size, n_kv, head_dim))
        got_rows = np.stack([host[blk, off].reshape(-1) for blk, off in slots]).astype(np.float64)  # (S, kv_dim)
        if kv_dtype == "f16":  # the f32 row rounded to f16: at most one f16 ulp from numpy's rounded row
            ulps = np.abs(got_rows - new) / np.spacing(np.abs(new)).astype(np.float64)
            result[name] = {"max_ulps": float(ulps.max())}
        else:
            result[name] = {"max_rel": float(np.abs(got_rows - new).max() / np.abs(new).max())}
        kept = host.copy()
        for blk, off in slots:
            kept[blk, off] = cache[0 if name == "k" else 1][blk, off]
        old = layout.host_order(before.view(store).reshape(num_blocks, block_size, n_kv, head_dim))
        result[name]["others_kept"] = bool(np.array_equal(kept, old, equal_nan=True))
    return result
