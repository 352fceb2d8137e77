"""Worker-side half of test_decode_chain.py: the pipelined decode (pagedkv/decode_chain.py) against the same
engine with it off, on WebGPU. Runs in the page's worker and under CPython on wgpu-py (tests/native)."""
from __future__ import annotations

import engine_cases as ec
from pagedkv.config import EngineConfig
from pagedkv.engine import LLMEngine
from pagedkv.sampling import SamplingParams
from pagedkv.tokenizer import Tokenizer

BLOCK = 16
PROMPTS = [list(range(3 + 40 * i, 3 + 40 * i + n)) for i, n in enumerate((7, 30, 12, 19))]


def _params(stops: dict[int, int], max_tokens: int, sampled: bool = True) -> list[SamplingParams]:
    """Requests 0 and 2 greedy, 1 and 3 seeded samples (greedy too unless `sampled`); request i stops on
    stops[i] where given."""
    kinds = [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 11}, {}, {"temperature": 1.3, "seed": 12}]
    return [SamplingParams(max_tokens=max_tokens, stop_token_ids=(stops[i],) if i in stops else (1_000_000,),
                           **(k if sampled else {})) for i, k in enumerate(kinds)]


def _pool(engine) -> dict:
    pool = engine.kv.pool
    return {"free": pool.num_free, "cached": pool.num_cached, "used": pool.num_used}


async def _run(model: str, kernels: str, pipeline: bool, params: list[SamplingParams], abort_at: int | None = None):
    """The four prompts through LLMEngine; per step: whether a step was left in flight and the pool's state.
    abort_at: request 2 is aborted after that many steps (with a step in flight where the chain runs)."""
    w = await ec.weights(model)
    tok = Tokenizer.from_manifest(w.manifest)
    b = await ec.backend(model, budget_bytes=8 * ec.MIB, block_size=BLOCK, kv_dtype="f16",
                         max_num_batched_tokens=64, max_num_seqs=4, kernels=kernels)
    submits = []
    submit = b.submit

    async def counting(batch, **kw):
        submits.append(bool(kw.get("feed")))
        return await submit(batch, **kw)

    b.submit = counting
    b.samples_on_device = True  # the cpu family's too (test_device_sampling.py): its sampled steps chain
    engine = LLMEngine(b, tok, EngineConfig(max_num_batched_tokens=64, max_num_seqs=4, pipeline_decode=pipeline))
    reqs = [engine.request(engine.add_request(p, sp)) for p, sp in zip(PROMPTS, params)]
    start = _pool(engine)
    steps = in_flight = 0
    while engine.has_unfinished:
        await engine.step()
        steps += 1
        in_flight += engine.lane().in_flight is not None
        if steps == abort_at:
            engine.abort(reqs[2].request_id)
    while engine.lane().in_flight is not None:  # an aborted request's extra step: read by the next step
        await engine.step()
    out = {"ids": [r.output_ids for r in reqs], "reasons": [r.finish_reason for r in reqs],
           "histories": [r.seq.token_ids[len(p):] for r, p in zip(reqs, PROMPTS)],
           "start": start, "end": _pool(engine), "steps": steps, "in_flight_steps": in_flight,
           "fed_submits": sum(submits), "submits": len(submits), "counters": engine.stats()}
    b.destroy()
    return out


async def pipelined_vs_plain(kernels: str, model: str = "tiny-random", max_tokens: int = 40) -> dict:
    """Two greedy requests and two seeded samples, all to max_tokens: the same ids with the chain as without.
    Then four greedy requests: a plain run first, then requests 0 and 1 stop on a token they drew where its
    slot would open a new block and request 3 on one mid-block, and both engines run again: the same ids,
    finish reasons and token histories, and the same pool at the end (the extra step's slots released
    exactly). (Stops change the batch's rows, and the gpu family's decode split follows the rows: a sampled
    row's logits move in the last bits and a draw near a boundary may flip, so the stops run greedy.)"""
    out = {"sampled": {p: await _run(model, kernels, p == "piped", _params({}, max_tokens)) for p in ("plain", "piped")}}
    free = await _run(model, kernels, False, _params({}, max_tokens, sampled=False))
    stops, where = {}, {}
    for i in (0, 1, 3):
        ids = free["ids"][i]
        for k, t in enumerate(ids[:-1]):
            at_boundary = (len(PROMPTS[i]) + k) % BLOCK == 0
            if t not in ids[:k] and (at_boundary if i < 2 else not at_boundary) and k > 2:
                stops[i], where[i] = t, k
                break
    params = _params(stops, max_tokens, sampled=False)
    out["stopped"] = {"plain": await _run(model, kernels, False, params),
                      "piped": await _run(model, kernels, True, params), "stops": where}
    out["free"] = free["ids"]
    return out


async def abort_in_flight(kernels: str, model: str = "tiny-random", max_tokens: int = 24) -> dict:
    """Request 2 aborted after step 6, while a step runs for it on the GPU: the others' ids as without the
    chain, request 2's history without the placeholder, and every block back in the pool."""
    params = _params({}, max_tokens)
    return {p: await _run(model, kernels, p == "piped", params, abort_at=6) for p in ("plain", "piped")}
