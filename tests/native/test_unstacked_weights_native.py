"""tests/browser/test_unstacked_weights_webgpu.py on wgpu-py (tests/native/conftest.py), plus the gpu kernel
family: its matvecs and tiled matmuls on the Q4_K_M mix (q4_K, q6_K) and on a q4_1 / q8_0 split."""
from native_harness import browser_module, browser_tests

globals().update(browser_tests("test_unstacked_weights_webgpu"))
cases = browser_module("test_unstacked_weights_webgpu")


def test_q4_k_m_mix_gpu_family_greedy_equals_numpy(worker):
    """K-quant prefill on the gpu family's tiled matmuls (matmul_gpu_q4_K / _q6_K), decode on its matvecs."""
    cases.check(cases.greedy(worker, "tiny-q4km", "gpu"), ["matmul_gpu_q4_K", "matmul_gpu_q6_K"])


def test_q4_1_q8_0_split_gpu_tiled_matmul_greedy_equals_numpy(worker):
    cases.check(cases.greedy(worker, "tiny-split-q41-q80", "gpu"), ["matmul_gpu_q4_1", "matmul_gpu_q8_0"])
