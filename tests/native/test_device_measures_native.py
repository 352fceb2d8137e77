"""The measurements and the check issue 50 adds to bench.kernels and the device script, on wgpu-py (lavapipe
here): chains of dependent empty dispatches (shaders/dispatch_chain.wgsl, their counter checked), GPU timestamps
around whole replayed steps (NativeDevice.time_steps), and the LM head's top ids against numpy
(bench/device/lm_head_check.py). Figures are never checked; what ran and what came back are."""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.backends.webgpu.device import GPUError


def test_dependent_dispatch_chains_run_in_order(native_loop, native_device):
    from bench.kernels import Bench, dispatch_chain_rows

    async def run():
        b = Bench(native_device, repeats=2, runs=2)
        floor = await dispatch_chain_rows(b)  # raises when a chain's counter is not n * 5
        return b.rows, floor

    rows, floor = native_loop.run(run())
    assert [(r["kernel"], r["chain"], r["dispatches_per_pass"], r["timer"]) for r in rows] == [
        ("dispatch_chain", n, n, "gpu timestamps") for n in (1, 16, 128)]
    assert floor == pytest.approx((rows[2]["ms_min"] * 128 - rows[0]["ms_min"]) / 127)


def test_replayed_steps_are_timed_first_pass_to_last(native_loop, native_device):
    ctx = native_device

    async def run():
        counter = ctx.upload(np.zeros(4, np.uint32), "counter")
        pipeline = await ctx.kernel("dispatch_chain", {"WORKGROUP_SIZE": 1})
        params = ctx.upload(ops.uniform_words(1), "params", uniform=True)
        group = ctx.bind(pipeline, [counter, params])
        plan = ctx.record_plan([[(pipeline, group)] * 3, [(pipeline, group)] * 2])  # two passes, 5 dispatches
        grids = np.ones((5, 3), np.int32)
        no_copies = np.zeros((0, 3), np.int32)
        ctx.time_steps(2)
        for _ in range(3):  # the third replay is past the two asked for: not stamped
            await ctx.replay(plan, grids, no_copies, counter, counter)
        times = await ctx.step_times_ms()
        one = await ctx.read_array(counter, np.uint32, (1,))
        ctx.time_steps(2)
        await ctx.replay(plan, grids, no_copies, counter, counter)
        with pytest.raises(GPUError, match=r"time_steps\(2\) saw 1 replays"):
            await ctx.step_times_ms()
        with pytest.raises(GPUError, match=r"without time_steps\(\) first"):
            await ctx.step_times_ms()
        return times, int(one[0])

    times, count = native_loop.run(run())
    assert len(times) == 2 and all(t > 0 for t in times)
    assert count == 3 * 5  # every replay ran its five dispatches


def test_lm_head_check_finds_the_reference_top_ids_in_every_variant(native_loop, native_device):
    from bench.device.lm_head_check import check, top_ids

    assert top_ids(np.array([1.0, 3.0, 3.0, 2.0]), 3) == [1, 2, 3]  # value descending, lower id first on ties
    # SmolLM2's hidden size; seed 0's top 6 lie 0.049 apart or more, 20x the f16 matvec's largest error (0.0022)
    r = native_loop.run(check(2048, 576, seed=0, top=6))
    assert r["ok"] and len(r["want_top_ids"]) == 6 and min(r["want_gaps"]) > 0.049
    assert [(v["variant"], v["equal"], v["faults"]) for v in r["variants"]] == [
        (name, True, []) for name in ("cpu", "gpu_tree", "gpu_sg", "gpu_f16")]  # lavapipe has subgroups and f16
    assert all(v["top_ids"] == r["want_top_ids"] and v["argmax"] == r["want_top_ids"][0] for v in r["variants"])
