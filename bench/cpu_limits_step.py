"""A decode step of the tab's CPU path taken apart, side by side in one page (issue 51): the layers through the
one-token step (WasmAttentionModel.forward, as the family declares them) against the reference's layer loop on
the same weights, a q8_0 head held as its codes and d (cpu_wasm.head_blocks) against the same head with (d, 0)
pairs (the layout before), and the head's product alone on every kernel thread and on one.

    python3 -m bench.cpu_limits_step [--model gemma-3-270m] [--prompt 64] [--new 32] [--rounds 2]
                                     [--head-reps 10] [--threads N] [--quick]

Boots the app page at ?model=MODEL&backend=cpu (the kernel threads: one a core), then in its worker, on the page's
own engine: `rounds` times each variant in turn (layer loop with the (d, 0) head, the one-token step with it,
the one-token step with the d-only head: the machine's load moves them alike), greedy decode of `new` tokens after
the same `prompt` ids (a plain text, tokenized by the model's own tokenizer), decode tok/s and the ids of each;
then each head layout, (1, hidden) @ W.T, `head_reps` times on the threads and with web/linear_threads.js's
minWork raised so one thread runs it, twice in turn: milliseconds and the GB/s its bytes (codes and scales)
stream at. Prints JSON; the load average before and after goes with it (other
work on this 2-core machine moves every figure). Never asserts on a time.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from bench import emit
from harness.page import BrowserSession

TEXT = ("The history of the printing press begins in the fifteenth century, when movable type made books cheaper "
        "and faster to produce than ever before. Within decades, presses spread across Europe, and the number of "
        "books in circulation grew from thousands to millions. Scholars, merchants and ordinary readers")

WORKER = """
import json, statistics, time
import numpy as np
from pagedkv_app.main import state
from pagedkv.sampling import SamplingParams
_engine = state["engine"]
_model = _engine.backend.model
_fused = _model._layers
_prompt = _engine.lane().tokenizer.encode({text!r})[:{prompt}]
await _engine.settle_disk()

_cfg = _model.config
_name = "token_embd.weight" if _cfg.tied_embeddings else "output.weight"
_head = _model.w[_name]
_js = getattr(getattr(_head, "store", None), "js", None)
_heads = {{_head.kind: _head}}
if _head.kind == "q8_d":  # the head as before head_blocks: the same codes, (d, 0) f32 pairs, beside it
    from pagedkv.backends.cpu_wasm import QuantWeight, split_d_rows
    _q, _d = split_d_rows(_head.store.fetch(_head.qs), _head.dm_shape[1])
    _heads["q8_0"] = QuantWeight("q8_0", _q, np.stack([_d, np.zeros_like(_d)], axis=2), _head.store)
    del _q, _d
_embed = _model.w["token_embd.weight"]

async def _decode(fused, head):
    _model._layers = _fused if fused else None
    _model.w[_name] = _heads[head]
    if _cfg.tied_embeddings:
        _model.w["token_embd.weight"] = _heads[head]
    times, out = [], []
    rid = _engine.add_request(_prompt, SamplingParams(max_tokens={new}, stop_token_ids=(1_000_000,)))
    while _engine.has_unfinished:
        t0 = time.perf_counter()
        outs = await _engine.step()
        times.append(time.perf_counter() - t0)
        out += [t for o in outs if o.request_id == rid for t in o.token_ids]
    steps = times[len(times) - len(out) + 1:]
    return {{"decode_tok_s": round(len(steps) / sum(steps), 2), "ms_a_step": round(1e3 * statistics.median(steps), 1),
             "output_ids": out}}

_old = "q8_0" if "q8_0" in _heads else _head.kind
_variants = {{"layer_loop, " + _old + " head": (False, _old), "one_token_step, " + _old + " head": (True, _old),
              "one_token_step, " + _head.kind + " head": (True, _head.kind)}}
_rows = {{name: [] for name in _variants}}
for _ in range({rounds}):
    for _v, (_fused_on, _which) in _variants.items():
        _rows[_v].append(await _decode(_fused_on, _which))
_model._layers, _model.w[_name] = _fused, _head
_model.w["token_embd.weight"] = _embed
_x = np.random.default_rng(0).standard_normal((1, _cfg.hidden)).astype(np.float32)

def _time_head(w):
    times = []
    for _ in range({head_reps}):
        t0 = time.perf_counter()
        _x @ w.T
        times.append(time.perf_counter() - t0)
    return {{"median_ms": round(1e3 * statistics.median(times), 2), "fastest_ms": round(1e3 * min(times), 2),
             "gb_s": round(w.nbytes / (min(times) * 1e9), 2)}}

_timed = {{"threads": int(_js.threads) if _js else 1}}
for _ in range(2):  # the layouts in turn, twice: the load moves them alike
    for _kind, _w in _heads.items():
        _t = _timed.setdefault(_kind, {{"bytes": int(_w.nbytes)}})
        _t.setdefault("all_threads", []).append(_time_head(_w))
        if _js:
            _min = _js.minWork
            _js.minWork = 2 ** 52
            _t.setdefault("one_thread", []).append(_time_head(_w))
            _js.minWork = _min
_heads.pop("q8_0", None)
json.dumps({{"prompt_tokens": len(_prompt), "fused_layers": _fused is not None, "rows": _rows, "head": _timed}})
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--head-reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None,
                        help="the page's ?threads= (default: its own, one a core); 1: no handoffs between threads")
    parser.add_argument("--quick", action="store_true", help="1 round of 8 new tokens, the head 3 times")
    parser.add_argument("--json", action="store_true", help="accepted for `python3 -m bench`")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.new, args.head_reps = 1, 8, 3
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    query = f"?model={args.model}&backend=cpu" + ("" if args.threads is None else f"&threads={args.threads}")
    with BrowserSession(query) as s:
        result = s.py(WORKER.format(text=TEXT, prompt=args.prompt, new=args.new, rounds=args.rounds,
                                    head_reps=args.head_reps))
        info = s.model_info
    rows = result["rows"]
    first = next(iter(rows.values()))[0]["output_ids"]
    mean = {name: round(sum(r["decode_tok_s"] for r in rs) / len(rs), 2) for name, rs in rows.items()}
    result.update({
        "model": args.model, "query": query, "cpu_linear": info.get("cpu_linear"), "new_tokens": args.new,
        "same_ids": all(r["output_ids"] == first for rs in rows.values() for r in rs),
        "mean_decode_tok_s": mean, "over_the_first": {name: round(v / next(iter(mean.values())), 3)
                                                      for name, v in mean.items()},
        "load_before": [round(v, 2) for v in load_before], "load_after": [round(v, 2) for v in os.getloadavg()],
        "wall_s": round(time.perf_counter() - t0, 1)})
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
