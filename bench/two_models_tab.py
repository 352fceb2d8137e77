"""Two models streaming at once in the tab: tokens/s of each alone and together, one engine, one budget.

    python3 -m bench.two_models_tab [--quick] [--tokens 48] [--budget-mib 512]

pagedkv.js in headless Chromium, on the CPU path (what `auto` picks without a GPU, and the only path several
models take today): createEngine({models: ["smollm2-135m-instruct", <the same pinned GGUF as a File named
smollm2-copy.gguf>]}) loads two 135M-class models (SmolLM2-135M's widths: the GGUF converted and stored by the
worker as a user's file is) into one engine: their weights and one KV pool in --budget-mib. Then, greedy, the same
prompt: model A streams --tokens alone, model B alone, then both at once. Tokens/s counts the chunks after the first
(decode only; the first chunk ends the prefill) over the time between the first and the last; "together" is
each stream's own rate while both run. Also the time each createEngine stage took and the pool's pages.

Why not the seeds' pair (SmolLM2-135M + a 1.5B-class model) here: the tab's CPU path holds a 1.5B Q4_K model's
~0.9 GB of weights in wasm memory next to the page buffer, and decodes it at a few tokens per second on 2 cores;
its figures would be this machine's, not a user's. bench/two_models.py measures that pair's memory (the
allocators, the same workload). Figures only; nothing passes or fails on them.
"""
from __future__ import annotations

import argparse
import sys
import time

from bench import emit
from bench.wllama import make_server  # dist/ plus /bench/model.gguf: the pinned SmolLM2 GGUF
from harness.page import BrowserSession

GGUF_URL = "/bench/model.gguf"

RUN = """async ([url, tokens, budget]) => {
  const { createEngine } = await import("/pagedkv.js");
  const bytes = await (await fetch(url)).arrayBuffer();
  const t0 = performance.now();
  const stages = {};
  const e = await createEngine({ models: ["smollm2-135m-instruct", new File([bytes], "smollm2-copy.gguf")],
                                 backend: "cpu", budgetMiB: budget,
                                 onProgress: (p) => { stages[p.stage] = performance.now() - t0; } });
  const loadMs = performance.now() - t0;
  const [a, b] = (await e.models.list()).data.map((m) => m.id);
  const messages = [{ role: "user", content: "Tell me a long story about a lighthouse keeper and the sea." }];
  const stream = async (model) => {
    const times = [];
    let text = "";
    for await (const c of await e.chat.completions.create({ model, messages, max_tokens: tokens, temperature: 0,
                                                            stream: true })) {
      const piece = c.choices[0]?.delta.content;
      if (piece) { times.push(performance.now()); text += piece; }
    }
    const decode = times.length - 1;
    return { chunks: times.length, start: times[0], end: times[times.length - 1],
             tokens_per_s: decode > 0 ? decode / ((times[times.length - 1] - times[0]) / 1000) : null, text };
  };
  await stream(a);  // warm: the first forward of each model pays one-time costs
  await stream(b);
  const aloneA = await stream(a), aloneB = await stream(b);
  const [togetherA, togetherB] = await Promise.all([stream(a), stream(b)]);
  const stats = await e.stats();
  e.close?.();
  return { models: [a, b], load_ms: loadMs, stages, info: { backend: e.info.backend, reason: e.info.backend_reason,
           page_bytes: e.info.page_bytes }, alone: [aloneA, aloneB], together: [togetherA, togetherB],
           pool: stats.pool, preemptions: [stats[a].preemptions, stats[b].preemptions] };
}"""


def measure(tokens: int = 48, budget_mib: int = 512) -> dict:
    """The figures of the module docstring (bench/two_models.py puts them in its result under "tab")."""
    with BrowserSession("?model=tiny-random&backend=cpu", make_server=make_server) as s:
        t0 = time.perf_counter()
        got = s.page.evaluate(RUN, [GGUF_URL, tokens, budget_mib])
        wall = time.perf_counter() - t0
    rows = {}
    for i, model in enumerate(got["models"]):
        alone, together = got["alone"][i], got["together"][i]
        rows[model] = {"alone_tokens_per_s": alone["tokens_per_s"], "together_tokens_per_s": together["tokens_per_s"],
                       "together_over_alone": (together["tokens_per_s"] / alone["tokens_per_s"]
                                               if alone["tokens_per_s"] and together["tokens_per_s"] else None),
                       "chunks": [alone["chunks"], together["chunks"]],
                       "same_text_alone_and_together": alone["text"] == together["text"]}
    a, b = got["together"]
    overlap = max(0.0, min(a["end"], b["end"]) - max(a["start"], b["start"])) / 1000
    return {"tokens": tokens, "budget_mib": budget_mib,
            "models_note": "SmolLM2-135M built in + the same GGUF opened as a File (two 135M-class models)",
            "backend": got["info"], "load_ms": round(got["load_ms"]),
            "load_stages_ms": {k: round(v) for k, v in got["stages"].items()},
            "per_model": rows, "streams_overlap_s": round(overlap, 2),
            "combined_together_tokens_per_s": sum(r["together_tokens_per_s"] or 0 for r in rows.values()),
            "pool": got["pool"], "preemptions": got["preemptions"], "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="24 tokens a stream")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--budget-mib", type=int, default=512)
    args = ap.parse_args(argv)
    out = measure(24 if args.quick else args.tokens, args.budget_mib)
    emit({"benchmark": "two_models_tab", **out,
          "command": "python3 -m bench.two_models_tab" + (" --quick" if args.quick else "")})


if __name__ == "__main__":
    sys.exit(main())
