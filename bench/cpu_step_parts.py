"""The tab's CPU path taken apart in the page's worker (issue 51): where a decode step's and a prefill's time goes,
and the one-token step walked in one crossing (web/linear_tape.js) against Python walking the same tape.

    python3 -m bench.cpu_step_parts [--model smollm2-135m-instruct] [--contexts 8 560] [--new 80]
                                    [--prefill 512] [--rounds 2] [--quick]

Boots the app page at ?model=MODEL&backend=cpu (the kernel threads: one a core), then in its worker, on the page's
own engine, `rounds` times each in turn (the machine's load moves them alike):
- decode: `new` greedy steps after a prompt of each `contexts` length, through the kernels' tape runner and through
  Python's walk of the same tape (the kernels without run_tape): the step's milliseconds (median, mean, the first
  decode step left out) and, per step, web/linear_threads.js's stats: the products' calls, this thread's chunks,
  waiting for the helpers, copying activations in and out, the helpers' chunks; the prompt attentions the threads
  ran (attn_prefill) and their time, copies included;
- prefill: one `prefill`-token prompt of ids no earlier prompt began with, its forward's parts timed around the
  model's methods (the projections, the attention, the MLP, norms, rope: a part's time includes the products it
  runs) and the same stats.
Prints JSON; the load average before and after goes with it. Never asserts on a time.
"""
from __future__ import annotations

import argparse
import os
import time

from bench import emit
from harness.page import BrowserSession

WORKER = """
import json, statistics, time
from pagedkv_app.main import state
from pagedkv.sampling import SamplingParams
_engine = state["engine"]
_model = _engine.backend.model
_js = _model.w["token_embd.weight"].store.js
_kernels = _model.kernels
_STATS = ("calls", "ownUs", "waitUs", "copyUs", "helperUs", "attnCalls", "attnUs", "decodeCalls", "decodeUs")
await _engine.settle_disk()

class _PythonWalk:  # the kernels without their tape runner: cpu_tape.interpret walks the tape call by call
    def __getattr__(self, name):
        if name == "run_tape":
            raise AttributeError(name)
        return getattr(_kernels, name)

def _stats():
    return {{k: float(getattr(_js.stats, k)) for k in _STATS}}

def _per(s0, s1, n):
    return {{k: round((s1[k] - s0[k]) / n / (1 if k in ("calls", "attnCalls") else 1e3), 3) for k in _STATS}}

async def _decode(context, walk):
    _model.kernels = _kernels if walk == "tape" else _PythonWalk()
    rid = _engine.add_request(list(range(1000, 1000 + context)),
                              SamplingParams(max_tokens={new}, stop_token_ids=(1_000_000,)))
    times, out, s0 = [], [], None
    while _engine.has_unfinished:
        if out:  # the prompt is in: decode steps from here on, the first one left out
            s0 = s0 or _stats()
        t0 = time.perf_counter()
        outs = await _engine.step()
        times.append(time.perf_counter() - t0)
        out += [t for o in outs if o.request_id == rid for t in o.token_ids]
    _model.kernels = _kernels
    steps = times[len(times) - len(out) + 1:]
    return {{"context": context, "walk": walk, "median_ms": round(1e3 * statistics.median(steps), 2),
             "mean_ms": round(1e3 * sum(steps) / len(steps), 2), "per_step": _per(s0, _stats(), len(steps)),
             "ids": out[:8]}}

async def _prefill(base):  # ids no earlier prompt began with: no prefix-cache hit
    parts = {{}}
    names = ("_projections", "_sequence_attention", "_mlp", "_norm", "_rope")
    for name in names:
        def timed(*a, _f=getattr(_model, name), _n=name, **kw):
            t0 = time.perf_counter()
            r = _f(*a, **kw)
            parts[_n] = parts.get(_n, 0.0) + time.perf_counter() - t0
            return r
        setattr(_model, name, timed)
    s0 = _stats()
    rid = _engine.add_request(list(range(base, base + {prefill})),
                              SamplingParams(max_tokens=1, stop_token_ids=(1_000_000,)))
    t0 = time.perf_counter()
    while _engine.has_unfinished:
        await _engine.step()
    total = time.perf_counter() - t0
    for name in names:
        delattr(_model, name)
    return {{"tokens": {prefill}, "ms": round(1e3 * total, 1), "parts_ms": {{k: round(1e3 * v, 1) for k, v in parts.items()}},
             "products": _per(s0, _stats(), 1)}}

_rows = {{"decode": [], "prefill": []}}
for _round in range({rounds}):
    for _context in {contexts}:
        for _walk in ("tape", "python"):
            _rows["decode"].append(await _decode(_context, _walk))
    _rows["prefill"].append(await _prefill(20000 + 1000 * _round))
json.dumps(_rows)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--contexts", type=int, nargs="+", default=[8, 560])
    parser.add_argument("--new", type=int, default=80)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round, 16 new tokens, a 64-token prefill")
    parser.add_argument("--json", action="store_true", help="accepted for `python3 -m bench`")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.new, args.prefill = 1, 16, 64
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    query = f"?model={args.model}&backend=cpu"
    with BrowserSession(query) as s:
        rows = s.py(WORKER.format(new=args.new, prefill=args.prefill, rounds=args.rounds, contexts=list(args.contexts)))
        info = s.model_info
    same = {r["context"]: r["ids"] for r in rows["decode"] if r["walk"] == "tape"}
    emit({"benchmark": "cpu_step_parts", "model": args.model, "query": query, "cpu_linear": info.get("cpu_linear"),
          "new_tokens": args.new, **rows,
          "same_ids": all(r["ids"] == same[r["context"]] for r in rows["decode"]),
          "load_before": [round(v, 2) for v in load_before], "load_after": [round(v, 2) for v in os.getloadavg()],
          "wall_s": round(time.perf_counter() - t0, 1), "quick": args.quick})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
