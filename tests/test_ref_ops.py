"""CPython tests of the kernels' numpy references and the host-side dispatch geometry (no browser)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.kernels import ref_ops as ref
from pagedkv.kernels.ref_ops import rope_adjacent, rope_inv_freq
from pagedkv.model.layout import dequantize, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0

# The single-call runners run in the page (tests/browser); their input checks run here, before any GPU use.
_spec = importlib.util.spec_from_file_location("kernel_calls", Path(__file__).with_name("browser") / "kernel_calls.py")
calls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calls)


def q4_1_parts(w):
    return pack_q4_1(*quantize_q4_1(w))


def test_quantized_linear_is_x_times_dequantized_weight_transposed():
    codes = np.arange(64, dtype=np.uint8).reshape(2, 32) % 16  # (2, 32)
    d = np.array([[0.5], [2.0]], np.float16)
    m = np.array([[-1.0], [0.25]], np.float16)
    parts = pack_q4_1(codes, d, m)
    x = np.zeros((3, 32), np.float32)
    x[0, 0] = 1.0  # picks weight 0 of each row
    x[1, 5] = 2.0  # 2 * weight 5
    x[2] = 1.0  # row sums
    y = ref.quantized_linear(x, "q4_1", (2, 32), parts)
    w = codes.astype(np.float32) * d.astype(np.float32) + m.astype(np.float32)  # (2, 32)
    assert y.shape == (3, 2)
    np.testing.assert_array_equal(y[0], [-1.0, 0.25])
    np.testing.assert_array_equal(y[1], [2 * (5 * 0.5 - 1.0), 2 * (5 * 2.0 + 0.25)])
    np.testing.assert_allclose(y[2], w.sum(axis=1), rtol=1e-6)


def test_quantized_linear_rejects_bad_shapes():
    parts = q4_1_parts(np.zeros((4, 32), np.float32))
    with pytest.raises(ValueError, match="tokens, 32"):
        ref.quantized_linear(np.zeros((1, 31), np.float32), "q4_1", (4, 32), parts)
    with pytest.raises(ValueError, match="quantized kernels take"):
        ref.quantized_linear(np.zeros((1, 32), np.float32), "f32", (4, 32), parts)


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0"])
def test_row_parts_and_embedding_select_rows_in_order(dtype):
    w = np.random.default_rng(0).standard_normal((10, 64), dtype=np.float32)
    parts = q4_1_parts(w) if dtype == "q4_1" else pack_q8_0(*quantize_q8_0(w))
    full = dequantize(dtype, (10, 64), parts)  # (10, 64)
    ids = np.array([9, 0, 3, 3], np.int32)
    np.testing.assert_array_equal(ref.embedding(ids, dtype, (10, 64), parts), full[ids])
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        ref.row_parts(dtype, (10, 64), parts, np.array([10]))


def test_rope_table_reproduces_rope_adjacent_exactly():
    head_dim, base = 8, 100000.0
    table = ref.rope_cos_sin(head_dim, base, 300)  # (300, 4, 2)
    assert table.shape == (300, 4, 2) and table.dtype == np.float32
    np.testing.assert_array_equal(table[0], np.tile([1.0, 0.0], (4, 1)))
    positions = np.array([299, 0, 17], np.int32)
    x = np.random.default_rng(1).standard_normal((3, 2, head_dim), dtype=np.float32)  # (T, heads, head_dim)
    # Rotating with the table (what rope.wgsl does) equals the reference rotation bit for bit.
    cs = table[positions][:, None]  # (T, 1, head_dim/2, 2)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    by_table = np.empty_like(x)
    by_table[..., 0::2] = x0 * cs[..., 0] - x1 * cs[..., 1]
    by_table[..., 1::2] = x0 * cs[..., 1] + x1 * cs[..., 0]
    np.testing.assert_array_equal(by_table, rope_adjacent(x, positions, rope_inv_freq(head_dim, base)))


def test_rope_rotates_q_and_k_flat_rows():
    q = np.zeros((1, 4), np.float32)
    q[0, 0] = 1.0  # head 0, pair 0 = (1, 0)
    k = np.zeros((1, 2), np.float32)
    k[0, 1] = 1.0  # pair (0, 1)
    q_out, k_out = ref.rope(q, k, np.array([1], np.int32), head_dim=2, base=10000.0)
    # head_dim 2: inv_freq = [1], so position 1 rotates by 1 radian.
    np.testing.assert_allclose(q_out, [[np.cos(1.0), np.sin(1.0), 0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(k_out, [[-np.sin(1.0), np.cos(1.0)]], rtol=1e-6)


def test_swiglu_and_argmax():
    gate = np.array([0.0, 1.0, -100.0], np.float32)
    up = np.array([5.0, 2.0, 3.0], np.float32)
    with np.errstate(over="ignore"):  # exp(100) -> inf is the point of the last element
        out = ref.swiglu(gate, up)
    np.testing.assert_allclose(out, [0.0, 2.0 / (1.0 + np.exp(-1.0)), 0.0], atol=1e-30)
    logits = np.array([[1.0, 3.0, 3.0, 2.0], [-1.0, -1.0, -1.0, -1.0]], np.float32)
    ids = ref.argmax(logits)
    assert ids.dtype == np.uint32 and ids.tolist() == [1, 0]
    with pytest.raises(ValueError, match="must have one shape"):
        ref.swiglu(gate, up[:2])


def test_call_geometry_and_uniforms():
    call = ops.matvec_call("q4_1", 1536, 576, 3)
    assert call.shader == "matvec_q4_1" and call.workgroups == (6, 3, 1)  # 1536 rows / 8 per thread / 32 per group
    assert np.frombuffer(call.params, "<u4").tolist() == [1536, 576, 3, 0]
    call = ops.matmul_call("q8_0", 37, 96, 5)
    assert call.shader == "matmul_q8_0" and call.workgroups == (1, 2, 1)
    call = ops.rmsnorm_call(576, 7, 1e-5)
    assert call.workgroups == (7, 1, 1)
    assert np.frombuffer(call.params[8:12], "<f4")[0] == np.float32(1e-5)
    assert ops.rope_call(7, 9, 3, 64).workgroups == (8, 7, 1)  # (9 + 2 * 3) * 32 pairs of q | k | v / 64
    fused = ops.matvec_call("q4_1", 3072, 576, 1, norm_eps=1e-5, swiglu=True)  # gate|up, norm and SwiGLU fused
    assert fused.constants == (("WORKGROUP_SIZE", 32), ("NORM", 1), ("SWIGLU", 1)) and fused.workgroups == (12, 1, 1)
    assert np.frombuffer(fused.params[:12], "<u4").tolist() == [3072, 576, 1]
    assert np.frombuffer(fused.params[12:], "<f4")[0] == np.float32(1e-5)
    assert ops.matmul_call("q8_0", 576, 1536, 9, accumulate=True).constants == (
        ("WORKGROUP_SIZE", 32), ("ACCUMULATE", 1))
    assert ops.embedding_call(6, 576).workgroups == (3, 6, 1)
    assert ops.argmax_call(49152, 4).workgroups == (4, 1, 1)
    assert ops.argmax_call(49152, 4, family="gpu").shader == "argmax_gpu"
    with pytest.raises(ValueError, match="power-of-two workgroup size, got 96"):
        ops.argmax_call(49152, 4, workgroup_size=96, family="gpu")
    assert ops.stream_read_call(2**20, workgroups=16).params[:8] == np.array([65536, 4096], "<u4").tobytes()
    with pytest.raises(ValueError, match="multiple of 65536"):
        ops.stream_read_call(2**20 + 16, workgroups=16)
    grid = ops.stream_read_grid_call(256 << 20)  # 1,024 workgroups of 256: 262,144 threads, 4 words a trip each
    assert grid.workgroups == (1024, 1, 1) and grid.params[:8] == np.array([(256 << 20) // 16, 262144], "<u4").tobytes()
    with pytest.raises(ValueError, match="multiple of 16777216"):
        ops.stream_read_grid_call(1 << 20)
    alu = ops.alu_peak_call(1000, workgroups=8)
    assert alu.shader == "alu_peak" and alu.workgroups == (8, 1, 1) and alu.params[:4] == np.array([1000], "<u4").tobytes()


def test_gpu_family_matvec_geometry():
    """One workgroup per 8 rows of one token, whatever the workgroup size; the shader names the reduction."""
    call = ops.matvec_gpu_call("q4_1", 3072, 576, 2, subgroups=True, norm_eps=1e-5, swiglu=True)
    assert call.shader == "matvec_gpu_sg_q4_1" and call.workgroups == (384, 2, 1)
    assert call.constants == (("WORKGROUP_SIZE", 64), ("NORM", 1), ("SWIGLU", 1))
    assert call.params == ops.matvec_call("q4_1", 3072, 576, 2, norm_eps=1e-5, swiglu=True).params
    tree = ops.matvec_gpu_call("q8_0", 49152, 576, 1, subgroups=False, workgroup_size=256)
    assert tree.shader == "matvec_gpu_q8_0" and tree.workgroups == (6144, 1, 1)
    assert ops.matvec_gpu_call("q4_1", 37, 96, 3, subgroups=False).workgroups == (5, 3, 1)
    with pytest.raises(ValueError, match=r"\(64, 128, 256\) threads, got 32"):
        ops.matvec_gpu_call("q4_1", 576, 576, 1, subgroups=True, workgroup_size=32)
    with pytest.raises(ValueError, match="SWIGLU needs rows a multiple of 8"):
        ops.matvec_gpu_call("q4_1", 36, 576, 1, subgroups=True, swiglu=True)


def test_auto_kernel_family_is_cpu_on_software_adapters_only():
    assert ops.choose_family("auto", "google / swiftshader / SwiftShader Device (Subzero)", False) == (
        "cpu", "auto: google / swiftshader / SwiftShader Device (Subzero) is a software adapter (swiftshader)")
    assert ops.choose_family("auto", "mesa / llvmpipe (LLVM 15.0.7, 256 bits)", False)[0] == "cpu"
    assert ops.choose_family("auto", "google / swiftshader", True)[1] == (
        "auto: google / swiftshader is a software adapter (isFallbackAdapter, swiftshader)")
    assert ops.choose_family("auto", "unknown adapter", True) == (
        "cpu", "auto: unknown adapter is a software adapter (isFallbackAdapter)")
    assert ops.choose_family("auto", "nvidia / ampere", False) == ("gpu", "auto: nvidia / ampere is a hardware adapter")
    assert ops.choose_family("gpu", "google / swiftshader", False) == ("gpu", "kernels=gpu was asked for")
    with pytest.raises(ValueError, match="auto, cpu or gpu, got 'fast'"):
        ops.choose_family("fast", "nvidia / ampere", False)


def test_linear_call_picks_matvec_for_one_or_two_tokens_else_matmul():
    assert [ops.linear_call("q4_1", 576, 576, t).shader for t in (1, 2, 3, 512)] == [
        "matvec_q4_1", "matvec_q4_1", "matmul_q4_1", "matmul_q4_1"]
    assert ops.linear_call("q8_0", 49152, 576, 4) == ops.matmul_call("q8_0", 49152, 576, 4)


def test_call_builders_reject_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.matvec_call("q4_1", 10, 100, 1)
    with pytest.raises(ValueError, match="tokens must be a positive int"):
        ops.matmul_call("q8_0", 10, 64, 0)
    with pytest.raises(ValueError, match="SWIGLU needs rows a multiple of 8"):
        ops.matmul_call("q4_1", 36, 64, 4, swiglu=True)
    with pytest.raises(ValueError, match="SWIGLU needs rows a multiple of 8"):
        ops.matvec_call("q4_1", 32, 64, 1, swiglu=True, accumulate=True)
    with pytest.raises(ValueError, match="norm_eps must be positive"):
        ops.matvec_call("q4_1", 32, 64, 1, norm_eps=0.0)
    with pytest.raises(ValueError, match="head_dim must be even"):
        ops.rope_call(1, 2, 1, 7)
    with pytest.raises(ValueError, match="eps must be positive"):
        ops.rmsnorm_call(64, 1, 0.0)
    with pytest.raises(ValueError, match="outside 1..65535"):
        ops.rmsnorm_call(64, 70000, 1e-5)


def first_step(coro) -> None:
    """Run a coroutine up to its first await (no event loop: browser tests may hold this thread's loop)."""
    try:
        coro.send(None)
    finally:
        coro.close()


def test_runners_validate_before_touching_the_gpu():
    parts = pack_q8_0(*quantize_q8_0(np.zeros((10, 32), np.float32)))
    with pytest.raises(ValueError, match=r"ids in \[0, 10\)"):
        first_step(calls.run_embedding(None, np.array([10], np.int32), (10, 32), parts))
    table = ref.rope_cos_sin(4, 10000.0, 8)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        first_step(calls.run_rope(None, np.zeros((1, 12)), np.array([8], np.int32), table, 1, 1))
    with pytest.raises(ValueError, match=r"qkv must be \(1, 12\)"):
        first_step(calls.run_rope(None, np.zeros((1, 8)), np.array([0], np.int32), table, 1, 1))


def test_q8_0_code_minus_128_is_refused():
    codes = np.zeros((1, 32), np.int8)
    ops.check_q8_0_codes("ok", pack_q8_0(codes + 127, np.ones((1, 1), np.float16)))
    codes[0, 31] = -128
    with pytest.raises(ValueError, match="token_embd.weight contains the code -128"):
        ops.check_q8_0_codes("token_embd.weight", pack_q8_0(codes, np.ones((1, 1), np.float16)))
    with pytest.raises(ValueError, match="contains the code -128"):
        first_step(calls.run_linear(None, np.zeros((1, 32), np.float32), "q8_0", (1, 32),
                                    pack_q8_0(codes, np.ones((1, 1), np.float16))))
