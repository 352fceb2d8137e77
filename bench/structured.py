"""Structured output (pagedkv.grammar) on SmolLM2-135M, CPU backend: what constrained decoding costs.

    python3 -m bench.structured [--quick]

Prints one JSON object:
- `decode`: completion tokens per second of one request (the prompt's blocks cached by a warm-up request; the
  modes take turns, ROUNDS rounds, and each keeps its best round: the machine is shared), free text (greedy: the backend returns argmax ids;
  and sampled at 0.8) and with a json_schema response_format (greedy and 0.8: logits rows come back and are
  masked on the host), same prompt, same engine, one after another;
- `mask_ms`: the cost of one token's mask (GrammarMatcher.allowed) over SmolLM2's 49,152-token vocabulary,
  replayed on the replies the schema runs produced: `cold` with a fresh automaton (every state's row derived and
  its mask walked), `cached` the same tokens again (each state's mask a lookup); median, p95 and max;
- `vocabulary_s` (the trie, once per tokenizer) and `compile_ms` (the schema to a grammar);
- `tab`: the same mask figures measured in the tab's Pyodide worker (bench/page/grammar_masks.py, both runs).
Benchmarks print figures; nothing here passes or fails.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
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
ROUNDS = 3
REPLY_MAX_TOKENS = 100  # the seeds' replies: room for the whole object (they end at 30 to 60 tokens)
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}


def timed_request(engine: Engine, **fields) -> dict:
    t0 = time.perf_counter()
    out = engine.chat.completions.create(model=engine.model_id, messages=ASK, **fields)
    wall = time.perf_counter() - t0
    tokens = out["usage"]["completion_tokens"]
    return {"completion_tokens": tokens, "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 2),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds and 24 tokens, not 5 and 48")
    parser.add_argument("--no-tab", action="store_true", help="skip the mask's cost in the tab's Pyodide worker")
    args = parser.parse_args()
    seeds, max_tokens = (2, 24) if args.quick else (5, 48)
    load_before = round(os.getloadavg()[0], 2)
    engine = Engine([MODEL], budget_mib=700)
    timed_request(engine, max_tokens=4, temperature=0)  # warm up: first-call costs out of the figures
    modes = {"plain_greedy": {"temperature": 0}, "plain_t0.8": {"temperature": 0.8, "seed": 0},
             "json_schema_greedy": {"temperature": 0, "response_format": RESPONSE_FORMAT},
             "json_schema_t0.8": {"temperature": 0.8, "seed": 0, "response_format": RESPONSE_FORMAT}}
    rounds: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(ROUNDS):
        for mode, fields in modes.items():
            rounds[mode].append(timed_request(engine, max_tokens=max_tokens, **fields))
    decode = {mode: {**max(rows, key=lambda r: r["tok_s"]), "rounds_tok_s": [r["tok_s"] for r in rows]}
              for mode, rows in rounds.items()}
    replies = [timed_request(engine, max_tokens=REPLY_MAX_TOKENS, temperature=0.8, seed=s,
                             response_format=RESPONSE_FORMAT) for s in range(seeds)]
    for row in decode.values():
        row.pop("contents")
    valid = sum(r["finish_reasons"] == ["stop"] for r in replies)
    result = {
        "benchmark": "structured", "quick": args.quick, "model": MODEL.name, "backend": "cpu (CpuBackend, numpy)",
        "machine": platform.machine(), "python": platform.python_version(), "max_tokens": max_tokens,
        # the machine is shared: wall-clock figures scale with what else runs (1-minute load average, start/end)
        "load_average": [load_before, round(os.getloadavg()[0], 2)],
        "decode": decode,
        "seeds": {"count": seeds, "max_tokens": REPLY_MAX_TOKENS, "finished_stop": valid,
                  "parsed": sum(_parses(r["contents"][0]) for r in replies),
                  "completion_tokens": [r["completion_tokens"] for r in replies]},
        **replay(engine.services[engine.model_id].tokenizer, SCHEMA, [r["contents"][0] for r in replies]),
        "tab": None if args.no_tab else {"where": "Pyodide in Chromium's worker (bench.harness page)",
                                         **in_the_tab([r["contents"][0] for r in replies])},
        "wgpu": "not measured (time on a shared 2-core machine); the mask is host work, the same on every backend, "
                "and a grammar request there returns logits rows instead of drawing on the device",
    }
    print(json.dumps(result, indent=2))


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    main()
