"""The app page's own engine, timed in the tab for bench/wllama.py: one row per ?backend= (auto, webgpu, cpu).

Each row boots the real page (`?model=smollm2-135m-instruct&backend=X`) in the benchmark's browser, waits for
its model, and times the page's engine step by step on the prompt's ids, greedy: the path a person gets.
wasm_heap_mib: the worker's wasm memory after the run (wasm32: 4 GiB at most, less where the browser says so).
"""
from __future__ import annotations

import json

from bench.harness.browser import open_and_boot, wait_model

MODEL = "smollm2-135m-instruct"
TIMEOUT_MS = 1_800_000

TIMED = """
import json, time
import pyodide_js
from pagedkv_app.main import state
from pagedkv.sampling import SamplingParams
_engine = state["engine"]
_times, _out = [], []
_rid = _engine.add_request({prompt!r}, SamplingParams(max_tokens={new}, stop_token_ids=(1_000_000,)))
while _engine.has_unfinished:
    _t0 = time.perf_counter()
    _outs = await _engine.step()
    _times.append(time.perf_counter() - _t0)
    _out += [t for o in _outs if o.request_id == _rid for t in o.token_ids]
_n_prefill = len(_times) - len(_out) + 1
json.dumps({{"prefill_tok_s": len({prompt!r}) / sum(_times[:_n_prefill]),
            "decode_tok_s": (len(_times) - _n_prefill) / sum(_times[_n_prefill:]), "output_ids": _out,
            "prefill_steps": _n_prefill, "wasm_heap_mib": pyodide_js._module.HEAP8.length / 2**20}})
"""


def tab_row(s, backend: str, prompt: list[int], new_tokens: int) -> dict:
    """Prefill / decode tok/s of the page at ?backend=`backend` (auto: the page's default, no parameter).
    On WebGPU a first pass over a reversed prompt (no shared prefix, so no cache hit) records the plans, as
    bench_generate's first run does; the numpy path has nothing to record."""
    query = f"?model={MODEL}" + ("" if backend == "auto" else f"&backend={backend}")
    booted = open_and_boot(s.browser, s.origin + "/" + query, TIMEOUT_MS, TIMEOUT_MS)
    try:
        info = wait_model(booted, TIMEOUT_MS)
        adapter = json.loads(booted.dataset()["adapter"])
        if info["backend"] == "webgpu":
            booted.py(TIMED.format(prompt=prompt[::-1], new=2))
        row = booted.py(TIMED.format(prompt=prompt, new=new_tokens))
    finally:
        booted.page.close()
    chosen = info["backend"]
    label = f"auto → {chosen} in the tab" if backend == "auto" else f"{chosen} in the tab"
    return {"backend": label, "asked": backend, "chosen": chosen, "reason": adapter["backend_reason"],
            "kernels": adapter["kernels"] if chosen == "webgpu" else None, **row}
