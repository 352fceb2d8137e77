"""tests/browser/test_float_weights_webgpu.py on wgpu-py (tests/native/conftest.py), and every float weight type
in both kernel families (the page runs f16 on the cpu family only)."""
import pytest

from native_harness import browser_module, browser_tests

globals().update(browser_tests("test_float_weights_webgpu"))


@pytest.mark.parametrize("dtype,kernels", [("f16", "gpu"), ("bf16", "cpu"), ("bf16", "gpu"), ("f32", "cpu"),
                                           ("f32", "gpu")])
def test_float_models_greedy_equal_numpy_in_both_families(worker, dtype, kernels):
    browser_module("test_float_weights_webgpu").check_greedy(worker, dtype, kernels)
