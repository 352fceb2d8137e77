"""Cases for test_kv_window_webgpu.py, run inside the page's worker (Pyodide): a sliding-window conversation
on the WebGPU backend vs the CPU engine under the same policy, on the same tiny weights."""
from __future__ import annotations

import engine_cases as ec
from pagedkv.backends.cpu import CpuBackend
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.kv.retention import KVRetention
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer


async def _run(backend, tok, prompt, n, retention):
    engine = LLMEngine(backend, tok, EngineConfig(max_num_batched_tokens=24, max_num_seqs=2))
    rid = engine.add_request(prompt, SamplingParams(max_tokens=n, stop_token_ids=(1_000_000,)), retention=retention)
    req = engine.request(rid)
    held = []
    while engine.has_unfinished:
        await engine.step()
        held.append(len(req.seq.block_table))
    return req.output_ids, max(held), engine.stats()


async def window_past_context(kv_dtype: str, n: int = 300) -> dict:
    """A 40-token prompt and n new tokens (past the tiny model's 256-token context) in 8 KV blocks."""
    w = await ec.weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    shape = dict(block_size=16, kv_dtype=kv_dtype, max_num_batched_tokens=24, max_num_seqs=2)
    probe = await ec.backend("tiny-random", budget_bytes=8 << 20, **shape)
    block_bytes = probe.ledger.by_kind()["kv"] // probe.num_blocks
    fixed = probe.ledger.used_bytes - probe.ledger.by_kind()["kv"]
    probe.destroy()
    b = await ec.backend("tiny-random", budget_bytes=fixed + 8 * block_bytes + 100, **shape)
    r = KVRetention(window_tokens=64, sink_tokens=4)
    prompt = list(range(3, 43))
    gpu, held, stats = await _run(b, tok, prompt, n, r)
    num_blocks = b.num_blocks
    b.destroy()
    cpu, cpu_held, _ = await _run(CpuBackend(w, num_blocks=num_blocks, block_size=16), tok, prompt, n, r)
    return {"gpu": gpu, "cpu": cpu, "num_blocks": num_blocks, "max_blocks_held": held, "cpu_held": cpu_held,
            "shifted_blocks": stats["shifted_blocks"], "used_blocks": stats["used_blocks"]}


async def original_positions_refused() -> str:
    """Original positions past the RoPE table: the WebGPU backend refuses the step with a clear error."""
    w = await ec.weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    b = await ec.backend("tiny-random", budget_bytes=8 << 20, block_size=16, kv_dtype="f32",
                         max_num_batched_tokens=24, max_num_seqs=2)
    try:
        await _run(b, tok, list(range(3, 43)), 300, KVRetention(window_tokens=64, positions="original"))
    except ValueError as exc:
        return str(exc)
    finally:
        b.destroy()
    return "no error"


async def attention_mass_case(seed: int, chunks: list, dtype: str, n_heads: int, n_kv: int, head_dim: int) -> dict:
    """shaders/attention_mass.wgsl vs kernels/ref_attention_mass.py on scattered block tables.
    chunks: (cached tokens, new query tokens) per sequence."""
    import math

    import numpy as np

    import kv_cases as kc
    from pagedkv.backends.webgpu.attention_mass import AttentionMassKernel
    from pagedkv.backends.webgpu.kv_layout import GpuKVLayout, KVCacheBuffers
    from pagedkv.kv.spec import KVSpec
    from pagedkv.kernels.ref_attention_mass import attention_mass_ref

    rng = np.random.default_rng(seed)
    lengths = [c + n for c, n in chunks]
    layout = GpuKVLayout(KVSpec(1, n_kv, head_dim, 16, dtype), sum(-(-n // 16) for n in lengths) + 3)
    k_cache, v_cache = kc.random_cache(rng, layout)
    tables = kc.block_tables(rng, lengths, 16, layout.num_blocks)
    starts = np.concatenate([[0], np.cumsum([n for _, n in chunks])])
    query = rng.standard_normal((int(starts[-1]), n_heads, head_dim)).astype(np.float32)
    kk = await kc.kernels(layout, n_heads)
    cache = KVCacheBuffers(kk.ctx, layout)
    cache.upload(k_cache, v_cache)
    got = await (await AttentionMassKernel(kk).compile()).run(cache.k, query, starts, tables, np.array(lengths))
    cache.destroy()
    want = attention_mass_ref(query, k_cache, tables, starts, np.array(lengths), 1 / math.sqrt(head_dim))
    return {**kc.errors(got, want), "total": float(got.sum())}


async def eviction_under_pressure(n: int = 60) -> dict:
    """Two conversations with importance eviction in 10 KV blocks: GPU vs CPU engine, same policy."""
    w = await ec.weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    shape = dict(block_size=16, kv_dtype="f32", max_num_batched_tokens=24, max_num_seqs=2)
    probe = await ec.backend("tiny-random", budget_bytes=8 << 20, **shape)
    block_bytes = probe.ledger.by_kind()["kv"] // probe.num_blocks
    fixed = probe.ledger.used_bytes - probe.ledger.by_kind()["kv"]
    probe.destroy()
    r = KVRetention(evict=True, sink_tokens=4, recent_tokens=32)
    prompts = [list(range(1 + 50 * i, 41 + 50 * i)) for i in range(2)]
    results = {}
    for name in ("gpu", "cpu"):
        if name == "gpu":
            b = await ec.backend("tiny-random", budget_bytes=fixed + 10 * block_bytes + 100, **shape)
        else:
            b = CpuBackend(w, num_blocks=10, block_size=16)
        engine = LLMEngine(b, tok, EngineConfig(max_num_batched_tokens=24, max_num_seqs=2))
        params = SamplingParams(max_tokens=n, stop_token_ids=(1_000_000,))
        reqs = [engine.request(engine.add_request(p, params, retention=r)) for p in prompts]
        while engine.has_unfinished:
            await engine.step()
        stats = engine.stats()
        results[name] = {"out": [q.output_ids for q in reqs], "evicted": stats["evicted_blocks"],
                         "preemptions": stats["preemptions"], "used": stats["used_blocks"],
                         "num_blocks": stats["num_blocks"]}
        if name == "gpu":
            b.destroy()
    return results
