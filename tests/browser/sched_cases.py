"""Cases for test_scheduler_stress.py, run in the page's worker (Pyodide) on the WebGPU backend with the
tiny model: many conversations under a pool of a few dozen blocks, and parallel samples on forked blocks.
Builds on engine_cases (loaded first as a module). Each case returns plain JSON-able data."""
from __future__ import annotations

import random

import engine_cases as ec
from pagedkv.backends.numpy_ref import NumpyModel, greedy_reference
from pagedkv.engine import EngineConfig, LLMEngine
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

NEVER = (1_000_000,)  # a stop id the tiny vocabulary never emits: lengths are exactly max_tokens


async def tiny_engine(num_blocks: int, num_cpu_blocks: int, kv_dtype: str = "f16", **config):
    """(engine, backend, tokenizer) with a KV pool of exactly `num_blocks` blocks of 16 tokens."""
    w = await ec.weights("tiny-random")
    tok = Tokenizer.from_manifest(w.manifest)
    shape = {"block_size": 16, "kv_dtype": kv_dtype, "max_num_batched_tokens": 64, "max_num_seqs": 8}
    fixed, block_bytes = await ec.tiny_sizes(**shape)
    b = await ec.backend("tiny-random", budget_bytes=fixed + num_blocks * block_bytes + 100,
                         num_cpu_blocks=num_cpu_blocks, **shape)
    return LLMEngine(b, tok, EngineConfig(max_num_batched_tokens=64, max_num_seqs=8, **config)), b, tok


def conversations(seed: int, count: int = 6) -> list[dict]:
    """Seeded random conversations: two turns each, prompt and reply lengths drawn per turn."""
    rng = random.Random(seed)
    out = []
    for c in range(count):
        base = 3 + 80 * c  # distinct token ranges: no two conversations share a prefix by accident
        out.append({"prompt": [base + rng.randrange(60) for _ in range(rng.randint(10, 70))],
                    "follow_up": [base + rng.randrange(60) for _ in range(rng.randint(3, 20))],
                    "replies": [rng.randint(4, 30), rng.randint(4, 30)], "priority": rng.randint(0, 2)})
    return out


async def stress(seed: int, num_blocks: int, preemption: str, swap_max_blocks: int = 3) -> dict:
    """Six two-turn conversations at once; turn 2 (history + reply + follow-up) is queued when turn 1 ends.
    Every reply is compared with the numpy reference (greedy) of the same history."""
    engine, b, tok = await tiny_engine(num_blocks, 32, kv_dtype="f32", preemption=preemption,
                                       swap_max_blocks=swap_max_blocks)
    convs = conversations(seed)
    live: dict[str, tuple] = {}  # request id -> (conversation, turn, prompt, Request)

    def start(i: int, t: int, prompt: list[int]) -> None:
        params = SamplingParams(max_tokens=convs[i]["replies"][t], stop_token_ids=NEVER)
        rid = engine.add_request(prompt, params, request_id=f"c{i}-t{t}", priority=convs[i]["priority"])
        live[rid] = (i, t, prompt, engine.request(rid))

    for i, c in enumerate(convs):
        start(i, 0, list(c["prompt"]))
    done, steps, peak = [], 0, 0
    while engine.has_unfinished:
        for o in await engine.step():
            if o.finished:
                i, t, prompt, req = live.pop(o.request_id)
                done.append((i, t, prompt, list(req.output_ids), req.finish_reason, req.num_preemptions))
                if t == 0:
                    start(i, 1, prompt + req.output_ids + convs[i]["follow_up"])
        steps += 1
        peak = max(peak, engine.kv.pool.num_used)
    model = ec._cache.setdefault(("model", "tiny-random"), NumpyModel(await ec.weights("tiny-random")))
    failures = [f"conversation {i} turn {t}: {reason}, {len(out)} tokens, differs from numpy: "
                f"{out != greedy_reference(model, prompt, len(out))}"
                for i, t, prompt, out, reason, _ in done
                if reason != "length" or out != greedy_reference(model, prompt, convs[i]["replies"][t])]
    stats = engine.stats()
    view = ec.ledger_view(b)
    b.destroy()
    return {"failures": failures, "turns": len(done), "steps": steps, "peak_used_blocks": peak,
            "preemptions": stats["preemptions"], "preempted_turns": sum(1 for d in done if d[5]),
            "swap_out_blocks": stats["swap_out_blocks"], "swap_in_blocks": stats["swap_in_blocks"],
            "num_blocks": stats["num_blocks"], "used": stats["used_blocks"], "free": stats["free_blocks"],
            "cached": stats["cached_blocks"], "cpu_free": engine.kv.cpu_pool.num_free,
            "cpu_cached": engine.kv.cpu_pool.num_cached, "cpu_total": engine.kv.cpu_pool.num_blocks,
            "demoted": stats["cpu_demoted_blocks"], "ledger": view,
            "tokens": [len(c["prompt"]) for c in convs], "replies": [c["replies"] for c in convs]}


async def parallel_samples(kv_dtype: str) -> dict:
    """n = 3 samples of a 40-token prompt on WebGPU (the copy-on-write copies run on the GPU) vs three lone
    requests with seeds 11, 12, 13 on the same backend; block tables after the first two steps."""
    prompt = list(range(3, 43))
    engine, b, _ = await tiny_engine(16, 0, kv_dtype=kv_dtype)
    rid = engine.add_request(prompt, SamplingParams(temperature=0.9, seed=11, max_tokens=12, n=3,
                                                    stop_token_ids=NEVER))
    parent = engine.request(rid)
    await engine.step()
    after_prefill = [list(s.seq.block_table) for s in parent.samples]
    refs = [engine.kv.pool.ref_count(i) for i in range(3)]
    await engine.step()
    after_cow = [list(s.seq.block_table) for s in parent.samples]
    while engine.has_unfinished:
        await engine.step()
    group = {"samples": [s.output_ids for s in parent.samples], "after_prefill": after_prefill, "refs": refs,
             "after_cow": after_cow, **{k: engine.stats()[k] for k in ("copy_ops", "prefill_tokens", "used_blocks")}}
    lone = []
    for i in range(3):
        req = await engine.generate(prompt, SamplingParams(temperature=0.9, seed=11 + i, max_tokens=12,
                                                           stop_token_ids=NEVER))
        lone.append(req.output_ids)
    b.destroy()
    return {**group, "lone": lone}
