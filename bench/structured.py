"""Structured output (pagedkv.grammar) and forced tool calls on SmolLM2-135M: what constrained decoding costs.

    python3 -m bench.structured [--quick] [--no-tab] [--backend cpu|wgpu]

Prints one JSON object:
- `decode`: decode milliseconds per token of one greedy request in three modes: `plain` (free text: the backend
  returns argmax ids), `json_schema` (a response_format: logits rows come back and are masked on the host) and
  `tools` (one tool, tool_choice "required": the call is held to a grammar the same way). Same question, same
  engine, the same number of new tokens (max_tokens; every mode's reply is longer, so each ends at the limit).
  The time is the engine's steps' from the first new token to the last, over the tokens between (the prompt's
  prefill is out of it). The modes take turns round by round (plain, json_schema, tools, plain, ...), so a
  noisy neighbour on a shared machine hits each mode alike: per mode the rounds and their median, and
  `ratio_to_plain`, the median over the rounds of each round's ms/token against that round's plain one;
- `mask_ms`: the cost of one token's mask (GrammarMatcher.allowed) over SmolLM2's 49,152-token vocabulary,
  replayed on replies the schema produced (seeded samples at 0.8): `cold` with a fresh automaton (every state's
  row derived and its mask walked), `cached` the same tokens again (each state's mask a lookup); median, p95, max;
- `vocabulary_s` (the trie, once per tokenizer) and `compile_ms` (the schema to a grammar);
- `tab`: the same mask figures measured in the tab's Pyodide worker (bench/page/grammar_masks.py, both runs).
--backend wgpu: `decode` only, on the WebGPU backend through wgpu-py's adapter (lavapipe here) with the gpu
kernel family, where a plain greedy request picks its token on the device (and pipelines its decode steps) and
a grammar request reads a logits row back to the host every token: the figure shows that round trip.
Benchmarks print figures; nothing here passes or fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT))

from bench.page.grammar_masks import replay  # noqa: E402
from pagedkv.api import Engine  # noqa: E402

MODEL = ROOT / "dist" / "models" / "smollm2-135m-instruct"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "student": {"type": "boolean"},
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3},
    },
    "required": ["name", "age", "student", "color", "hobbies"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person as JSON with name, age, student, favourite color and hobbies."}]
REPLY_MAX_TOKENS = 100  # the seeds' replies: room for the whole object (they end at 30 to 60 tokens)
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
# The tools mode's one tool takes the same object: its call is as long as the schema mode's reply
TOOL = {"type": "function", "function": {"name": "record_person", "description": "Record a person's details",
                                         "parameters": SCHEMA}}
MODES = {"plain": {}, "json_schema": {"response_format": RESPONSE_FORMAT},
         "tools": {"tools": [TOOL], "tool_choice": "required"}}
# (rounds, new tokens per request): every mode's reply runs past the token count (the object takes 30+ tokens)
SIZES = {("cpu", False): (5, 16), ("cpu", True): (3, 8), ("wgpu", False): (5, 10), ("wgpu", True): (2, 6)}


class StepClock:
    """Wraps llm.step: when each new token came out (the step's end), for one request at a time."""

    def __init__(self, llm) -> None:
        self.arrivals: list[float] = []
        inner = llm.step

        async def step():
            outputs = await inner()
            now = time.perf_counter()
            self.arrivals += [now] * sum(len(o.token_ids) for o in outputs)
            return outputs

        llm.step = step  # the driving loop looks step up on the instance

    def ms_per_token(self) -> float:
        """Decode: from the first token to the last, over the tokens after the first."""
        a = self.arrivals
        return (a[-1] - a[0]) * 1e3 / (len(a) - 1)


async def decode_rounds(create, clock: StepClock, rounds: int, max_tokens: int) -> dict:
    """The modes in turn, `rounds` times; each request greedy with max_tokens new tokens."""
    await create(messages=ASK, max_tokens=2, temperature=0)  # warm-up: first-call costs, the cache
    rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode, fields in MODES.items():
            clock.arrivals = []
            out = await create(messages=ASK, max_tokens=max_tokens, temperature=0, **fields)
            tokens = out["usage"]["completion_tokens"]
            if tokens != max_tokens or len(clock.arrivals) != tokens:
                raise RuntimeError(f"{mode}: {tokens} tokens ({len(clock.arrivals)} timed), not {max_tokens}: "
                                   f"its reply ended early ({out['choices'][0]['finish_reason']})")
            rows[mode].append({"ms_per_token": round(clock.ms_per_token(), 2),
                               "prompt_tokens": out["usage"]["prompt_tokens"],
                               "finish_reason": out["choices"][0]["finish_reason"]})
    decode = {}
    for mode, runs in rows.items():
        ms = [r["ms_per_token"] for r in runs]
        ratios = [r["ms_per_token"] / p["ms_per_token"] for r, p in zip(runs, rows["plain"])]
        decode[mode] = {"ms_per_token_median": round(statistics.median(ms), 2),
                        "tok_s_median": round(1e3 / statistics.median(ms), 2), "rounds_ms_per_token": ms,
                        "ratio_to_plain": round(statistics.median(ratios), 3),
                        "rounds_ratio_to_plain": [round(x, 3) for x in ratios],
                        "prompt_tokens": runs[0]["prompt_tokens"], "finish_reason": runs[0]["finish_reason"]}
    return {"rounds": rounds, "tokens_per_request": max_tokens, "timer": "engine steps, first to last new token",
            "order": "interleaved: " + ", ".join(MODES) + ", then again", "modes": decode}


async def timed_request(create, **fields) -> dict:
    t0 = time.perf_counter()
    out = await create(messages=ASK, **fields)
    tokens = out["usage"]["completion_tokens"]
    return {"completion_tokens": tokens, "wall_s": round(time.perf_counter() - t0, 3),
            "finish_reasons": [c["finish_reason"] for c in out["choices"]],
            "contents": [c["message"]["content"] for c in out["choices"]]}


TAB = """
import json
from pyodide.http import open_url
from pagedkv.tokenizer import Tokenizer
from bench.page.grammar_masks import replay
manifest = json.loads(open_url("/models/smollm2-135m-instruct/model.json").read())
json.dumps(replay(Tokenizer.from_manifest(manifest), json.loads({schema!r}), json.loads({replies!r})))
"""


def in_the_tab(replies: list[str]) -> dict:
    """The same replay in the tab's Pyodide worker (Chromium, the page at bench.harness.QUERY)."""
    from bench.harness import install_bench, session

    with session() as page:
        install_bench(page, "page/grammar_masks.py")
        return page.py(TAB.format(schema=json.dumps(SCHEMA), replies=json.dumps(replies)), timeout_ms=600_000)


async def cpu_run(args, rounds: int, max_tokens: int, seeds: int) -> dict:
    """The CPU backend (api.Engine over numpy): decode, and the seeds' replies for the mask's replay."""
    engine = Engine([args.model], budget_mib=700)
    clock = StepClock(engine.llm)

    def create(**fields):
        return engine.chat.completions.acreate(model=engine.model_id, **fields)

    decode = await decode_rounds(create, clock, rounds, max_tokens)
    replies = [await timed_request(create, max_tokens=REPLY_MAX_TOKENS, temperature=0.8, seed=s,
                                   response_format=RESPONSE_FORMAT) for s in range(seeds)]
    texts = [r["contents"][0] for r in replies]
    return {
        "backend": "cpu (CpuBackend, numpy)", "decode": decode,
        "seeds": {"count": seeds, "max_tokens": REPLY_MAX_TOKENS,
                  "finished_stop": sum(r["finish_reasons"] == ["stop"] for r in replies),
                  "parsed": sum(_parses(t) for t in texts),
                  "completion_tokens": [r["completion_tokens"] for r in replies]},
        **replay(engine.services[engine.model_id].tokenizer, SCHEMA, texts), "replies": texts,
    }


class StepLoop:
    """api.Engine's step loop for a CompletionService over an LLMEngine of our own (here the WebGPU backend's)."""

    def __init__(self, llm) -> None:
        self.llm, self.service, self.task = llm, None, None

    def kick(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.drive())

    async def drive(self) -> None:
        while self.llm.has_unfinished:
            self.service.deliver(await self.llm.step())
            await asyncio.sleep(0)


async def wgpu_run(args, rounds: int, max_tokens: int) -> dict:
    """The WebGPU backend on wgpu-py's adapter, gpu kernel family: decode only (the mask is the same host work)."""
    from pagedkv.api import CompletionService
    from pagedkv.backends.webgpu.backend import WebGpuBackend
    from pagedkv.backends.webgpu.runtime import open_device
    from pagedkv.chat import ChatTemplate
    from pagedkv.engine import EngineConfig, LLMEngine
    from pagedkv.tokenizer import Tokenizer

    model_dir = Path(args.model)
    manifest = json.loads((model_dir / "model.json").read_text())

    async def source(name: str) -> bytes:
        return (model_dir / name).read_bytes()

    ctx = await open_device()
    chunk = 256
    backend = await WebGpuBackend.create(ctx, manifest, source, budget_bytes=700 << 20, block_size=16,
                                         kv_dtype="f16", max_num_batched_tokens=chunk, max_num_seqs=1,
                                         kernels="gpu")
    tokenizer = Tokenizer.from_manifest(manifest)
    llm = LLMEngine(backend, tokenizer, EngineConfig(max_num_batched_tokens=chunk, max_num_seqs=1))
    loop = StepLoop(llm)
    loop.service = CompletionService(llm, ChatTemplate.from_manifest(manifest, tokenizer), model_dir.name,
                                     manifest["config"]["context_length"], loop.kick)
    clock = StepClock(llm)

    def create(**fields):
        return loop.service.acreate(model=model_dir.name, **fields)

    try:
        decode = await decode_rounds(create, clock, rounds, max_tokens)
    finally:
        backend.destroy()
    return {"backend": "wgpu (WebGpuBackend, gpu kernel family, wgpu-py)", "adapter": ctx.info.name,
            "kv_dtype": "f16", "decode": decode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and tokens, 2 seeds not 5")
    parser.add_argument("--no-tab", action="store_true", help="skip the mask's cost in the tab's Pyodide worker")
    parser.add_argument("--backend", choices=("cpu", "wgpu"), default="cpu",
                        help="wgpu: decode on the WebGPU backend (wgpu-py's adapter, the gpu kernel family)")
    parser.add_argument("--model", default=str(MODEL), help="a model directory (default SmolLM2-135M in dist/)")
    args = parser.parse_args()
    rounds, max_tokens = SIZES[args.backend, args.quick]
    load_before = os.getloadavg()
    if args.backend == "wgpu":
        measured = asyncio.run(wgpu_run(args, rounds, max_tokens))
    else:
        measured = asyncio.run(cpu_run(args, rounds, max_tokens, 2 if args.quick else 5))
        texts = measured.pop("replies")
        # outside the event loop: the browser session's sync Playwright refuses to run inside one
        measured["tab"] = None if args.no_tab else {"where": "Pyodide in Chromium's worker (bench.harness page)",
                                                    **in_the_tab(texts)}
    load_after = os.getloadavg()
    print(json.dumps({
        "benchmark": "structured" if args.backend == "cpu" else "structured_wgpu", "quick": args.quick,
        "model": Path(args.model).name, "machine": platform.machine(), "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        # the machine is shared: wall-clock figures scale with what else runs (1, 5, 15-minute load averages)
        "load_average": {"start": [round(x, 2) for x in load_before], "end": [round(x, 2) for x in load_after]},
        **measured,
    }, indent=2))


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    main()
