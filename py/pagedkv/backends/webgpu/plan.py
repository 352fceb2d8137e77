"""The forward step as a dispatch program: which kernel runs on which buffers, and each step's grids/uniforms.

A plan is recorded once per batch-shape bucket (PlanKey: matvec or matmul for the T new tokens, decode or
prefill attention, matvec or matmul for the S last tokens through the LM head) as a list of compute passes
of (pipeline, bind group). The grids and uniforms that depend on T and S are not baked in: every dispatch
reads its uniform from a 256-byte slot of one params buffer, and dispatches of the same kind share a slot
(all 30 layers' stacked q|k|v projections read slot "lin_qkv"), so a step writes ~13 slots in one
writeBuffer and hands the replayer one int32 array of grids.

Each dispatch costs ~0.45 ms on SwiftShader whatever its work, so a decode layer is 8 dispatches: q|k|v
matvec with its RMSNorm fused (NORM), rope + split into q / k / v, kv_write, paged attention + reduce,
output projection adding into x (ACCUMULATE), gate|up matvec with its RMSNorm and the SwiGLU fused (NORM,
SWIGLU), down projection adding into x. Prefill (matmul, compute-bound) keeps the two rmsnorm dispatches.
A layer whose q / k / v (or gate / up) have no lossless common type (llama.cpp's Q4_K_M: q4_K q / k, q6_K v)
runs the rmsnorm and one linear per member instead (fused.stacks): 4 dispatches for q|k|v, 3 for the FFN's
first half, writing the stacked path's layouts (member_linears), so the other dispatches do not change.

The backend's kernel family (b.kernels, model_kernels.FAMILIES) picks the matvec, matmul and argmax kernels
(the gpu family's in b.gpu_shapes' workgroup shapes, its matvecs in f16 where b.shader_f16) and, through
b.kv_kernels.decode / .prefill (kv_attention_gpu.py), the attention kernels.

Pure Python (no `js`): the GPU objects come from GpuContext through the backend.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...kernels.ref_ops import layer_inv_freq, model_inv_freq
from ...model.config import ModelConfig
from . import model_kernels as ops
from .fused import member_names
from .kv_attention_gpu import ATTENTION_WORKGROUP, fold_workgroup_bytes
from .shader_variants import FFN_DOWN_BINDINGS, FOLD_BINDINGS, FOLD_PREFIX, VARIANTS, ffn_gpu_shader, fold_shader

PARAM_SLOT_BYTES = 256  # minUniformBufferOffsetAlignment
SLOTS = ("embedding", "rms_t", "lin_h", "lin_qkv", "lin_ffn", "lin_down", "rope", "kv_write", "attn", "reduce",
         "rms_s", "lm_head", "argmax", "lin_q", "lin_kv", "lin_gate",  # lin_q..lin_gate: members not stacked (fused.py)
         "sample", "sample_shape", "sample_post",
         "rope_qk", "attn_window",  # rope with the per-head q / k norm; the window layers' attention
         "lm_head_last",  # the last row part of an LM head split across bindings (weight_upload.row_chunks)
         "ffn")  # a decode layer's gate | up and down in one dispatch (ffn_gpu_main.wgsl): lin_ffn's uniform
SLOT_INDEX = {name: i for i, name in enumerate(SLOTS)}
# At most this many split-K partials of a fused FFN's down projection (ffn_split): every workgroup of the next
# q | k | v matvec reads them all for its row of x (SmolLM2: 24 x 576 floats, the 1.5B preset: 32 x 2,048).
MAX_FFN_PARTS = 32
# The fused FFN's workgroup: 4 groups of 64 lanes, each computing the 8 gate | up rows of one activation vec4 at a
# time (ROW_GROUPS), then 256 lanes over down's rows. Fixed rather than tuned: the matvec tuner times lin_ffn's
# 8-row workgroups, whose best shape says little about a workgroup that owns a whole slice.
FFN_WORKGROUP, FFN_ROW_GROUPS = 256, 4
# Its slice's activations stay in workgroup memory beside the reduction's 12 KiB (256 lanes): at most 2 KiB, so the
# kernel fits WebGPU's default 16 KiB (an FFN wider than 16,384 keeps two dispatches: 32 partials of 16 blocks)
MAX_SLICE_VEC4 = 128
# The attention that computes its own q | k | v (paged_attention_gpu_fold.wgsl) runs the matvec's rows8 in 8 groups
# of 16 of its 128 lanes: 8 rows each a call, so SmolLM2's 3 heads' q rows take 3 calls (the 1.5B's 4 heads 4) and
# a kv head's k and v 2, each call 6 barriers (a 16-lane tree): fewer groups would take as many multiply-adds a lane
# and more barriers.
FOLD_ROW_GROUPS = 8


def ffn_split(ffn: int) -> tuple[int, int]:
    """(activation vec4s a fused-FFN workgroup computes, workgroups = partials) for an FFN of `ffn` activations:
    whole 32-blocks of down's row each, as few blocks as keep the partials at most MAX_FFN_PARTS."""
    blocks = ffn // ops.QK
    per = -(-blocks // MAX_FFN_PARTS)  # 8 activation vec4s a block: a multiple of FFN_ROW_GROUPS
    return 8 * per, -(-blocks // per)


@dataclass(frozen=True)
class PlanKey:
    """Batch-shape bucket of a recorded plan."""

    token_kernel: str  # "matvec" (T <= 2) or "matmul"
    decode: bool  # every sequence brings exactly one new token (paged_attention + reduce)
    seq_kernel: str  # "matvec" (S <= 2) or "matmul", for the LM head
    sampled: bool = False  # the next tokens are drawn on the GPU (sample.wgsl), not argmax'd
    greedy: bool = False  # only the argmax ids come back: the gpu family's LM head matvec writes no logits
    shaped: bool = False  # sampled, from logits sample_shape.wgsl shaped first (device_draws.py)
    prefill_passes: int = 1  # dispatches of prefill attention a layer (KVKernels.prefill_passes)
    # the step's last-layer queries are scored after it (attention mass, WebGpuBackend._attention_mass): that
    # layer's q | k | v writes scratch q (not folded into its attention, which keeps q in workgroup memory)
    mass: bool = False

    @classmethod
    def of(cls, num_tokens: int, num_seqs: int, sampled: bool = False, greedy: bool = False,
           shaped: bool = False, prefill_passes: int = 1, mass: bool = False) -> "PlanKey":
        decode = num_tokens == num_seqs
        return cls(_linear_kind(num_tokens), decode, _linear_kind(num_seqs), sampled,
                   greedy and not sampled, sampled and shaped, 1 if decode else prefill_passes, mass)


def _linear_kind(tokens: int) -> str:
    return ops.linear_call("q8_0", 8, ops.QK, tokens).shader.split("_")[0]


@dataclass(frozen=True)
class Dispatch:
    """One recorded dispatch: pipeline key (shader, constants), its bindings, its uniform slot."""

    shader: str
    constants: tuple | None  # None: a KV-cache kernel, compiled by KVKernels with the cache layout's constants
    bindings: tuple  # buffers in @binding order, the uniform slot excluded (or a {binding: buffer} dict)
    slot: str
    extra: tuple = ()  # (binding, buffer) pairs past the uniform: a matvec io variant's own (matvec_io_*.wgsl)
    entry: str = "main"  # the shader's entry point (rope.wgsl's main_qk_norm)
    uniform_at: int | None = None  # the uniform slot's binding where it is not after the bindings (a skipped one)


def rope_tables(cfg: ModelConfig) -> tuple[tuple[np.ndarray, ...], tuple[int | None, ...]]:
    """The distinct rotary frequencies of cfg's layers, (head_dim / 2,) f32 each, and each layer's index into
    them (None: a layer without rotary). Each gets a cos / sin table of its own (rope_table_label); a model none
    of whose layers rotates keeps one of the file's frequencies, which its kernels bind but do not read."""
    keys: list[tuple] = []
    index = []
    for layer in cfg.layers:
        att = layer.attention
        if att.rope_base is None:
            index.append(None)
            continue
        key = (att.rope_base, att.rope_scaled)
        if key not in keys:
            keys.append(key)
        index.append(keys.index(key))
    freqs = tuple(layer_inv_freq(cfg, cfg.layers[index.index(j)]) for j in range(len(keys)))
    return freqs or (model_inv_freq(cfg),), tuple(index)


def rope_table_label(table: int) -> str:
    """The scratch label of cos / sin table `table` (rope_tables): "cos_sin", "cos_sin_1", ..."""
    return "cos_sin" if table == 0 else f"cos_sin_{table}"


def layer_program(b, key: PlanKey) -> list[list[Dispatch]]:
    """The step as passes of Dispatches over the backend `b`'s buffers; pass 1 runs after the last-row copies.

    Each layer is compiled from its family.Layer (config.layers): its q / k norm (rope.wgsl's main_qk_norm),
    its rotary table or none (ROTATE), its window (the "attn_window" slot), its post norms (the projection
    writes h, rmsnorm's ADD adds the normed h into x) and its activation (GELU)."""
    cfg, s, w = b.config, b.scratch, b.weights
    tables = rope_tables(cfg)[1]  # each layer's cos / sin table, None: no rotary

    def linear(name: str, x, y, slot: str, kind: str, accumulate: bool = False, norm: bool = False,
               swiglu: bool = False, layout: tuple = (), io: str = "", extra: tuple = (),
               weight: tuple | None = None) -> Dispatch:
        dtype, parts = weight or w[name]  # weight: one row part of a matrix split across bindings
        shapes = b.gpu_shapes.for_slot(slot)  # a projection's tuned threads and row groups
        shader, constants = ops.linear_pipeline(b.kernels, b.subgroups, kind, dtype, accumulate, norm, swiglu,
                                                shapes, b.shader_f16, b.gpu_matmul, io)
        return Dispatch(shader, constants + layout, (*parts, x, y), slot, extra)

    def normed_linear(norm: str, name: str, y, slot: str, swiglu: bool = False, act: tuple = ()) -> list[Dispatch]:
        """y = rms_norm(x) @ W.T: matvec fuses the norm (its weight is stored after the stacked codes);
        matmul (prefill, compute-bound) keeps the separate rmsnorm dispatch. act: the gated activation's
        constants (GELU) of a SWIGLU linear."""
        rms = Dispatch("rmsnorm", (("WORKGROUP_SIZE", 64),), (s["x"], w[norm][1][0], s["h"]), "rms_t")
        if member_names(name)[0] in w:  # members with no lossless common type, uploaded one by one (fused.stacks)
            return [rms, *member_linears(name, y, act)]
        if tk == "matvec":
            return [linear(name, s["x"], y, slot, tk, norm=True, swiglu=swiglu, layout=act)]
        return [rms, linear(name, s["h"], y, slot, tk, swiglu=swiglu, layout=act)]

    def member_linears(stacked: str, y, act: tuple = ()) -> list[Dispatch]:
        """The members of `stacked` one by one from the normed h into the stacked path's layout of y:
        q / k / v into their columns of (T, q + k + v) (Y_STRIDE, Y_OFFSET), act = silu(gate) * up (SILU_MUL;
        GELU in act: gelu_tanh(gate) * up)."""
        names = member_names(stacked)
        if len(names) == 2:  # gate, up
            return [linear(names[0], s["h"], y, "lin_gate", tk),
                    linear(names[1], s["h"], y, "lin_gate", tk, layout=(("SILU_MUL", 1), *act))]
        stride, offsets = cfg.q_dim + 2 * cfg.kv_dim, (0, cfg.q_dim, cfg.q_dim + cfg.kv_dim)
        return [linear(name, s["h"], y, slot, tk, layout=(("Y_STRIDE", stride), ("Y_OFFSET", offset)))
                for name, slot, offset in zip(names, ("lin_q", "lin_kv", "lin_kv"), offsets)]

    def kv_kernel(name: str) -> tuple:
        return name, None

    def cos_sin(i: int):
        """Layer i's cos / sin table (a layer without rotary binds the first, unread: ROTATE 0)."""
        return s[rope_table_label(tables[i] or 0)]

    def qkv_rope_kv(i: int, cache) -> list[Dispatch]:
        """The q | k | v matvec with bias, RoPE and the KV write in its epilogue (matvec_io_rope_kv.wgsl): q into
        scratch q, K and V into the cache (f32 / f16), or into scratch k / v for kv_write_quant."""
        p, lay = f"blk.{i}.", b.kv_kernels.layout
        quantized = lay.kind.quantized
        constants = (("HEAD_DIM", cfg.head_dim), ("Q_ROWS", cfg.n_heads * cfg.head_dim), ("KV_ROWS", cfg.kv_dim),
                     ("KV_OUT", 2 if quantized else 1 if lay.dtype == "f16" else 0),
                     ("BLOCK_TOKENS", lay.block_size),
                     ("HEAD_MAJOR", lay.constants["HEAD_MAJOR"]),
                     *((("BLOCK_U32", lay.constants["BLOCK_U32"]),) if "BLOCK_U32" in lay.constants else ()),
                     *((("ROTATE", 0),) if tables[i] is None else ()), *split_parts(i))
        bias = w[p + "attn_qkv.bias"][1][0] if cfg.attention_bias else s["zero_bias"]
        k, v = (s["k"], s["v"]) if quantized else (cache.k, cache.v)
        extra = ((8, s["positions"]), (9, cos_sin(i)), (10, bias), (11, b.group_binding("slot_mapping", i)), (12, k),
                 (13, v))
        fused = [linear(p + "attn_qkv.weight", s["x"], s["q"], "lin_qkv", tk, norm=True, layout=constants,
                        io="_rope_kv", extra=extra)]
        if quantized:  # the scales need a whole group of a row: kv_write_quant's workgroups
            fused.append(Dispatch(*kv_kernel("kv_write"),
                                  (s["k"], s["v"], b.group_binding("slot_mapping", i), cache.k, cache.v), "kv_write"))
        return fused

    def folded(i: int) -> bool:
        """Decode layer i's q | k | v runs inside its attention (paged_attention_gpu_fold.wgsl): a fused q | k | v
        (qkv_fused), an f32 / f16 cache (a quantized row's scales need kv_write_quant), no attention bias (the
        kernel has no binding left for it: WebGPU's 10 storage buffers a stage), its workgroup memory within the
        device's, and the backend's fold_qkv switch on; not the last layer of a step whose attention mass is
        scored from its queries (PlanKey.mass)."""
        lay = b.kv_kernels.layout
        return (b.fold_qkv and fuse and key.decode and qkv_fused(i) and lay.dtype in ("f32", "f16")
                and not cfg.attention_bias and not (key.mass and i == cfg.n_layers - 1)
                and fold_workgroup_bytes(cfg.hidden, cfg.head_dim, b.kv_kernels.head_tile) <= b.workgroup_storage)

    def fold_attention(i: int, cache, tables_i, slot: str) -> Dispatch:
        """Layer i's decode attention computing its own q | k | v (main_fold): the q | k | v weight as the `qkv_`
        instance's parts at FOLD_BINDINGS.., x after them, their uniform the step's lin_qkv slot; the new token's
        rotary position after the context lengths (forward writes them there on a decode step)."""
        lay = b.kv_kernels.layout
        dtype, parts = w[f"blk.{i}.attn_qkv.weight"]
        at = FOLD_BINDINGS + len(parts)  # the instance's x (its y, unused, follows; then its uniform)
        constants = (*lay.constants.items(), ("SLOTS", b.kv_kernels.head_tile),
                     ("WORKGROUP_SIZE", ATTENTION_WORKGROUP), ("FOLD", 1), ("NEW_KV_VEC4", cfg.head_dim // 2),
                     ("X_VEC4", cfg.hidden // 4), *((("ROTATE", 0),) if tables[i] is None else ()),
                     *split_parts(i), (FOLD_PREFIX + "WORKGROUP_SIZE", ATTENTION_WORKGROUP),
                     (FOLD_PREFIX + "ROW_GROUPS", FOLD_ROW_GROUPS), (FOLD_PREFIX + "NORM", 1))
        bindings = {1: cache.k, 2: cache.v, 3: tables_i, 4: s["context_lens"], 7: s["part_acc"], 8: s["part_stats"],
                    9: cos_sin(i), **{FOLD_BINDINGS + j: part for j, part in enumerate(parts)}, at: s["x"]}
        qkv_uniform = (s["params"], SLOT_INDEX["lin_qkv"] * PARAM_SLOT_BYTES, PARAM_SLOT_BYTES)
        return Dispatch(fold_shader(dtype, b.subgroups, b.shader_f16), constants, bindings, slot, ((at + 2, qkv_uniform),),
                        "main_fold", uniform_at=5)

    def merge_linear(i: int, y, accumulate: bool) -> Dispatch:
        """The output projection adding into x (or writing y), the decode attention's partition merge in its
        prologue (matvec_io_merge.wgsl, reading the step's "reduce" uniform slot), and the previous layer's
        fused-FFN partials added with the residual (SPLIT_PARTS)."""
        merge_words = (s["params"], SLOT_INDEX["reduce"] * PARAM_SLOT_BYTES, PARAM_SLOT_BYTES)
        extra = ((8, s["context_lens"]), (9, s["part_acc"]), (10, s["part_stats"]), (11, merge_words))
        states = (("STATES_ONLY", 1),) if folded(i) else ()  # the fold writes a single partition's state too
        return linear(f"blk.{i}.attn_output.weight", s["attn"], y, "lin_h", tk, accumulate=accumulate,
                      layout=(("HEAD_DIM", cfg.head_dim), *split_parts(i), *states), io="_merge", extra=extra)

    def qkv_fused(i: int) -> bool:
        """Layer i's q | k | v runs as one matvec with RoPE and the KV write in its epilogue: stacked, and no
        q / k norm (the fused epilogue has none: those layers take the rope pass)."""
        return fuse and member_names(f"blk.{i}.attn_qkv.weight")[0] not in w and not cfg.layers[i].qk_norm

    def ffn_shader(i: int) -> str | None:
        """The fused FFN kernel of decode layer i (ffn_gpu_main.wgsl), or None where the layer keeps gate | up and
        down apart: its gate / up unstacked, a post-FFN norm, the last layer (the LM head reads a whole x), a
        next layer whose q | k | v or output projection cannot take the partials (not fused, or a post-attention
        norm: rmsnorm's ADD writes x), or a slice too wide for workgroup memory."""
        p = f"blk.{i}."
        if not (fuse and key.decode and i + 1 < cfg.n_layers and member_names(p + "ffn_gate_up.weight")[0] not in w
                and not cfg.layers[i].post_ffn_norm and qkv_fused(i + 1)
                and not cfg.layers[i + 1].post_attention_norm and ffn_split(cfg.ffn)[0] <= MAX_SLICE_VEC4):
            return None
        shader = ffn_gpu_shader(w[p + "ffn_gate_up.weight"][0], w[p + "ffn_down.weight"][0], b.subgroups,
                                b.shader_f16)
        return shader if shader in VARIANTS else None

    def split_parts(i: int) -> tuple:
        """SPLIT_PARTS of layer i's q | k | v and output projection: the partials layer i - 1's fused FFN left."""
        return (("SPLIT_PARTS", ffn_split(cfg.ffn)[1]),) if i and ffn_shader(i - 1) else ()

    def ffn(i: int, shader: str, act: tuple) -> Dispatch:
        """gate | up with its RMSNorm and SwiGLU, then down split along K into partials after x's rows
        (ffn_gpu_main.wgsl): x's buffer bound as the kernel's y only (its x binding unused), the uniform after it."""
        shapes = b.gpu_shapes.for_slot("lin_ffn")
        constants = ops.linear_constants(FFN_WORKGROUP, norm=True, row_groups=FFN_ROW_GROUPS,
                                         whole_blocks=shapes.matvec_whole_blocks)
        dtype, parts = w[f"blk.{i}.ffn_gate_up.weight"]
        down = w[f"blk.{i}.ffn_down.weight"][1]
        return Dispatch(shader, (*constants, ("SLICE_VEC4", ffn_split(cfg.ffn)[0]), *act),
                        {**dict(enumerate(parts)), len(parts) + 1: s["x"]}, "ffn",
                        tuple((FFN_DOWN_BINDINGS + j, buffer) for j, buffer in enumerate(down)), uniform_at=len(parts) + 2)

    def rope(i: int, spec) -> Dispatch:
        """Bias, the per-head q / k norm where the layer has one, rotary where it has one; q / k / v split."""
        p = f"blk.{i}."
        bindings = (s["qkv"], s["q"], s["k"], s["v"], s["positions"], cos_sin(i),
                    w[p + "attn_qkv.bias"][1][0] if cfg.attention_bias else s["zero_bias"])
        rotate = (("ROTATE", 0),) if tables[i] is None else ()
        if not spec.qk_norm:
            return Dispatch("rope", (("WORKGROUP_SIZE", 64), *rotate), bindings, "rope")
        gains = ((8, w[p + "attn_q_norm.weight"][1][0]), (9, w[p + "attn_k_norm.weight"][1][0]))
        return Dispatch("rope", (("WORKGROUP_SIZE", cfg.head_dim // 2), *rotate), bindings, "rope_qk", gains,
                        "main_qk_norm")

    def residual(i: int, linear_of, post_norm: str | None) -> list[Dispatch]:
        """x += linear_of(y): accumulated straight into x, or, with the layer's post norm, written into h
        and added to x normed (rmsnorm.wgsl's ADD)."""
        if post_norm is None:
            return [linear_of(s["x"], True)]
        return [linear_of(s["h"], False),
                Dispatch("rmsnorm", (("WORKGROUP_SIZE", 64), ("ADD", 1)),
                         (s["h"], w[f"blk.{i}.{post_norm}.weight"][1][0], s["x"]), "rms_t")]

    emb_scale = (("EMBEDDING_SCALE", float(cfg.embedding_scale)),) if cfg.embedding_scale != 1.0 else ()
    table = row_parts(b, "token_embd.weight")  # a table too large for one binding: a dispatch per row part
    split = len(table) > 1
    passes = [[Dispatch(ops.embedding_call(1, cfg.hidden, dtype=dtype).shader,
                        (("WORKGROUP_SIZE", 64), *emb_scale,
                         *((("ROW_BASE", first), ("ROW_END", first + rows)) if split else ())),
                        (*bufs, s["token_ids"], s["x"]), "embedding") for first, rows, (dtype, bufs) in table]]
    body = passes[0]
    tk = key.token_kernel
    # The gpu family's matvec steps fuse what runs around the projections (matvec_io_*.wgsl): 5 dispatches a
    # decode layer with f32 / f16 KV (6 quantized), where the unfused program has 8; 4 (5) where the FFN is one
    # dispatch (ffn_shader).
    fuse = b.kernels == "gpu" and tk == "matvec" and cfg.head_dim % 8 == 0
    for i, spec in enumerate(cfg.layers):
        p = f"blk.{i}."
        # this layer's K and V buffers (its slot's in its KV group) and its group's block tables
        cache, tables_i = b.kv_pool.cache_of(i), b.group_binding("block_tables", i)
        if folded(i):
            pass  # q | k | v in the attention below
        elif qkv_fused(i):
            body += qkv_rope_kv(i, cache)
        else:
            body += normed_linear(p + "attn_norm.weight", p + "attn_qkv.weight", s["qkv"], "lin_qkv")  # q | k | v
            body += [
                rope(i, spec),  # adds the q | k | v bias, norms q / k heads, rotates, splits
                Dispatch(*kv_kernel("kv_write"), (s["k"], s["v"], b.group_binding("slot_mapping", i), cache.k, cache.v),
                         "kv_write"),
            ]
        common = (s["q"], cache.k, cache.v, tables_i, s["context_lens"])
        attn_slot = "attn" if spec.attention.window is None else "attn_window"
        if folded(i):
            body.append(fold_attention(i, cache, tables_i, attn_slot))
        elif key.decode:
            body.append(Dispatch(*kv_kernel(b.kv_kernels.decode.attention),
                                 {**dict(enumerate(common)), 6: s["attn"], 7: s["part_acc"], 8: s["part_stats"]},
                                 attn_slot))
            if not fuse:
                body.append(Dispatch(*kv_kernel(b.kv_kernels.decode.reduce),
                                     (s["context_lens"], s["part_acc"], s["part_stats"], s["attn"]), "reduce"))
        else:
            kv = b.kv_kernels
            # The passes keep their (T, n_heads, 4) f32 states (paged_prefill_attention_{main,gpu}.wgsl) in act,
            # (T, ffn): the last layer's activation is spent and this one's not yet made.
            if cfg.ffn < 4 * cfg.n_heads:
                raise ValueError(f"prefill passes keep 4 floats a head in the ffn-wide activation: ffn {cfg.ffn} < 4 x "
                                 f"{cfg.n_heads} heads")
            for name in [kv.prefill.name] + [kv.prefill_resume] * (key.prefill_passes - 1):
                body.append(Dispatch(*kv_kernel(name), {**dict(enumerate(common)), 6: s["starts"], 7: s["attn"],
                                                        8: s["act"]}, attn_slot))
        post_attention = "post_attention_norm" if spec.post_attention_norm else None
        if fuse and key.decode:  # x += o, the partitions merged on the way in
            body += residual(i, lambda y, acc: merge_linear(i, y, acc), post_attention)
        else:  # x += o
            body += residual(i, lambda y, acc: linear(p + "attn_output.weight", s["attn"], y, "lin_h", tk,
                                                      accumulate=acc), post_attention)
        # act = silu(gate) * up (or gelu_tanh(gate) * up) straight from the gate / up rows (interleaved by fours)
        act = (("GELU", 1),) if spec.activation == "gelu_tanh" else ()
        fused_ffn = ffn_shader(i)
        if fused_ffn:  # x += down, added by the next layer's q | k | v and output projection
            body.append(ffn(i, fused_ffn, act))
            continue
        body += normed_linear(p + "ffn_norm.weight", p + "ffn_gate_up.weight", s["act"], "lin_ffn", swiglu=True,
                              act=act)
        body += residual(i, lambda y, acc: linear(p + "ffn_down.weight", s["act"], y, "lin_down", tk,
                                                  accumulate=acc),
                         "post_ffw_norm" if spec.post_ffn_norm else None)  # x += down
    head = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
    rms_s = Dispatch("rmsnorm", (("WORKGROUP_SIZE", 64),),
                     (s["last"], w["output_norm.weight"][1][0], s["last_norm"]), "rms_s")
    # A greedy step of the gpu family's LM head matvec writes no logits: its workgroups leave their best rows in
    # the logits buffer (matvec_io_argmax.wgsl), which argmax_gpu scans (WINNERS_OF = its 8 rows a workgroup).
    # That matvec also runs the final RMSNorm (NORM, the gain bound at 8): no rms_s dispatch.
    head_parts = row_parts(b, head)
    winners = key.greedy and b.kernels == "gpu" and key.seq_kernel == "matvec" and len(head_parts) == 1
    if winners:
        rms_s, lm_head = None, [linear(head, s["last"], s["logits"], "lm_head", key.seq_kernel, norm=True,
                                       io="_argmax", extra=((8, w["output_norm.weight"][1][0]),))]
    elif len(head_parts) == 1:
        lm_head = [linear(head, s["last_norm"], s["logits"], "lm_head", key.seq_kernel)]
    else:  # each row part into its columns of the logits (Y_STRIDE / Y_OFFSET, quant_epilogue.wgsl)
        lm_head = [linear(head, s["last_norm"], s["logits"], "lm_head" if rows == head_parts[0][1] else "lm_head_last",
                          key.seq_kernel, layout=(("Y_STRIDE", cfg.vocab), ("Y_OFFSET", first)), weight=weight)
                   for first, rows, weight in head_parts]
    pick_more = []
    if key.shaped:  # sample.wgsl draws from the shaped logits; the raw ones stay for the log-probs
        shape = Dispatch("sample_shape", (("WORKGROUP_SIZE", 256),),
                         (s["logits"], s["sampling"], s["sample_rows"], s["sample_bias"], s["token_counts"],
                          s["shaped_logits"], s["ids"]), "sample_shape")
        pick = Dispatch("sample", (("WORKGROUP_SIZE", 256),), (s["shaped_logits"], s["sampling"], s["ids"]), "sample")
        post = Dispatch("sample_post", (("WORKGROUP_SIZE", 64),),
                        (s["logits"], s["sample_rows"], s["ids"], s["token_counts"]), "sample_post")
        pick, pick_more = shape, [pick, post]
    elif key.sampled:
        pick = Dispatch("sample", (("WORKGROUP_SIZE", 256),), (s["logits"], s["sampling"], s["ids"]), "sample")
    elif winners:
        pick = Dispatch("argmax_gpu", (("WORKGROUP_SIZE", 256), ("WINNERS_OF", 8)), (s["logits"], s["ids"]), "argmax")
    else:
        pick = Dispatch(ops.argmax_call(cfg.vocab, 1, family=b.kernels).shader, (("WORKGROUP_SIZE", 256),),
                        (s["logits"], s["ids"]), "argmax")
    passes.append([*([rms_s] if rms_s else []), *lm_head, pick, *pick_more])
    return passes


@dataclass(frozen=True)
class StepShape:
    """What a step's grids and uniforms depend on."""

    num_tokens: int
    num_seqs: int
    table_width: int  # columns of block_tables
    max_parts: int  # flash-decoding partitions of the longest context (decode)
    num_tiles: int  # prefill query tiles over all sequences (prefill)
    decode: bool
    partition_blocks: int = 0  # blocks per decode partition (0: KVKernels.partition_blocks, the fixed split)


def step_slots(b, shape: StepShape) -> tuple[np.ndarray, np.ndarray]:
    """(len(SLOTS), 3) int32 grids and (len(SLOTS) * 256,) u8 uniforms of one step shape."""
    cfg = b.config
    t, n = shape.num_tokens, shape.num_seqs
    kv = b.kv_kernels
    lay = kv.layout
    q8 = "q8_0"  # grid and uniform of a linear call do not depend on the quantization

    # rows of the LM head's row parts: the first's ("lm_head"), the last's ("lm_head_last")
    head_rows = [rows for _, rows, _ in row_parts(b, "token_embd.weight" if cfg.tied_embeddings else "output.weight")]

    def linear(rows: int, cols: int, tokens: int, slot: str) -> ops.KernelCall:
        return ops.family_linear_call(b.kernels, b.subgroups, q8, rows, cols, tokens,
                                      shapes=b.gpu_shapes.for_slot(slot), gpu_matmul=b.gpu_matmul)

    calls = {
        "embedding": ops.embedding_call(t, cfg.hidden),
        "rms_t": ops.rmsnorm_call(cfg.hidden, t, cfg.rms_eps),
        "lin_h": linear(cfg.hidden, cfg.q_dim, t, "lin_h"),
        "lin_qkv": _with_eps(linear(cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden, t, "lin_qkv"), cfg.rms_eps),
        "lin_ffn": _with_eps(linear(2 * cfg.ffn, cfg.hidden, t, "lin_ffn"), cfg.rms_eps),
        "ffn": replace(_with_eps(linear(2 * cfg.ffn, cfg.hidden, t, "lin_ffn"), cfg.rms_eps),
                       workgroups=(ffn_split(cfg.ffn)[1], t, 1)),  # a workgroup an FFN slice (ffn_gpu_main.wgsl)
        "lin_down": linear(cfg.hidden, cfg.ffn, t, "lin_down"),
        "lin_q": linear(cfg.q_dim, cfg.hidden, t, "lin_q"),
        "lin_kv": linear(cfg.kv_dim, cfg.hidden, t, "lin_kv"),
        "lin_gate": linear(cfg.ffn, cfg.hidden, t, "lin_gate"),
        "rope": ops.rope_call(t, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim),
        "rope_qk": ops.rope_qk_norm_call(t, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rms_eps),
        "rms_s": ops.rmsnorm_call(cfg.hidden, n, cfg.rms_eps),
        "lm_head": _with_eps(linear(head_rows[0], cfg.hidden, n, "lm_head"), cfg.rms_eps),  # NORM: greedy winners
        "lm_head_last": linear(head_rows[-1], cfg.hidden, n, "lm_head_last"),
        "argmax": ops.argmax_call(cfg.vocab, n, family=b.kernels),
        "sample": ops.sample_call(cfg.vocab, n),
        "sample_shape": ops.sample_shape_call(cfg.vocab, n, b.max_num_seqs),
        "sample_post": ops.sample_post_call(cfg.vocab, n, b.max_num_seqs),
    }
    grids = np.zeros((len(SLOTS), 3), np.int32)  # (slots, 3)
    params = np.zeros((len(SLOTS), PARAM_SLOT_BYTES), np.uint8)  # (slots, 256)
    for name, call in calls.items():
        grids[SLOT_INDEX[name]] = call.workgroups
        params[SLOT_INDEX[name], : len(call.params)] = np.frombuffer(call.params, np.uint8)

    def put(name: str, words: np.ndarray, groups: tuple) -> None:
        grids[SLOT_INDEX[name]] = groups
        params[SLOT_INDEX[name], : words.nbytes] = words.view(np.uint8)

    words = ops.uniform_words
    put("kv_write", words(t, lay.n_kv_heads), kv.kv_write_grid(t))
    part_blocks = shape.partition_blocks or kv.partition_blocks
    attn_grid = kv.decode_grids(n, shape.max_parts)[0] if shape.decode else kv.prefill_grid(shape.num_tiles)
    for slot, (scale, window) in attention_uniforms(cfg).items():  # "attn", "attn_window" where layers have one
        put(slot, words(n, cfg.n_heads, lay.n_kv_heads, lay.block_size, shape.table_width, part_blocks,
                        shape.max_parts, scale, window), attn_grid)
    reduce_groups = kv.decode_grids(n, shape.max_parts)[1] if shape.max_parts > 1 else (0, 0, 0)
    put("reduce", words(n, cfg.n_heads, lay.block_size, part_blocks, shape.max_parts), reduce_groups)
    return grids, params.reshape(-1)


def row_parts(b, name: str) -> list[tuple[int, int, tuple]]:
    """(first row, rows, (dtype, buffers)) of the vocab-row matrix `name` (the embedding table, the LM head) on
    backend b: its row parts where it is too large for one binding (weight_upload.row_chunks), else the whole."""
    return b.weight_rows.get(name) or [(0, b.config.vocab, b.weights[name])]


def attention_uniforms(cfg) -> dict[str, tuple[float, int]]:
    """(scale, window) of the attention slots: "attn" for the layers that see every key before them (window 0),
    "attn_window" for the window layers; a model whose window layers differ in scale or window has no plan."""
    slots: dict[str, set] = {}
    for layer in cfg.layers:
        att = layer.attention
        slots.setdefault("attn" if att.window is None else "attn_window", set()).add((att.scale, att.window or 0))
    if any(len(kinds) > 1 for kinds in slots.values()):
        raise ValueError(f"{cfg.architecture}: the WebGPU plan has one attention uniform for the window layers and "
                         f"one for the others, but its layers have (scale, window) {sorted(set().union(*slots.values()))}")
    return {slot: kinds.pop() for slot, kinds in slots.items()}


def _with_eps(call: ops.KernelCall, eps: float) -> ops.KernelCall:
    """The call's uniform with the norm eps in its last word (read by matvec's NORM variant, ignored by matmul)."""
    return replace(call, params=call.params[:12] + np.float32(eps).tobytes())
