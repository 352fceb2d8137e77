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


async def case_shaped(vocab, rows, rounds, seed, scale=2.0, ties=False):
    """rows: SamplingParams keywords per sequence (penalties, logit_bias, top_k, min_p, logprobs). Each round
    shapes, draws and counts every row on the GPU (sample_shape.wgsl, sample.wgsl, sample_post.wgsl in one pass,
    the counts kept on the device across rounds) and compares the ids and log-probs with a twin Sampler's on
    the same logits and the same output ids. ties: four ids share the max and ten the value just below it."""
    from types import SimpleNamespace

    from pagedkv.device_draws import LP_STRIDE, DeviceDraws
    from pagedkv.logprobs import token_logprob
    from pagedkv.sequence import SequenceStatus

    ctx = await ec.context()
    rng = np.random.default_rng(seed)
    n = len(rows)
    logits = (rng.standard_normal((n, vocab)) * scale).astype(np.float32)  # (S, V)
    if ties:
        logits[:, 5:9] = logits.max(axis=1, keepdims=True)
        logits[:, 100:110] = logits[:, 5:6] - np.float32(0.125)
    params = [SamplingParams(seed=seed + i, **r) for i, r in enumerate(rows)]
    device, host = [Sampler(p) for p in params], [Sampler(p) for p in params]
    reqs = [SimpleNamespace(output_ids=[], status=SequenceStatus.RUNNING) for _ in rows]
    draws = DeviceDraws(n, vocab)
    calls = [ops.sample_shape_call(vocab, n, n), ops.sample_call(vocab, n), ops.sample_post_call(vocab, n, n)]
    pipes = [await ctx.kernel(c.shader, dict(c.constants)) for c in calls]
    bufs = {"logits": ctx.upload(logits, "logits"), "settings": ctx.buffer(n * 16, "settings"),
            "rows": ctx.buffer(n * 32, "rows"), "bias": ctx.buffer(n * 300 * 8, "bias"),
            "counts": ctx.upload(np.zeros((n, vocab), np.uint32), "counts"),
            "shaped": ctx.buffer(n * vocab * 4, "shaped"), "io": ctx.buffer((n + n * LP_STRIDE) * 4, "io")}
    uniforms = [ctx.upload(np.frombuffer(c.params, np.uint8), f"params{i}", uniform=True) for i, c in enumerate(calls)]
    b = bufs
    groups = [ctx.bind(pipes[0], [b["logits"], b["settings"], b["rows"], b["bias"], b["counts"], b["shaped"], b["io"],
                                  uniforms[0]]),
              ctx.bind(pipes[1], [b["shaped"], b["settings"], b["io"], uniforms[1]]),
              ctx.bind(pipes[2], [b["logits"], b["rows"], b["io"], b["counts"], uniforms[2]])]
    got, want, lp_err, tops_equal = [], [], 0.0, True
    try:
        for _ in range(rounds):
            settings, shaping = draws.draws([(r, s, True) for r, s in zip(reqs, device)])
            ctx.write(b["settings"], settings)
            ctx.write(b["rows"], shaping.rows)
            ctx.write(b["bias"], shaping.bias)
            for slot, counts in shaping.counts:
                ctx.write(b["counts"], counts, slot * vocab * 4)
            ctx.push_errors()
            ctx.submit([(p, g, c.workgroups) for p, g, c in zip(pipes, groups, calls)])
            await ctx.pop_errors("shaped draw")
            words = np.frombuffer(await ctx.read(b["io"], (n + n * LP_STRIDE) * 4), np.uint32)
            ids = words[:n].astype(int).tolist()
            lp = words[n:].reshape(n, LP_STRIDE)
            expect = [h.sample(logits[i], reqs[i].output_ids, reqs[i].output_ids) for i, h in enumerate(host)]
            for i, p in enumerate(params):
                if p.logprobs is not None and ids[i] == expect[i]:
                    ref = token_logprob(logits[i], expect[i], p.logprobs)
                    f32 = lp[i].view(np.float32)
                    lp_err = max(lp_err, abs(float(f32[0]) - ref.logprob),
                                 *(abs(float(f32[22 + k]) - v) for k, (_, v) in enumerate(ref.top)))
                    tops_equal &= lp[i, 2:2 + p.logprobs].tolist() == [t for t, _ in ref.top]
            got.append(ids)
            want.append(expect)
            for r, t in zip(reqs, expect):
                r.output_ids.append(t)
    finally:
        for buf in (*bufs.values(), *uniforms):
            buf.destroy()
    return {"got": got, "want": want, "distinct": len({t for r in want for t in r}), "lp_err": lp_err,
            "tops_equal": tops_equal}


async def engine_shaped_device_vs_host(model="tiny-random", max_tokens=12):
    """Seeded requests with penalties, logit bias, top-k, min-p and log-probs through LLMEngine on WebGPU (gpu
    kernels), drawn on the device, then again with the host sampling from the logits: the same tokens and
    log-probs, how many steps were shaped on the device and how many ran pipelined (fed on the GPU)."""
    from pagedkv.config import EngineConfig
    from pagedkv.engine import LLMEngine
    from pagedkv.tokenizer import Tokenizer

    w = await ec.weights(model)
    tok = Tokenizer.from_manifest(w.manifest)
    prompts = [list(range(3 + 40 * i, 3 + 40 * i + n)) for i, n in enumerate((7, 30, 12))]
    params = [SamplingParams(presence_penalty=1.5, frequency_penalty=0.7, logit_bias=((59, -100.0), (77, 4.0)),
                             max_tokens=max_tokens, logprobs=3),
              SamplingParams(temperature=0.9, top_k=5, min_p=0.05, frequency_penalty=1.0, seed=12,
                             max_tokens=max_tokens),
              SamplingParams(temperature=1.2, top_p=0.9, seed=13, max_tokens=max_tokens, logprobs=0)]
    out = {}
    for on_device in (True, False):
        b = await ec.backend(model, budget_bytes=12 * ec.MIB, block_size=16, kv_dtype="f16",
                             max_num_batched_tokens=48, max_num_seqs=4, kernels="gpu")
        b.samples_on_device = on_device
        shaped, fed = [], []
        submit = b.submit

        async def counting(batch, **kw):
            shaped.append(kw.get("shaping") is not None)
            fed.append(bool(kw.get("feed")))
            return await submit(batch, **kw)

        b.submit = counting
        engine = LLMEngine(b, tok, EngineConfig(max_num_batched_tokens=48, max_num_seqs=4))
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        reqs = [engine.request(i) for i in ids]
        logprobs = {i: [] for i in ids}
        while engine.has_unfinished:
            for o in await engine.step():
                for e in o.logprobs or []:
                    logprobs[o.request_id].append((e.token_id, e.logprob, [t for t, _ in e.top],
                                                   [v for _, v in e.top]))
        key = "device" if on_device else "host"
        out[key] = [r.output_ids for r in reqs]
        out[f"logprobs_{key}"] = [logprobs[i] for i in ids]
        out[f"shaped_{key}"], out[f"fed_{key}"] = sum(shaped), sum(fed)
        b.destroy()
    return out
