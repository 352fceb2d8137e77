"""Worker-side half of test_device_sampling.py: shaders/sample.wgsl against pagedkv.sampling.Sampler (the
numpy draw), and the engine sampling on the device against the same engine sampling on the host. Runs in the
page's worker and under CPython on wgpu-py (tests/native)."""
import numpy as np

import engine_cases as ec
from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.sampling import Sampler, SamplingParams


async def _draw(ctx, logits, settings):
    """One dispatch of sample.wgsl over logits (S, V) f32 with settings (S, 4) f32 -> (S,) ids."""
    call = ops.sample_call(logits.shape[1], logits.shape[0])
    pipeline = await ctx.kernel(call.shader, dict(call.constants))
    bufs = [ctx.upload(np.ascontiguousarray(logits, np.float32), "logits"),
            ctx.upload(np.ascontiguousarray(settings, np.float32), "settings"),
            ctx.buffer(4 * logits.shape[0], "ids"),
            ctx.upload(np.frombuffer(call.params, np.uint8), "params", uniform=True)]
    try:
        ctx.push_errors()
        ctx.submit([(pipeline, ctx.bind(pipeline, bufs), call.workgroups)])
        await ctx.pop_errors("sample dispatch")
        return np.frombuffer(await ctx.read(bufs[2], 4 * logits.shape[0]), np.uint32).astype(int)
    finally:
        for b in bufs:
            b.destroy()


async def case_sample(vocab, rows, rounds, seed, scale=4.0, ties=False):
    """rows: (temperature, top_p) per sequence. Each round draws every row on the GPU with u taken from a
    Sampler seeded seed + row (device_draw) and compares it with a twin Sampler's sample() on the same
    logits. ties: a run of equal logits at the top and at the top-p boundary."""
    ctx = await ec.context()  # the engine cases' device: one for both
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((len(rows), vocab)) * scale).astype(np.float32)  # (S, V)
    if ties:
        logits[:, 5:9] = logits.max(axis=1, keepdims=True)  # four ids share the max
        logits[:, 100:140] = np.float32(scale)  # a plateau the top-p cut may cross
    params = [SamplingParams(temperature=t, top_p=p, seed=seed + i) for i, (t, p) in enumerate(rows)]
    device, host = [Sampler(p) for p in params], [Sampler(p) for p in params]
    got, want = [], []
    for _ in range(rounds):
        settings = np.zeros((len(rows), 4), np.float32)
        for i, s in enumerate(device):
            settings[i, :3] = s.device_draw()
        got.append((await _draw(ctx, logits, settings)).tolist())
        want.append([h.sample(logits[i]) for i, h in enumerate(host)])
    return {"got": got, "want": want, "distinct": len({t for r in want for t in r})}


async def engine_device_vs_host(kernels, model="tiny-random", max_tokens=12):
    """Four seeded requests (temperatures, top-p, one greedy, one with n=2 whose fork step samples on the host)
    through LLMEngine on WebGPU, drawn on the device, then again with the host sampling from the logits: the
    same tokens, and how many steps read back ids only."""
    from pagedkv.config import EngineConfig
    from pagedkv.engine import LLMEngine
    from pagedkv.tokenizer import Tokenizer

    w = await ec.weights(model)
    tok = Tokenizer.from_manifest(w.manifest)
    prompts = [list(range(3 + 40 * i, 3 + 40 * i + n)) for i, n in enumerate((7, 30, 12, 19))]
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=max_tokens),
              SamplingParams(temperature=1.3, seed=12, max_tokens=max_tokens),
              SamplingParams(max_tokens=max_tokens),
              SamplingParams(temperature=0.6, top_p=0.5, seed=13, n=2, max_tokens=max_tokens)]
    out = {}
    for on_device in (True, False):
        b = await ec.backend(model, budget_bytes=8 * ec.MIB, block_size=16, kv_dtype="f16",
                             max_num_batched_tokens=24, max_num_seqs=5, kernels=kernels)
        b.samples_on_device = on_device
        drawn = []
        submit = b.submit  # forward() submits through it too, and a pipelined decode step calls it alone

        async def counting(batch, **kw):
            drawn.append("draws" in kw and kw["draws"] is not None)
            return await submit(batch, **kw)

        b.submit = counting
        engine = LLMEngine(b, tok, EngineConfig(max_num_batched_tokens=24, max_num_seqs=5))
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        reqs = [engine.request(i) for i in ids]
        while engine.has_unfinished:
            await engine.step()
        out["device" if on_device else "host"] = [[s.output_ids for s in (r.samples or [r])] for r in reqs]
        out[f"drawn_steps_{'device' if on_device else 'host'}"] = sum(drawn)
        out["steps"] = len(drawn)
        b.destroy()
    return out
