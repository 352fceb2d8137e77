"""pagedkv.backends.webgpu.dispatch_geometry: one SmolLM2 decode step's dispatches, from the plan's call builders (CPython)."""
from __future__ import annotations

import json

import pytest

from pagedkv.backends.webgpu import dispatch_geometry as geo


def _linear(rows: list[dict]) -> list[tuple]:
    return [(r["kernel"], r["slot"], r["invocations"]) for r in rows if r["kernel"].startswith(("matvec", "matmul"))]


def test_gpu_family_fills_every_matvec_with_at_least_1024_invocations_at_context_512():
    for subgroups in (True, False):
        rows = geo.decode_step("gpu", 512, subgroups, fold=False)  # q | k | v its own matvec (the fold: below)
        linear = _linear(rows)
        # q|k|v, o per layer; gate|up, down of the last layer (the others' FFN is one dispatch); the LM head
        assert len(linear) == 30 * 2 + 2 + 1
        assert min(n for _, _, n in linear) >= 1024
        shader = "matvec_gpu_sg_q4_1" if subgroups else "matvec_gpu_q4_1"
        assert linear[:2] == [(shader + "_rope_kv", "lin_qkv", 120 * 64), (shader + "_merge", "lin_h", 72 * 64)]
        assert linear[-3:-1] == [(shader, "lin_ffn", 384 * 64), (shader, "lin_down", 72 * 64)]
        ffn = [r for r in rows if r["slot"] == "ffn"]  # 48 blocks of down's rows, 2 a workgroup: 24 partials
        assert len(ffn) == 29 and ffn[0] == {"kernel": shader.replace("matvec", "ffn") + "_q4_1", "slot": "ffn",
                                             "workgroup_size": 256, "workgroups": [24, 1, 1], "invocations": 6144}
        # a greedy step: the LM head leaves each workgroup's best row (matvec_io_argmax.wgsl), the final norm
        # fused (no rms_s dispatch)
        assert linear[-1] == (shader.replace("q4_1", "q8_0") + "_argmax", "lm_head", 6144 * 64)
        assert "rms_s" not in {r["slot"] for r in rows}
        assert rows[-1] == {"kernel": "argmax_gpu", "slot": "argmax", "workgroup_size": 256,
                            "workgroups": [1, 1, 1], "invocations": 256}


def test_gpu_family_matmuls_launch_at_least_1024_invocations_for_a_512_token_prefill_chunk():
    rows = geo.prefill_step("gpu", 512)
    linear = _linear(rows)
    assert len(linear) == 30 * 4 + 1
    assert min(n for _, _, n in linear) >= 1024
    # tiles of 64 rows x 32 tokens: 16 token tiles, rows / 64 row tiles
    assert linear[:4] == [("matmul_gpu_q4_1", "lin_qkv", 15 * 16 * 64), ("matmul_gpu_q4_1", "lin_h", 9 * 16 * 64),
                          ("matmul_gpu_q4_1", "lin_ffn", 48 * 16 * 64), ("matmul_gpu_q4_1", "lin_down", 9 * 16 * 64)]
    assert linear[-1] == ("matvec_gpu_sg_q8_0_argmax", "lm_head", 6144 * 64)  # one sequence: its last token's winners
    assert [r["workgroups"] for r in rows if r["slot"] == "lin_ffn"][0] == [48, 16, 1]
    assert _linear(geo.prefill_step("cpu", 512))[0] == ("matmul_q4_1", "lin_qkv", 4 * 128 * 32)


def test_cpu_family_rows_are_the_issues_counts():
    rows = geo.decode_step("cpu", 512)
    assert len(rows) == 1 + 30 * 8 + 3  # embedding, 8 per layer (the reduce too: 4 partitions at 512), head
    assert _linear(rows)[:4] == [("matvec_q4_1", "lin_qkv", 128), ("matvec_q4_1", "lin_h", 96),
                                 ("matvec_q4_1", "lin_ffn", 384), ("matvec_q4_1", "lin_down", 96)]
    attn = [r for r in rows if r["kernel"] == "paged_attention_narrow"]  # SmolLM2's 64-wide heads
    assert attn[0]["workgroups"] == [1, 1, 1] and attn[0]["invocations"] == 16  # 12 live threads at 512
    assert "paged_attention_reduce" not in {r["kernel"] for r in geo.decode_step("cpu", 100)}  # one partition


def test_gpu_family_fills_every_decode_attention_dispatch_at_context_512():
    for subgroups, shader in ((True, "paged_attention_gpu_sg_fold_q4_1"), (False, "paged_attention_gpu_fold_q4_1")):
        rows = [r for r in geo.decode_step("gpu", 512, subgroups) if r["slot"] in ("attn", "reduce")]
        assert len(rows) == 30  # pass 1 only: the output projection merges the partitions in its prologue
        # aiming at 96 workgroups (GpuShapes.split): 8 partitions of the 64-token minimum x 3 kv heads (3 query
        # heads each), workgroups of 128
        assert rows[0] == {"kernel": shader, "slot": "attn", "workgroup_size": 128, "workgroups": [24, 1, 1],
                           "invocations": 3072}
        assert min(r["invocations"] for r in rows) >= 1024
    at_4096 = [r["invocations"] for r in geo.decode_step("gpu", 4096) if r["slot"] == "attn"]
    assert at_4096[0] == 32 * 3 * 128  # 32 partitions of 128 tokens
    at_8192 = [r["invocations"] for r in geo.decode_step("gpu", 8192) if r["slot"] == "attn"]
    assert at_8192[0] == 32 * 3 * 128  # 32 partitions of 256 tokens: longer, not more
    assert "paged_attention_reduce_gpu" not in {r["kernel"] for r in geo.decode_step("gpu", 4096)}  # merged in o


def test_gpu_family_decode_step_is_at_most_160_dispatches_at_context_1024():
    """Issue 30: <= 160 dispatches for SmolLM2 at context 1,024 with f16 KV and no hot dispatch under 1,024
    invocations: embedding, 5 a layer (q | k | v + RoPE + KV write, attention, o + merge, gate | up, down),
    the LM head with the final norm fused (issue 50) and argmax. Quantized KV keeps kv_write_quant (6 a layer);
    the cpu family, whose kernels are shaped for the emulators, keeps its 8 and the final norm's dispatch."""
    # f16 / f32: q | k | v inside the attention (30 fewer); quantized KV keeps its q | k | v matvec and kv_write_quant
    for kv_dtype, count in (("f16", 1 + 30 * 5 + 2 - 29 - 30), ("f32", 94), ("int8", 1 + 30 * 6 + 2 - 29),
                            ("int4-asym", 154)):
        for subgroups in (True, False):
            t = geo.totals(geo.decode_step("gpu", 1024, subgroups, kv_dtype=kv_dtype))
            assert t == {"count": count, "min_hot_invocations": 4608}, (kv_dtype, subgroups)  # o, down
    assert geo.totals(geo.decode_step("cpu", 1024))["count"] == 1 + 30 * 8 + 3


def test_issue_50_dispatch_counts_at_context_1024(capsys):
    """Issue 50's goal: at most 100 dispatches a SmolLM2 decode step at context 1,024 and at most 80 for the 1.5B
    preset (154 / 124 before it). The exact counts, so a change that adds a dispatch fails here: 1 embedding,
    per layer the attention with q|k|v + RoPE + KV write inside (paged_attention_gpu_fold.wgsl), o + merge + the
    previous FFN's partials, then the FFN in one dispatch (the last layer: gate|up and down, since the LM head
    reads a whole x), the LM head, argmax. --no-fold (WebGpuBackend.fold_qkv = False): q|k|v its own matvec,
    124 / 100."""
    for model, layers, count in (("smollm2-135m-instruct", 30, 94), ("synthetic-1.5b", 24, 76)):
        for subgroups in (True, False):
            rows = geo.decode_step("gpu", 1024, subgroups, model=model)
            assert geo.totals(rows)["count"] == count == 1 + (layers - 1) * 3 + 4 + 2, (model, subgroups)
            attn = [r["kernel"] for r in rows if r["slot"] == "attn"]
            dtype = "q4_1" if layers == 30 else "q4_K"
            assert attn == [f"paged_attention_gpu{'_sg' if subgroups else ''}_fold_{dtype}"] * layers
            assert geo.totals(geo.decode_step("gpu", 1024, subgroups, model=model, fold=False))["count"] == count + layers
    assert geo.main(["--json", "--kernels", "gpu", "--context", "1024", "--model", "synthetic-1.5b"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["count"], sum(r["slot"] == "ffn" for r in out["dispatches"])) == (76, 23)
    assert geo.main(["--json", "--kernels", "gpu", "--context", "1024", "--no-fold"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 124


def test_cli_prints_json(capsys):
    assert geo.main(["--json", "--kernels", "cpu", "--context", "512"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["kernels"], out["context"], len(out["dispatches"])) == ("cpu", 512, 244)
    assert (out["count"], out["min_hot_invocations"], out["kv_dtype"]) == (244, 16, "f16")  # cpu attention
    with pytest.raises(ValueError, match="context must be 1..8192, got 0"):
        geo.decode_step("gpu", 0)
    assert geo.main(["--json", "--kernels", "gpu", "--prefill", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["kernels"], out["prefill"], out["dispatches"][2]["kernel"]) == ("gpu", 64, "matmul_gpu_q4_1")


def test_synthetic_1_5b_preset_decode_step_counts_its_24_layers_in_q4_K():
    """--model synthetic-1.5b: the device runs' larger model (hidden 2,048, 24 layers, 32 query / 8 KV heads, Q4_K
    everywhere) through the same plan: embedding, 5 a layer, the LM head (the final norm fused) and argmax."""
    rows = geo.decode_step("gpu", 1024, model="synthetic-1.5b", fold=False)
    # 5 a layer but 4 where the FFN is one dispatch (all layers but the last)
    assert geo.totals(rows) == {"count": 1 + 24 * 5 + 2 - 23, "min_hot_invocations": 32 * 256}  # the FFN
    assert _linear(rows)[:2] == [("matvec_gpu_sg_q4_K_rope_kv", "lin_qkv", 384 * 64),
                                 ("matvec_gpu_sg_q4_K_merge", "lin_h", 256 * 64)]
    assert rows[4] == {"kernel": "ffn_gpu_sg_q4_K_q4_K", "slot": "ffn", "workgroup_size": 256,
                       "workgroups": [32, 1, 1], "invocations": 32 * 256}  # 256 blocks, 8 a workgroup
    assert rows[0]["kernel"] == "embedding_q4_K"
    with pytest.raises(ValueError, match="model must be one of"):
        geo.decode_step("gpu", 1024, model="smollm2-1.7b")
