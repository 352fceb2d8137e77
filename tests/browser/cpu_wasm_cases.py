"""Cases of the wasm CPU kernels (py/pagedkv/backends/cpu_wasm.py, cpu_attention.py), run in the page's worker by
tests/browser/test_cpu_wasm_page.py and, for the reference side, in CPython."""
from __future__ import annotations

import numpy as np

from pagedkv.backends.cpu_wasm import (QuantWeight, act_bits, address_of, integer_products, kind_code,
                                      quantize_activations)
from pagedkv.backends.cpu_attention import mirror
from pagedkv.backends.numpy_ref import NumpyModel, PagedKVCache
from pagedkv.kernels.ref_ops import rope_inv_freq, rotate_adjacent
from pagedkv.model.layout import dequantize, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0
from pagedkv.model.quantize import quantize
from pagedkv.model.quants import pack_gguf, to_gguf
from pagedkv.model_runner import ForwardBatch


def packed(dtype: str, w: np.ndarray) -> dict:
    """Web parts of w quantized to dtype: q4_1 / q8_0 by layout.py, q5_0 here, the K-quants by quantize.py's numpy
    port."""
    if dtype == "q4_1":
        return pack_q4_1(*quantize_q4_1(w))
    if dtype == "q8_0":
        return pack_q8_0(*quantize_q8_0(w))
    if dtype == "q5_0":  # llama.cpp's q5_0 in numpy (gguf's quantizers are CPython only): d = the signed max / -16
        blocks = w.reshape(w.shape[0], -1, 32)
        mx = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], 2)[..., 0]
        d = (mx / np.float32(-16)).astype(np.float16)
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1).astype(np.float32), 0).astype(np.float32)
        q = np.clip(np.floor(blocks * inv[..., None] + np.float32(16.5)), 0, 31).astype(np.uint8)
        return pack_gguf("q5_0", to_gguf("q5_0", {"q": q.reshape(w.shape), "d": d}), w.shape)
    return pack_gguf(dtype, quantize(w, dtype), w.shape)


def case_linear(store, dtype: str, rows: int, cols: int, tokens: tuple[int, ...]) -> dict:
    """A random (rows, cols) weight of dtype through the kernel (held by `store`) at each token count, against
    f64."""
    rng = np.random.default_rng(rows * 7 + cols)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    parts = packed(dtype, w)
    ref = dequantize(dtype, (rows, cols), parts)  # (rows, cols)
    qw = QuantWeight.from_parts(dtype, (rows, cols), parts, store)
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


INTEGER_TOKENS = 21


def case_linear_integer(store, dtype: str, rows: int, cols: int, tokens: int = INTEGER_TOKENS) -> dict:
    """`tokens` through the store's integer activations (cpu_wasm.kind_code: 16 or 8 bits; 21 tokens: a 16-token
    chunk and five, in $dot_x16_t4's / $dot_x8_t4's fours and alone) against the twin's integer products of the
    same quantized tokens (cpu_wasm.integer_products), over the unit sum |d_w * d_x * codes . q| of each output;
    and each token's row bit-identical to that token's product alone."""
    rng = np.random.default_rng(rows * 5 + cols)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    parts = packed(dtype, w)
    qw = QuantWeight.from_parts(dtype, (rows, cols), parts, store)
    bits = act_bits(kind_code(qw.kind, store.activations))
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    y = x @ qw.T  # (tokens, rows)
    alone = np.concatenate([x[i:i + 1] @ qw.T for i in range(tokens)])
    qs, dm = qw.store.fetch(qw.qs), qw.store.fetch(qw.dm)
    magnitudes = qs if qw.kind == "q4_1" else np.abs(qs.astype(np.int16))  # q4_1 codes are >= 0 already
    worst = 0.0
    for i in range(tokens):
        xsum, d, q = quantize_activations(x[i], bits)
        want = integer_products(qw.kind, qs, dm, xsum, d, q).astype(np.float64)
        unit = integer_products(qw.kind, magnitudes, np.abs(dm), np.abs(xsum), d, np.abs(q.astype(np.int16)))
        worst = max(worst, float((np.abs(y[i] - want) / unit.astype(np.float64)).max()))
    return {"case": [dtype, rows, cols], "bits": bits, "max_scaled": worst, "as_alone": bool(np.array_equal(y, alone))}


def case_attention(kernels, ctx: int, nkv: int, group: int, hd: int, nq: int = 1) -> dict:
    """attn_scores and attn_values of nq queries per head (the last nq of ctx tokens, each seeing the keys up to
    its own) over a scattered 16-token-block f32 pool, against f64: each output's error over its f64 bound's
    unit, sum |a_i b_i| (so a bound of k means k f32 roundings); the scores of unseen keys must stay untouched."""
    rng = np.random.default_rng(ctx * 31 + hd + nq)
    bs, used = 16, -(-ctx // 16)
    num_blocks = used + 3
    k, v = (rng.standard_normal((num_blocks, bs, nkv, hd)).astype(np.float32) for _ in range(2))
    table = rng.permutation(num_blocks)[:used].astype(np.int32)  # (used,)
    q = rng.standard_normal((nq, nkv * group, hd)).astype(np.float32)  # (nq, n_heads, hd), head = kv * group + g
    probs = rng.random((nq, nkv * group, ctx)).astype(np.float32)  # (nq, n_heads, ctx)
    scores = np.full((nq, nkv * group, ctx), np.nan, np.float32)
    out = np.full((nq, nkv * group, hd), np.nan, np.float32)
    pos = np.arange(ctx)
    slots = table[pos // bs].astype(np.int64) * bs + pos % bs  # (ctx,)
    keys = k.reshape(-1, nkv, hd)[slots].astype(np.float64)  # (ctx, nkv, hd)
    vals = v.reshape(-1, nkv, hd)[slots].astype(np.float64)
    geometry = (address_of(table), ctx, nq, bs, nkv, group, hd)
    kernels.attn_scores(address_of(q), address_of(k), *geometry, address_of(scores))
    kernels.attn_values(address_of(probs), address_of(v), *geometry, address_of(out))
    seen = pos[None, :] <= np.arange(ctx - nq, ctx)[:, None]  # (nq, ctx)
    q64 = q.astype(np.float64).reshape(nq, nkv, group, hd)
    p64 = np.where(seen[:, None, :], probs, 0).astype(np.float64).reshape(nq, nkv, group, ctx)
    want_s = np.einsum("qhgd,chd->qhgc", q64, keys).reshape(nq, -1, ctx)
    unit_s = np.einsum("qhgd,chd->qhgc", np.abs(q64), np.abs(keys)).reshape(nq, -1, ctx)
    want_o = np.einsum("qhgc,chd->qhgd", p64, vals).reshape(nq, -1, hd)
    unit_o = np.einsum("qhgc,chd->qhgd", p64, np.abs(vals)).reshape(nq, -1, hd)
    mask = np.broadcast_to(seen[:, None, :], scores.shape)
    return {"case": [ctx, nkv, group, hd, nq], "finite": bool(np.isfinite(scores[mask]).all() and np.isfinite(out).all()),
            "unseen_untouched": bool(np.isnan(scores[~mask]).all()),
            "scores_rel": float((np.abs(scores - want_s) / unit_s)[mask].max()),
            "values_rel": float((np.abs(out - want_o) / unit_o).max())}


def case_step_glue(kernels, n: int) -> dict:
    """The one-token step's glue exports against f64: rms_norm and add_rms_norm (the residual bit-identical to
    numpy's f32 add) over their output's magnitude, silu_mul over |silu(g) u| plus 2^-100 (e^x is 0 below -87),
    gelu_tanh_mul over that times 1 + |2z| (its e^-|2z|'s argument is rounded to f32), each in units of f32
    rounding (2^-24); rms_norm_rows' rows bit-identical to rms_norm's of each row alone."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.where(np.arange(n) % 7 == 0, 30, 1)).astype(np.float32)
    y, w, u = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    g = (rng.standard_normal(n) * 8).astype(np.float32)
    g[:4] = [0.0, -100.0, 100.0, -1e-8]
    out = np.empty(n, np.float32)
    eps = float(np.float32(1e-5))

    def norm(v):  # f64
        v = v.astype(np.float64)
        return v / np.sqrt((v * v).mean() + eps) * w.astype(np.float64)

    kernels.rms_norm(address_of(x), address_of(w), n, eps, address_of(out))
    rel_norm = float((np.abs(out - norm(x)) / np.abs(norm(x)).max()).max() / 2.0**-24)
    x2 = x.copy()
    kernels.add_rms_norm(address_of(x2), address_of(y), address_of(w), n, eps, address_of(out))
    summed = x + y
    rel_add = float((np.abs(out - norm(summed)) / np.abs(norm(summed)).max()).max() / 2.0**-24)
    kernels.silu_mul(address_of(g), address_of(u), n, address_of(out))
    g64 = g.astype(np.float64)
    want = g64 / (1.0 + np.exp(-g64)) * u.astype(np.float64)
    rel_silu = float((np.abs(out - want) / (np.abs(want) + 2.0**-100)).max() / 2.0**-24)
    kernels.gelu_tanh_mul(address_of(g), address_of(u), n, address_of(out))
    z = np.sqrt(2.0 / np.pi) * (g64 + 0.044715 * g64**3)
    # 0.5 (1 + tanh z) = sigmoid(2z), here without 1 + tanh's cancellation (f64 itself gives 0 for g below -7)
    want = g64 * np.exp(np.minimum(2 * z, 0)) / (1.0 + np.exp(-np.abs(2 * z))) * u.astype(np.float64)
    # e^-|2z| is taken of 2z rounded to f32: its relative error, a few ulp of |2z|, moves e^-|2z| by |2z| times it
    rel_gelu = float((np.abs(out - want) / ((np.abs(want) + 2.0**-100) * (1.0 + np.abs(2 * z)))).max() / 2.0**-24)
    rows = np.empty(n, np.float32)  # four rows of n / 4 with one gain: each row as rms_norm gives it alone
    kernels.rms_norm_rows(address_of(x), address_of(w), n // 4, 4, eps, address_of(rows))
    alone = np.empty(n, np.float32)
    for r in range(4):
        kernels.rms_norm(address_of(x) + r * n, address_of(w), n // 4, eps, address_of(alone) + r * n)
    gu = np.concatenate([g.reshape(4, n // 4), u.reshape(4, n // 4)], axis=1)  # (4, n / 2): gate | up a row
    acts_as_alone = True
    for name in ("silu_mul", "gelu_tanh_mul"):  # four rows of gate | up in one call: each row's own call's bits
        rows_out, alone_out = np.empty(n, np.float32), np.empty(n, np.float32)
        getattr(kernels, name + "_rows")(address_of(gu), n // 4, 4, address_of(rows_out))
        for r in range(4):
            at = address_of(gu) + r * 2 * n
            getattr(kernels, name)(at, at + n, n // 4, address_of(alone_out) + r * n)
        acts_as_alone &= bool(np.array_equal(rows_out, alone_out))
    return {"n": n, "norm_ulps": rel_norm, "add_exact": bool(np.array_equal(x2, summed)), "add_ulps": rel_add,
            "silu_ulps": rel_silu, "gelu_ulps": rel_gelu, "rows_as_alone": bool(np.array_equal(rows, alone)),
            "acts_as_alone": acts_as_alone}


def case_attn_decode(kernels, ctx: int, nkv: int, group: int, hd: int, lo: int = 0) -> dict:
    """attn_decode on one new token (the last of ctx) over a scattered 16-token-block f32 pool: its q and k
    rotated and its k, v written into the pool row exactly as numpy's rotate_adjacent gives them (bit for bit),
    and the output against f64 softmax(q . k * scale) @ v over the keys from lo on (a window's; the first lo
    keys' probabilities exactly 0, their keys NaN here). `rel`: each output's error over its bound: the f32
    scores' rounding (hd terms, scaled) moving the probabilities, the exp's (Cephes expf, a few ulp), the sums
    over ctx keys, times sum_j p_j |v_j|."""
    k, v, table, qkv, cos, sin, slot = _decode_inputs(ctx, nkv, group, hd, lo)
    bs, nh = 16, nkv * group
    heads = qkv.reshape(nh + 2 * nkv, hd)
    rotated = rotate_adjacent(heads[None, : nh + nkv], cos[None, None], sin[None, None])[0]  # numpy's, in f32
    ld = (ctx + 3) & ~3
    s, out = np.full(nh * ld, np.nan, np.float32), np.full((nh, hd), np.nan, np.float32)
    scale = np.float32(1.0 / np.sqrt(hd))
    kernels.attn_decode(address_of(qkv), address_of(cos), address_of(sin), address_of(k), address_of(v),
                        address_of(table), ctx, lo, bs, nkv, group, hd, slot, float(scale), address_of(s), ld,
                        address_of(out))
    written = np.array_equal(k.reshape(-1, nkv, hd)[slot], rotated[nh:]) and np.array_equal(
        v.reshape(-1, nkv, hd)[slot], heads[nh + nkv:]) and np.array_equal(heads[: nh + nkv], rotated)
    pos = np.arange(lo, ctx)
    slots = table[pos // bs].astype(np.int64) * bs + pos % bs
    keys = k.reshape(-1, nkv, hd)[slots].astype(np.float64)  # (ctx, nkv, hd), the new key included
    vals = np.abs(v.reshape(-1, nkv, hd)[slots].astype(np.float64))
    q64 = rotated[:nh].astype(np.float64).reshape(nkv, group, hd)
    logits = np.einsum("hgd,chd->hgc", q64, keys) * float(scale)  # (nkv, group, ctx)
    p64 = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p64 /= p64.sum(axis=-1, keepdims=True)
    want = np.einsum("hgc,chd->hgd", p64, v.reshape(-1, nkv, hd)[slots].astype(np.float64)).reshape(nh, hd)
    unit = np.einsum("hgc,chd->hgd", p64, vals).reshape(nh, hd)
    s_err = hd * 2.0**-24 * float(scale) * np.einsum("hgd,chd->hgc", np.abs(q64), np.abs(keys)).max()
    tol = 2 * s_err + (2 * ctx + 16) * 2.0**-24
    probs = s.reshape(nh, ld)[:, :ctx].astype(np.float64)
    return {"case": [ctx, nkv, group, hd, lo], "written": bool(written), "finite": bool(np.isfinite(out).all()),
            "rel": float((np.abs(out - want) / (unit * tol)).max()), "masked_zero": bool((probs[:, :lo] == 0).all()),
            "probs_sum": float(np.abs(probs.sum(axis=1) - 1).max())}


def _decode_inputs(ctx: int, nkv: int, group: int, hd: int, lo: int) -> tuple:
    """K and V pools of 16-token blocks (three more than the context's), a scattered table, the new token's
    q | k | v (1, (nkv * group + 2 * nkv) * hd), its position's cos and sin, its pool row; the first lo keys
    NaN (a window's keys before it)."""
    rng = np.random.default_rng(ctx * 17 + hd + group)
    bs, used, nh = 16, -(-ctx // 16), nkv * group
    num_blocks = used + 3
    k, v = (rng.standard_normal((num_blocks, bs, nkv, hd)).astype(np.float32) for _ in range(2))
    table = rng.permutation(num_blocks)[:used].astype(np.int32)
    masked = table[np.arange(lo) // bs].astype(np.int64) * bs + np.arange(lo) % bs  # pool rows of the first lo keys
    k.reshape(-1, nkv, hd)[masked] = np.nan  # a masked key's score must not reach the softmax
    qkv = rng.standard_normal((1, (nh + 2 * nkv) * hd)).astype(np.float32)
    angles = np.float32(ctx - 1) * rope_inv_freq(hd, 10000.0)  # (hd / 2,)
    slot = int(table[(ctx - 1) // bs]) * bs + (ctx - 1) % bs
    return k, v, table, qkv, np.cos(angles), np.sin(angles), slot


def _mirrored(threads, *pools: np.ndarray) -> None:
    """Each pool given a mirror in the kernel threads' memory (cpu_attention.mirror) and copied there whole (a
    CpuBackend's pools start as zeros, like their mirrors; these do not)."""
    for pool in pools:
        mirror(threads, pool)
    runs = np.array([[address_of(p), p.nbytes] for p in pools], np.float64)
    threads.sync(address_of(runs), len(pools))


def _mirror_matches(threads, pool: np.ndarray) -> bool:
    """Whether the kernel threads' mirror of `pool` holds its bits."""
    back = np.empty_like(pool)
    threads.read(int(threads.mirror(address_of(pool), pool.nbytes)), pool.nbytes, address_of(back))
    return bool(np.array_equal(back.view(np.int32), pool.view(np.int32)))


def case_attn_decode_threads(kernels, threads, ctx: int, nkv: int, group: int, hd: int, lo: int = 0) -> dict:
    """attn_decode on the kernel threads over a mirror of the pools (web/linear_threads.js, or the wasmtime twin:
    rope_kv into the mirrors and the new row copied into the pools, then chunks of heads through attn_rows on every
    thread) against the export's one call on copies of the same inputs: the output's bits, the pools' (the new row
    written) and the mirrors' (the same bits as the pools)."""
    k, v, table, qkv, cos, sin, slot = _decode_inputs(ctx, nkv, group, hd, lo)
    nh, ld, scale = nkv * group, (ctx + 3) & ~3, float(np.float32(1.0 / np.sqrt(hd)))
    mine = [a.copy() for a in (k, v, qkv)]
    _mirrored(threads, mine[0], mine[1])
    outs = []
    for (kk, vv, q), run in (((k, v, qkv), kernels.attn_decode), (mine, threads.attn_decode)):
        s, out = np.full(nh * ld, np.nan, np.float32), np.full((nh, hd), np.nan, np.float32)
        run(address_of(q), address_of(cos), address_of(sin), address_of(kk), address_of(vv), address_of(table), ctx,
            lo, 16, nkv, group, hd, slot, scale, address_of(s), ld, address_of(out))
        outs.append(out)
    return {"case": [ctx, nkv, group, hd, lo], "finite": bool(np.isfinite(outs[1]).all()),
            "same_bits": bool(np.array_equal(outs[0].view(np.int32), outs[1].view(np.int32))),
            "pools_same": all(np.array_equal(a.view(np.int32), b.view(np.int32)) for a, b in zip((k, v), mine)),
            "mirrors_same": _mirror_matches(threads, mine[0]) and _mirror_matches(threads, mine[1])}


def _prefill_inputs(ctx: int, nkv: int, group: int, hd: int, nq: int, window: int) -> tuple:
    """q (nq, nkv * group, hd), K and V pools of 16-token blocks (three more than the context's), a scattered
    table, each query's seen and lo, every context token's pool row; the keys no query sees are NaN."""
    rng = np.random.default_rng(ctx * 31 + nq + hd + window)
    bs, used, nh = 16, -(-ctx // 16), nkv * group
    num_blocks = used + 3
    k, v = (rng.standard_normal((num_blocks, bs, nkv, hd)).astype(np.float32) for _ in range(2))
    table = rng.permutation(num_blocks)[:used].astype(np.int32)
    seen = ctx - nq + 1 + np.arange(nq)  # (nq,) keys each query sees the first of
    lo = np.maximum(seen - window, 0) if window else np.zeros(nq, np.int64)
    slots_all = table[np.arange(ctx) // bs].astype(np.int64) * bs + np.arange(ctx) % bs
    k.reshape(-1, nkv, hd)[slots_all[: lo[0]]] = np.nan
    q = rng.standard_normal((nq, nh, hd)).astype(np.float32)
    return q, k, v, table, seen, lo, slots_all


def case_attn_prefill_threads(kernels, threads, ctx: int, nkv: int, group: int, hd: int, nq: int,
                              window: int = 0, mirrored: bool = False) -> dict:
    """attn_prefill on the kernel threads (web/linear_threads.js, or the wasmtime twin: each thread a chunk of the
    queries over copies of the table's K and V blocks, or over their mirror where the pools have one) against the
    export's one call on the same inputs: every output's bits; the inputs untouched."""
    q, k, v, table, _, _, _ = _prefill_inputs(ctx, nkv, group, hd, nq, window)
    if mirrored:
        _mirrored(threads, k, v)
    before = [a.copy() for a in (q, k, v, table)]
    nh, scale = nkv * group, float(np.float32(1.0 / np.sqrt(hd)))
    one, split = (np.full((nq, nh, hd), np.nan, np.float32) for _ in range(2))
    s = np.full(nh * ((ctx + 3) & ~3), np.nan, np.float32)
    args = (address_of(q), address_of(k), address_of(v), address_of(table), ctx, nq, 16, nkv, group, hd, window, scale)
    kernels.attn_prefill(*args, address_of(s), address_of(one))
    threads.attn_prefill(*args, address_of(split))
    return {"case": [ctx, nkv, group, hd, nq, window], "finite": bool(np.isfinite(split).all()),
            "same_bits": bool(np.array_equal(one.view(np.int32), split.view(np.int32))),
            "inputs_kept": all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, (q, k, v, table)))}


def case_attn_prefill(kernels, ctx: int, nkv: int, group: int, hd: int, nq: int, window: int = 0) -> dict:
    """attn_prefill on the last nq of ctx cached tokens over a scattered 16-token-block f32 pool: query i against
    f64 softmax(q . k * scale) @ v over its keys lo_i .. seen_i - 1 (causal; lo_i = seen_i - window past a window),
    `rel` as case_attn_decode's (each output's error over its bound). The keys no query sees are NaN (a window's
    before the first query's), so one reaching a softmax shows."""
    q, k, v, table, seen, lo, slots_all = _prefill_inputs(ctx, nkv, group, hd, nq, window)
    bs, nh = 16, nkv * group
    s, out = np.full(nh * ((ctx + 3) & ~3), np.nan, np.float32), np.full((nq, nh, hd), np.nan, np.float32)
    scale = np.float32(1.0 / np.sqrt(hd))
    kernels.attn_prefill(address_of(q), address_of(k), address_of(v), address_of(table), ctx, nq, bs, nkv, group,
                         hd, window, float(scale), address_of(s), address_of(out))
    worst = 0.0
    for i in range(nq):
        slots = slots_all[lo[i]: seen[i]]
        keys = k.reshape(-1, nkv, hd)[slots].astype(np.float64)  # (seen, nkv, hd)
        vals = v.reshape(-1, nkv, hd)[slots].astype(np.float64)
        q64 = q[i].astype(np.float64).reshape(nkv, group, hd)
        logits = np.einsum("hgd,chd->hgc", q64, keys) * float(scale)
        p64 = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p64 /= p64.sum(axis=-1, keepdims=True)
        want = np.einsum("hgc,chd->hgd", p64, vals).reshape(nh, hd)
        unit = np.einsum("hgc,chd->hgd", p64, np.abs(vals)).reshape(nh, hd)
        s_err = hd * 2.0**-24 * float(scale) * np.einsum("hgd,chd->hgc", np.abs(q64), np.abs(keys)).max()
        tol = 2 * s_err + (2 * int(seen[i]) + 16) * 2.0**-24
        worst = max(worst, float((np.abs(out[i] - want) / (unit * tol)).max()))
    return {"case": [ctx, nkv, group, hd, nq, window], "finite": bool(np.isfinite(out).all()), "rel": worst}


def greedy(model: NumpyModel, prompt: list[int], new: int) -> dict:
    """Prefill `prompt`, then `new` greedy decode steps on a fresh KV cache: the ids and, at each step, the
    top-1 minus top-2 logit margin."""
    ctx = len(prompt) + new
    kv = PagedKVCache.allocate(model.config, -(-ctx // 16), 16)
    if hasattr(model, "mirror_kv"):  # as CpuBackend does: the kernel threads' mirror of the new pools, if any
        model.mirror_kv(kv)
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
