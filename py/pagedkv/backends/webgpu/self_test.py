"""The boot check of a new GPU context: one real kernel (shaders/residual_add.wgsl) against numpy."""
from __future__ import annotations

import numpy as np

from .device import GPUError, GpuDevice
from .model_kernels import uniform_words


async def residual_add(ctx: GpuDevice, x: np.ndarray, y: np.ndarray, workgroup_size: int = 64) -> np.ndarray:
    """x + y on the GPU with shaders/residual_add.wgsl; inputs are f32 vectors of one length."""
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"residual_add needs two equal 1-D vectors, got {x.shape} and {y.shape}")
    x = x.astype(np.float32)  # (n,)
    y = y.astype(np.float32)  # (n,)
    n = x.shape[0]
    pipeline = await ctx.kernel("residual_add", {"WORKGROUP_SIZE": workgroup_size})
    bx, by = ctx.buffer(x.nbytes, "x"), ctx.buffer(y.nbytes, "y")
    params = ctx.buffer(16, "params", uniform=True)
    ctx.write(bx, x)
    ctx.write(by, y)
    ctx.write(params, uniform_words(n))
    try:
        ctx.push_errors()
        ctx.dispatch(pipeline, [bx, by, params], (-(-n // workgroup_size), 1, 1))
        await ctx.pop_errors("residual_add dispatch")
        return np.frombuffer(await ctx.read(bx, x.nbytes), dtype=np.float32).copy()
    finally:
        for b in (bx, by, params):
            b.destroy()


async def self_test(ctx: GpuDevice, n: int = 100_003, seed: int = 0) -> dict:
    """Run one real kernel and check it against numpy; raises if the GPU result is wrong."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    got = await residual_add(ctx, x, y)
    want = x + y
    max_err = float(np.max(np.abs(got - want)))
    if max_err != 0.0:
        raise GPUError(f"residual_add self-test: max |gpu - numpy| = {max_err} (f32 add must be exact)")
    return {"kernel": "residual_add", "n": n, "max_abs_err": max_err, "checksum": float(got.sum(dtype=np.float64))}
