"""The recorded step program and its per-step grids/uniforms, checked in CPython (no GPU)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from pagedkv.backends.webgpu.kv_kernels import KVKernels
from pagedkv.backends.webgpu.kv_layout import GpuKVLayout
from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.backends.webgpu.model_kernels import GpuShapes
from pagedkv.backends.webgpu.plan import PARAM_SLOT_BYTES, SLOT_INDEX, PlanKey, StepShape, layer_program, step_slots
from pagedkv.kv.spec import KVSpec
from pagedkv.model.config import ModelConfig

CFG = ModelConfig("llama", 2, 64, 4, 2, 16, 128, 512, 1e5, "adjacent_pairs", 1e-5, 256, True)


def fake_backend(kernels: str = "cpu", subgroups: bool = False, shader_f16: bool = False, kv_dtype: str = "f16",
                 fold: bool = False):
    ctx = SimpleNamespace(info=SimpleNamespace(limits={"maxComputeWorkgroupsPerDimension": 65535}))
    layout = GpuKVLayout(KVSpec(1, 2, 16, 16, kv_dtype), 10)
    names = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{n}.weight" for i in range(2) for n in
        ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_gate_up", "ffn_down")]  # as uploaded (stacked)
    weights = {n: ("f32", (n,)) if "norm" in n else ("q8_0" if n == "token_embd.weight" else "q4_1", (n + ".qs", n + ".d"))
               for n in names}
    scratch = {k: k for k in ("token_ids", "positions", "slot_mapping", "block_tables", "context_lens", "starts",
                              "cos_sin", "zero_bias", "x", "h", "qkv", "q", "k", "v", "attn", "act", "part_acc",
                              "part_stats", "last", "last_norm", "logits", "ids", "params", "sampling",
                              "sample_rows", "sample_bias", "token_counts", "shaped_logits")}
    caches = [SimpleNamespace(k=f"k{i}", v=f"v{i}") for i in range(2)]
    return SimpleNamespace(config=CFG, scratch=scratch, weights=weights, weight_rows={},
                           kv_pool=SimpleNamespace(caches=caches, cache_of=caches.__getitem__),
                           group_binding=lambda name, layer: scratch[name],  # one KV group: the whole buffers
                           kv_kernels=KVKernels(ctx, layout, CFG.n_heads, family=kernels, subgroups=subgroups),
                           kernels=kernels, subgroups=subgroups, gpu_shapes=GpuShapes(), shader_f16=shader_f16,
                           gpu_matmul=kernels == "gpu", max_num_seqs=4, fold_qkv=fold, workgroup_storage=16384)


def test_plan_keys_bucket_batches_by_kernel_choice():
    assert PlanKey.of(1, 1) == PlanKey("matvec", True, "matvec")
    assert PlanKey.of(3, 3) == PlanKey("matmul", True, "matmul")
    assert PlanKey.of(40, 2) == PlanKey("matmul", False, "matvec")


def test_program_has_one_pass_per_phase_and_8_or_9_dispatches_per_layer():
    b = fake_backend()
    decode = layer_program(b, PlanKey.of(2, 2))
    prefill = layer_program(b, PlanKey.of(24, 3))
    assert [len(p) for p in decode] == [1 + 2 * 8, 3]  # embedding + layers (with the reduce) | norm, head, argmax
    assert [len(p) for p in prefill] == [1 + 2 * 9, 3]
    layer = [(d.shader, d.constants, d.slot) for d in decode[0][1:9]]
    assert layer == [
        ("matvec_q4_1", (("WORKGROUP_SIZE", 32), ("NORM", 1)), "lin_qkv"),  # attn_norm fused, q|k|v stacked
        ("rope", (("WORKGROUP_SIZE", 64),), "rope"),
        ("kv_write", None, "kv_write"), ("paged_attention_narrow", None, "attn"),  # heads of 32
        ("paged_attention_reduce", None, "reduce"),
        ("matvec_q4_1", (("WORKGROUP_SIZE", 32), ("ACCUMULATE", 1)), "lin_h"),  # x += o
        ("matvec_q4_1", (("WORKGROUP_SIZE", 32), ("NORM", 1), ("SWIGLU", 1)), "lin_ffn"),  # ffn_norm, gate|up, SwiGLU
        ("matvec_q4_1", (("WORKGROUP_SIZE", 32), ("ACCUMULATE", 1)), "lin_down")]  # x += down
    assert decode[0][1].bindings == ("blk.0.attn_qkv.weight.qs", "blk.0.attn_qkv.weight.d", "x", "qkv")
    assert decode[0][2].bindings == ("qkv", "q", "k", "v", "positions", "cos_sin", "zero_bias")
    assert decode[0][7].bindings[2:] == ("x", "act") and decode[0][8].bindings[2:] == ("act", "x")
    assert [d.shader for d in prefill[0][1:10]] == [
        "rmsnorm", "matmul_q4_1", "rope", "kv_write", "paged_prefill_attention_narrow", "matmul_q4_1", "rmsnorm",
        "matmul_q4_1", "matmul_q4_1"]
    assert prefill[0][1].bindings == ("x", "blk.0.attn_norm.weight", "h") and prefill[0][2].bindings[2:] == ("h", "qkv")
    assert prefill[0][8].constants == (("WORKGROUP_SIZE", 32), ("SWIGLU", 1))
    assert decode[1][1].shader == "matvec_q8_0" and decode[1][1].bindings[:2] == ("token_embd.weight.qs",
                                                                                 "token_embd.weight.d")
    attn = [d for d in prefill[0] if d.shader == "paged_prefill_attention_narrow"]
    assert attn[1].bindings[1] == "k1" and attn[1].constants is None


def test_a_long_prefill_walks_its_keys_in_passes_of_512():
    """The cpu family's prefill attention takes one dispatch per 512 keys of the longest context (32 blocks of
    16), the gpu family's one per 1,024 (32 tiles of 32 keys at head_dim 32), the passes after the first resuming
    from the states they keep in act; decode takes one."""
    b = fake_backend()
    kv = b.kv_kernels
    assert kv.prefill.pass_keys == 512 and dict(kv.prefill.constants)["PASS_KEYS"] == 512
    assert [kv.prefill_passes(np.array([5, n])) for n in (512, 513, 1024, 1783)] == [1, 2, 2, 4]
    assert PlanKey.of(2, 2, prefill_passes=4) == PlanKey.of(2, 2)  # decode: no prefill passes
    attn = [d for d in layer_program(b, PlanKey.of(24, 3, prefill_passes=3))[0] if d.slot == "attn"]
    first, resume = "paged_prefill_attention_narrow", "paged_prefill_attention_narrow_resume"  # heads of 32
    assert [d.shader for d in attn] == ([first] + [resume] * 2) * 2  # two layers
    assert {d.bindings[8] for d in attn} == {"act"} and {d.bindings[7] for d in attn} == {"attn"}
    gpu = fake_backend("gpu")
    assert gpu.kv_kernels.prefill.pass_keys == 1024 and dict(gpu.kv_kernels.prefill.constants)["PASS_TILES"] == 32
    assert [gpu.kv_kernels.prefill_passes(np.array([5, n])) for n in (1024, 1025, 1783, 4096)] == [1, 2, 2, 4]
    attn = [d for d in layer_program(gpu, PlanKey.of(24, 3, prefill_passes=2))[0] if d.slot == "attn"]
    assert [d.shader for d in attn] == ["paged_prefill_attention_gpu", "paged_prefill_attention_gpu_resume"] * 2
    assert {d.bindings[8] for d in attn} == {"act"}


def test_a_shaped_draw_shapes_the_logits_then_draws_then_counts():
    b = fake_backend("gpu", subgroups=True)
    plain = layer_program(b, PlanKey.of(2, 2, sampled=True))[-1]
    assert [(d.shader, d.bindings) for d in plain[2:]] == [("sample", ("logits", "sampling", "ids"))]
    assert PlanKey.of(2, 2, shaped=True) == PlanKey.of(2, 2)  # shaping is a sampled step's
    shaped = layer_program(b, PlanKey.of(2, 2, sampled=True, shaped=True))[-1]
    assert [(d.shader, d.bindings, d.slot) for d in shaped[2:]] == [
        ("sample_shape", ("logits", "sampling", "sample_rows", "sample_bias", "token_counts", "shaped_logits", "ids"),
         "sample_shape"),
        ("sample", ("shaped_logits", "sampling", "ids"), "sample"),  # the raw logits stay for the log-probs
        ("sample_post", ("logits", "sample_rows", "ids", "token_counts"), "sample_post")]
    grids, params = step_slots(b, StepShape(3, 3, 1, 1, 1, True))
    words = params.view(np.uint32).reshape(-1, PARAM_SLOT_BYTES // 4)
    assert grids[SLOT_INDEX["sample_shape"]].tolist() == [3, 1, 1] and grids[SLOT_INDEX["sample_post"]].tolist() == [1, 1, 1]
    assert words[SLOT_INDEX["sample_shape"], :3].tolist() == [CFG.vocab, 3, 4]  # log-prob rows after 4 rows' ids


def test_step_slots_grids_and_uniforms():
    b = fake_backend()
    grids, params = step_slots(b, StepShape(num_tokens=3, num_seqs=3, table_width=9, max_parts=2, num_tiles=3,
                                            decode=True))
    assert params.shape == (len(SLOT_INDEX) * PARAM_SLOT_BYTES,)
    assert grids[SLOT_INDEX["embedding"]].tolist() == [1, 3, 1]  # 64 / 4 values per thread -> 1 group
    attn = params[SLOT_INDEX["attn"] * PARAM_SLOT_BYTES:][:32].view(np.uint32)
    assert attn[:7].tolist() == [3, 4, 2, 16, 9, 8, 2]  # seqs, heads, kv heads, block, width, partition, parts
    assert attn[7].view(np.float32) == np.float32(0.25)
    assert grids[SLOT_INDEX["reduce"]].tolist() == [3, 1, 1]  # 3 seqs x 4 heads x 16 / 4 = 48 -> 3 groups of 16
    single, single_params = step_slots(b, StepShape(1, 1, 1, 1, 1, True))
    assert single[SLOT_INDEX["reduce"]].tolist() == [0, 0, 0]  # one partition: no reduce dispatch
    assert single[SLOT_INDEX["lin_qkv"]].tolist() == [1, 1, 1]  # (64 + 2 * 32) rows / 8 per thread = 16 threads
    qkv = single_params[SLOT_INDEX["lin_qkv"] * PARAM_SLOT_BYTES:][:16]
    assert qkv[:12].view(np.uint32).tolist() == [128, 64, 1] and qkv[12:].view(np.float32)[0] == np.float32(1e-5)
    assert single[SLOT_INDEX["lin_ffn"]].tolist() == [1, 1, 1]  # 2 * 128 gate|up rows


def test_gpu_family_plan_swaps_the_linears_argmax_and_attention():
    b = fake_backend("gpu", subgroups=True)
    decode = layer_program(b, PlanKey.of(1, 1))
    # the gpu family's fused decode layers: 4 dispatches for layer 0 (its FFN one: ffn_gpu_main.wgsl), 5 for the
    # last, whose down adds into x itself (the LM head reads a whole x)
    assert len(decode[0]) == 1 + 4 + 5
    layer = [(d.shader, d.constants) for d in decode[0][1:10]]
    rope_kv = (("HEAD_DIM", 16), ("Q_ROWS", 64), ("KV_ROWS", 32), ("KV_OUT", 1),
               ("BLOCK_TOKENS", 16), ("HEAD_MAJOR", 1))
    assert layer == [
        ("matvec_gpu_sg_q4_1_rope_kv", (("WORKGROUP_SIZE", 64), ("NORM", 1), *rope_kv)),  # bias, RoPE, KV write
        ("paged_attention_gpu_sg", None),
        ("matvec_gpu_sg_q4_1_merge", (("WORKGROUP_SIZE", 64), ("ACCUMULATE", 1), ("HEAD_DIM", 16))),  # the merge
        # ffn 128: 4 blocks of down's rows, one a workgroup (SLICE_VEC4 8), 4 partials
        ("ffn_gpu_sg_q4_1_q4_1", (("WORKGROUP_SIZE", 256), ("NORM", 1), ("ROW_GROUPS", 4), ("SLICE_VEC4", 8))),
        # layer 1 reads x + layer 0's 4 partials, and its output projection adds them into x
        ("matvec_gpu_sg_q4_1_rope_kv", (("WORKGROUP_SIZE", 64), ("NORM", 1), *rope_kv, ("SPLIT_PARTS", 4))),
        ("paged_attention_gpu_sg", None),
        ("matvec_gpu_sg_q4_1_merge", (("WORKGROUP_SIZE", 64), ("ACCUMULATE", 1), ("HEAD_DIM", 16),
                                      ("SPLIT_PARTS", 4))),
        ("matvec_gpu_sg_q4_1", (("WORKGROUP_SIZE", 64), ("NORM", 1), ("SWIGLU", 1))),
        ("matvec_gpu_sg_q4_1", (("WORKGROUP_SIZE", 64), ("ACCUMULATE", 1)))]
    qkv, _, o, ffn = decode[0][1:5]
    assert qkv.bindings[2:] == ("x", "q") and qkv.extra == (
        (8, "positions"), (9, "cos_sin"), (10, "zero_bias"), (11, "slot_mapping"), (12, "k0"), (13, "v0"))
    assert o.bindings[2:] == ("attn", "x") and o.extra == (
        (8, "context_lens"), (9, "part_acc"), (10, "part_stats"),
        (11, ("params", SLOT_INDEX["reduce"] * PARAM_SLOT_BYTES, PARAM_SLOT_BYTES)))  # the reduce slot's words
    # gate | up's parts, x's buffer as its y (x's rows, then the partials; binding 2 unused), the uniform at 4;
    # down's parts at 16, 17 (the down_ decoder instance)
    assert (ffn.bindings, ffn.uniform_at, ffn.extra, ffn.slot) == (
        {0: "blk.0.ffn_gate_up.weight.qs", 1: "blk.0.ffn_gate_up.weight.d", 3: "x"}, 4,
        ((16, "blk.0.ffn_down.weight.qs"), (17, "blk.0.ffn_down.weight.d")), "ffn")
    ffn_grids, ffn_params = step_slots(b, StepShape(2, 2, 1, 1, 1, True))
    assert ffn_grids[SLOT_INDEX["ffn"]].tolist() == [4, 2, 1]  # (partials, tokens)
    ffn_words = ffn_params[SLOT_INDEX["ffn"] * PARAM_SLOT_BYTES:][:16]  # lin_ffn's: gate | up's rows, cols, tokens
    assert ffn_words[:12].view(np.uint32).tolist() == [256, 64, 2] and ffn_words[12:].view(np.float32)[0] == 1e-5
    assert not any(d.shader.startswith("ffn") for d in layer_program(b, PlanKey.of(2, 1))[0])  # decode only
    assert [d.shader for d in decode[1]] == ["rmsnorm", "matvec_gpu_sg_q8_0", "argmax_gpu"]  # logits come back
    # a greedy step: the LM head runs the final norm (its gain bound at 8, eps in its uniform) and leaves each
    # workgroup's best row for argmax_gpu; no rms_s dispatch
    head, pick = layer_program(b, PlanKey.of(1, 1, greedy=True))[1]
    assert (head.shader, head.constants, head.bindings[2:], head.extra, head.slot) == (
        "matvec_gpu_sg_q8_0_argmax", (("WORKGROUP_SIZE", 64), ("NORM", 1)), ("last", "logits"),
        ((8, "output_norm.weight"),), "lm_head")
    assert pick.shader == "argmax_gpu"
    lm_words = step_slots(b, StepShape(1, 1, 1, 1, 1, True))[1][SLOT_INDEX["lm_head"] * PARAM_SLOT_BYTES:][:16]
    assert lm_words[:12].view(np.uint32).tolist() == [512, 64, 1]  # rows, cols, tokens
    assert lm_words[12:].view(np.float32)[0] == np.float32(1e-5)  # the norm's eps
    int8 = fake_backend("gpu", subgroups=True, kv_dtype="int8")  # quantized KV: rows to kv_write_quant
    qkv, write = layer_program(int8, PlanKey.of(1, 1))[0][1:3]
    assert dict(qkv.constants)["KV_OUT"] == 2 and qkv.extra[4:] == ((12, "k"), (13, "v"))
    assert (write.shader, write.bindings) == ("kv_write", ("k", "v", "slot_mapping", "k0", "v0"))
    assert len(layer_program(int8, PlanKey.of(1, 1))[0]) == 1 + 5 + 6  # layer 0's FFN in one dispatch
    prefill = layer_program(fake_backend("gpu"), PlanKey.of(24, 3))
    assert [(d.shader, d.constants) for d in prefill[0][1:10]] == [
        ("rmsnorm", (("WORKGROUP_SIZE", 64),)), ("matmul_gpu_q4_1", (("WORKGROUP_SIZE", 64), ("ROW_GROUPS", 8))),
        ("rope", (("WORKGROUP_SIZE", 64),)), ("kv_write", None), ("paged_prefill_attention_gpu", None),
        ("matmul_gpu_q4_1", (("WORKGROUP_SIZE", 64), ("ACCUMULATE", 1), ("ROW_GROUPS", 8))),
        ("rmsnorm", (("WORKGROUP_SIZE", 64),)),
        ("matmul_gpu_q4_1", (("WORKGROUP_SIZE", 64), ("SWIGLU", 1), ("ROW_GROUPS", 8))),
        ("matmul_gpu_q4_1", (("WORKGROUP_SIZE", 64), ("ACCUMULATE", 1), ("ROW_GROUPS", 8)))]
    assert [d.shader for d in prefill[1]] == ["rmsnorm", "matmul_gpu_q8_0", "argmax_gpu"]  # 3 sequences
    wide = step_slots(b, StepShape(40, 3, 1, 1, 1, False))[0]  # tiles of 64 rows x 32 tokens
    assert wide[SLOT_INDEX["lin_qkv"]].tolist() == [2, 2, 1] and wide[SLOT_INDEX["lin_ffn"]].tolist() == [4, 2, 1]
    f16 = layer_program(fake_backend("gpu", subgroups=False, shader_f16=True), PlanKey.of(1, 1))
    assert [d.shader for d in f16[0][1:5:2]] + [f16[0][4].shader, f16[0][8].shader, f16[1][1].shader] == [
        "matvec_gpu_f16_q4_1_rope_kv", "matvec_gpu_f16_q4_1_merge",  # where the device has shader-f16
        "ffn_gpu_f16_q4_1_q4_1", "matvec_gpu_f16_q4_1", "matvec_gpu_f16_q8_0"]
    grids, _ = step_slots(b, StepShape(1, 1, 1, 1, 1, True))
    assert grids[SLOT_INDEX["lin_qkv"]].tolist() == [16, 1, 1]  # one workgroup per 8 of the 128 rows
    # q | k | v inside the attention (paged_attention_gpu_fold.wgsl): 3 dispatches for layer 0, 4 for the last
    folded = layer_program(fake_backend("gpu", subgroups=True, fold=True), PlanKey.of(1, 1))[0]
    assert [(d.shader, d.slot) for d in folded] == [
        ("embedding", "embedding"), ("paged_attention_gpu_sg_fold_q4_1", "attn"), ("matvec_gpu_sg_q4_1_merge", "lin_h"),
        ("ffn_gpu_sg_q4_1_q4_1", "ffn"), ("paged_attention_gpu_sg_fold_q4_1", "attn"),
        ("matvec_gpu_sg_q4_1_merge", "lin_h"), ("matvec_gpu_sg_q4_1", "lin_ffn"), ("matvec_gpu_sg_q4_1", "lin_down")]
    fold0, merge0, _, fold1 = folded[1:5]
    # the cache (read_write in this kernel), tables, context lengths (then the positions), the partition states,
    # the rotary table; q | k | v's parts at 16, 17 and x at 18 (the qkv_ instance), its uniform the lin_qkv slot
    assert (fold0.bindings, fold0.uniform_at, fold0.extra, fold0.entry) == (
        {1: "k0", 2: "v0", 3: "block_tables", 4: "context_lens", 7: "part_acc", 8: "part_stats", 9: "cos_sin",
         16: "blk.0.attn_qkv.weight.qs", 17: "blk.0.attn_qkv.weight.d", 18: "x"}, 5,
        ((20, ("params", SLOT_INDEX["lin_qkv"] * PARAM_SLOT_BYTES, PARAM_SLOT_BYTES)),), "main_fold")
    assert dict(fold0.constants) == {"HEAD_DIM": 16, "KV_FORMAT": 1, "HEAD_MAJOR": 1, "KV_GROUP": 16, "SLOTS": 2,
                                     "WORKGROUP_SIZE": 128, "FOLD": 1, "NEW_KV_VEC4": 8, "X_VEC4": 16,
                                     "qkv_WORKGROUP_SIZE": 128, "qkv_ROW_GROUPS": 8, "qkv_NORM": 1}
    assert dict(fold1.constants)["SPLIT_PARTS"] == 4 and dict(merge0.constants)["STATES_ONLY"] == 1
    # a step whose attention mass is scored from the last layer's queries: that layer writes them to scratch q
    mass = layer_program(fake_backend("gpu", subgroups=True, fold=True), PlanKey.of(1, 1, mass=True))[0]
    assert [d.shader for d in mass[1:7]] == [
        "paged_attention_gpu_sg_fold_q4_1", "matvec_gpu_sg_q4_1_merge", "ffn_gpu_sg_q4_1_q4_1",
        "matvec_gpu_sg_q4_1_rope_kv", "paged_attention_gpu_sg", "matvec_gpu_sg_q4_1_merge"]
    assert "STATES_ONLY" not in dict(mass[6].constants)
    # quantized KV keeps the q | k | v matvec (kv_write_quant needs whole rows' scales); so does a step that is no
    # decode, and a device whose workgroup memory is too small for the fold's
    int8 = fake_backend("gpu", subgroups=True, kv_dtype="int8", fold=True)
    assert layer_program(int8, PlanKey.of(1, 1))[0][1].shader == "matvec_gpu_sg_q4_1_rope_kv"
    small = fake_backend("gpu", subgroups=True, fold=True)
    small.workgroup_storage = 8192
    assert layer_program(small, PlanKey.of(1, 1))[0][1].shader == "matvec_gpu_sg_q4_1_rope_kv"
    # decode attention: a workgroup per (sequence, partition, kv head's 2 query heads); 3 partitions: merged
    # by a workgroup per (sequence, head)
    pair, _ = step_slots(b, StepShape(2, 2, 3, 3, 2, True))
    assert (pair[SLOT_INDEX["attn"]].tolist(), pair[SLOT_INDEX["reduce"]].tolist()) == ([12, 1, 1], [8, 1, 1])
    # prefill attention: a workgroup per (tile of 8 new tokens, kv head's 2 query heads): 5 tiles x 2
    assert step_slots(b, StepShape(24, 3, 2, 1, 5, False))[0][SLOT_INDEX["attn"]].tolist() == [10, 1, 1]
    assert grids[SLOT_INDEX["lin_ffn"]].tolist() == [32, 1, 1] and grids[SLOT_INDEX["lm_head"]].tolist() == [64, 1, 1]
    assert step_slots(b, StepShape(3, 3, 1, 1, 1, True))[0][SLOT_INDEX["lin_h"]].tolist() == [1, 1, 1]  # matmul


def test_members_without_a_common_type_run_one_by_one_into_the_stacked_layouts():
    """A layer uploaded unstacked (fused.stacks): the norm, then q / k / v into their columns of the stacked
    (T, 64 + 32 + 32) qkv and gate / up into act (SILU_MUL: silu(gate) * up); the other layer keeps its stacks."""
    b = fake_backend()
    for leaf in ("attn_qkv", "ffn_gate_up"):
        del b.weights[f"blk.0.{leaf}.weight"]
    for leaf in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
        b.weights[f"blk.0.{leaf}.weight"] = ("q4_1", (f"{leaf}.qs", f"{leaf}.d"))
    decode = layer_program(b, PlanKey.of(1, 1))[0]
    assert len(decode) == 1 + 13 + 8
    rms = ("rmsnorm", (("WORKGROUP_SIZE", 64),))

    def lin(leaf: str, y: str, slot: str, *constants) -> tuple:
        return "matvec_q4_1", (("WORKGROUP_SIZE", 32), *constants), (f"{leaf}.qs", f"{leaf}.d", "h", y), slot

    assert [(d.shader, d.constants, d.bindings, d.slot) for d in decode[1:5] + decode[10:14]] == [
        (*rms, ("x", "blk.0.attn_norm.weight", "h"), "rms_t"),
        lin("attn_q", "qkv", "lin_q", ("Y_STRIDE", 128), ("Y_OFFSET", 0)),
        lin("attn_k", "qkv", "lin_kv", ("Y_STRIDE", 128), ("Y_OFFSET", 64)),
        lin("attn_v", "qkv", "lin_kv", ("Y_STRIDE", 128), ("Y_OFFSET", 96)),
        (*rms, ("x", "blk.0.ffn_norm.weight", "h"), "rms_t"),
        lin("ffn_gate", "act", "lin_gate"), lin("ffn_up", "act", "lin_gate", ("SILU_MUL", 1)),
        ("matvec_q4_1", (("WORKGROUP_SIZE", 32), ("ACCUMULATE", 1)), ("blk.0.ffn_down.weight.qs",
                                                                     "blk.0.ffn_down.weight.d", "act", "x"), "lin_down")]
    assert [d.shader for d in decode[5:10]] == ["rope", "kv_write", "paged_attention_narrow", "paged_attention_reduce",
                                                "matvec_q4_1"]
    assert decode[14].slot == "lin_qkv" and decode[20].slot == "lin_ffn"  # layer 1: stacked, norms fused
    _, params = step_slots(b, StepShape(1, 1, 1, 1, 1, True))
    rows = [params[SLOT_INDEX[s] * PARAM_SLOT_BYTES:][:12].view(np.uint32).tolist()
            for s in ("lin_q", "lin_kv", "lin_gate")]
    assert rows == [[64, 64, 1], [32, 64, 1], [128, 64, 1]]  # (rows, cols, tokens) of q, of k and v, of gate and up


def test_a_projection_with_its_own_tuned_matvec_threads_gets_them():
    """GpuShapes.matvec_slots (first-boot tuning per projection): the LM head and the output projection take
    their own workgroup sizes, the others the gate|up choice."""
    b = fake_backend("gpu", subgroups=True)
    b.gpu_shapes = replace(b.gpu_shapes, matvec=128, matvec_slots=(("lin_h", 256, 1), ("lm_head", 64, 4)))
    decode = layer_program(b, PlanKey.of(1, 1))
    sizes = {d.slot: dict(d.constants)["WORKGROUP_SIZE"] for p in decode for d in p if d.slot.startswith("l")}
    assert sizes == {"lin_qkv": 128, "lin_h": 256, "lin_ffn": 128, "lin_down": 128, "lm_head": 64}
    groups = {d.slot: dict(d.constants).get("ROW_GROUPS", 1) for p in decode for d in p if d.slot.startswith("l")}
    assert groups == {"lin_qkv": 1, "lin_h": 1, "lin_ffn": 1, "lin_down": 1, "lm_head": 4}
    # the LM head's grid: 4 groups of 8 rows a workgroup
    grids, _ = step_slots(b, StepShape(1, 1, 4, 1, 0, True))
    assert tuple(grids[SLOT_INDEX["lm_head"]]) == (-(-b.config.vocab // 32), 1, 1)
    # a projection tuned to take whole blocks (GpuShapes.matvec_whole) gets WHOLE_BLOCKS, the others not
    b.gpu_shapes = replace(b.gpu_shapes, matvec_whole=("lin_ffn",))
    decode = layer_program(b, PlanKey.of(1, 1))
    whole = {d.slot for p in decode for d in p if dict(d.constants or ()).get("WHOLE_BLOCKS")}
    assert whole == {"lin_ffn", "ffn"}  # the fused FFN's gate | up: lin_ffn's rows, K and 64 lanes a group


def test_whole_blocks_apply_where_they_add_no_trip_along_k():
    # blocks of 4 words: 64 lanes over K = 2,048 (64 blocks) take one block each, as striding by words makes
    # 4 trips; at K = 576 (18 blocks) one block a lane is 4 words where words take 2 trips (72 over 64 lanes)
    assert ops.whole_blocks_apply(2048, 64) and ops.whole_blocks_apply(8192, 64) and ops.whole_blocks_apply(1536, 16)
    assert not ops.whole_blocks_apply(576, 64) and not ops.whole_blocks_apply(576, 16)
    assert ops.whole_blocks_apply(4000, 64, words_per_block=8) and not ops.whole_blocks_apply(576, 8)
