"""Activations of 3e4 through the f16 matvecs on wgpu-py (lavapipe computes f16 in f16; SwiftShader has no
shader-f16, so only here): finite and within the f16 bounds of tests/browser/test_model_kernels.py, where the
old casts overflowed f16's 65,504 (shown here in numpy, as the kernels did it):

- NORM (the q | k | v and gate | up projections): the raw residual x gain cast to f16 before normalising
  (3e4 x a gain of 2.5 is 75,000): 1 / rms is taken in f32 first (matvec_gpu_main.wgsl), as before this test;
- ACCUMULATE (o and down, whose inputs are not normalised): a word's activations cast raw, the q4_1 decoder's
  m * sum(x) term summing 8 of them (240,000) and q8_0's dot product 4 (up to 120,000): a word whose largest
  |x| reaches 4,096 now enters as x / 2^e, that largest within 1 (shaders/f16_word_scale.wgsl).
"""
from __future__ import annotations

import numpy as np
import pytest

import native_harness  # noqa: F401  (puts tests/browser on sys.path: the kernel cases)
from test_model_kernels import F16_REL_BOUND, F16_SCALED_BOUND

OUTLIER = 3.0e4
COLS = 576
# every column but the first 5 and the last (kernel_cases spaces them one apart from column 5), signs mixed
ROW = tuple(OUTLIER * (-1.0) ** (k // 3) for k in range(COLS - 6))


def test_old_casts_overflowed_at_3e4():
    x = np.full(8, OUTLIER, np.float32)
    with np.errstate(over="ignore"):
        assert np.isinf(np.float16(x[0] * np.float32(2.5)))  # NORM: raw x * g cast before 1 / rms
        assert np.isinf(np.sum(x.astype(np.float16), dtype=np.float16))  # q4_1: sum of a word's 8 activations
        assert np.isinf(np.sum(x[:4].astype(np.float16), dtype=np.float16))  # q8_0: 4 codes near 1 times x


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0"])
def test_f16_matvecs_take_activations_of_3e4(native_loop, native_device, dtype):
    import kernel_cases as kc

    assert "shader-f16" in native_device.info.features  # lavapipe has it: a missing one fails here, loudly

    async def run():
        norm = await kc.case_linear("matvec", dtype, 960, COLS, 2, seed=16, norm=True, family="gpu_f16",
                                    outliers=ROW)
        # NORM: kernel_cases' gain is 1.5 at the outliers (45,000 raw), its kernel scales by 1 / rms first
        acc = [await kc.case_linear("matvec", dtype, 64, cols, 1, seed=17, accumulate=True, family=family,
                                    outliers=ROW[: cols - 6]) for cols, family in ((COLS, "gpu_f16"),
                                                                                  (1536, "gpu_f16_groups"))]
        return [norm, *acc]

    results = native_loop.run(run())
    assert [(r["family"], r["shape"], r["norm"], r["accumulate"]) for r in results] == [
        ("gpu_f16", [2, 960], True, False), ("gpu_f16", [1, 64], False, True),
        ("gpu_f16_groups", [1, 64], False, True)]
    assert results[0]["raw_max"] == OUTLIER * 1.5  # 45,000: x 1.5 raw, 8 of them a word
    for r in results:
        scaled = r.get("max_term_scaled", r["max_scaled"])
        assert r["finite"] and scaled <= F16_SCALED_BOUND and r["max_rel"] <= F16_REL_BOUND, r
