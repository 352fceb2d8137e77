"""Structured output (pagedkv.grammar) on SmolLM2-135M, CPU backend: what constrained decoding costs.

    python3 -m bench.structured [--quick]

Prints one JSON object:
- `decode`: completion tokens per second of one request, free text (greedy: the backend returns argmax ids;
  and sampled at 0.8) and with a json_schema response_format (greedy and 0.8: logits rows come back and are
  masked on the host), same prompt, same engine, one after another;
- `mask_ms`: the cost of one token's mask (GrammarMatcher.allowed) over SmolLM2's 49,152-token vocabulary,
  replayed on the replies the schema runs produced: `cold` with a fresh automaton (every state's row derived and
  its mask walked), `cached` the same tokens again (each state's mask a lookup); median, p95 and max;
- `vocabulary_s` (the trie, once per tokenizer) and `compile_ms` (the schema to a grammar).
Benchmarks print figures; nothing here passes or fails.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from pagedkv.api import Engine  # noqa: E402
from pagedkv.grammar import Grammar  # noqa: E402
from pagedkv.grammar.automaton import Automaton  # noqa: E402
from pagedkv.grammar.masks import TokenMasks  # noqa: E402
from pagedkv.grammar.matcher import GrammarMatcher  # noqa: E402
from pagedkv.grammar.vocabulary import TokenVocabulary  # noqa: E402

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
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}


def timed_request(engine: Engine, **fields) -> dict:
    t0 = time.perf_counter()
    out = engine.chat.completions.create(model=engine.model_id, messages=ASK, **fields)
    wall = time.perf_counter() - t0
    tokens = out["usage"]["completion_tokens"]
    return {"completion_tokens": tokens, "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 2),
            "finish_reasons": [c["finish_reason"] for c in out["choices"]],
            "contents": [c["message"]["content"] for c in out["choices"]]}


def percentiles(values: list[float]) -> dict:
    ms = np.array(values) * 1000
    return {"median": round(float(np.median(ms)), 3), "p95": round(float(np.percentile(ms, 95)), 3),
            "max": round(float(ms.max()), 3), "n": len(values)}


def mask_costs(engine: Engine, replies: list[str]) -> dict:
    """Mask cost per token, replaying `replies` (their tokens as the model chose them) cold, then cached."""
    tokenizer = engine.services[engine.model_id].tokenizer
    t0 = time.perf_counter()
    vocab = TokenVocabulary([None if tokenizer.is_special(i) else tokenizer.token_bytes(i) or None
                             for i in range(tokenizer.vocab_size)])  # built afresh, as for a new tokenizer
    vocabulary_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = Grammar.json_schema(SCHEMA)
    compile_ms = (time.perf_counter() - t0) * 1000
    masks = TokenMasks(Automaton(grammar.term), vocab)
    stops = frozenset({tokenizer.eos_token_id, tokenizer.im_end_id})
    runs: dict[str, list[float]] = {"cold": [], "cached": []}
    for phase in runs:
        for reply in replies:
            matcher = GrammarMatcher(masks, stops)
            for token in tokenizer.encode(reply) + [tokenizer.im_end_id]:
                t0 = time.perf_counter()
                allowed = matcher.allowed()
                runs[phase].append(time.perf_counter() - t0)
                if not allowed[token]:  # the encoder may split a reply other than the model did: skip it
                    break
                matcher.advance(token)
    return {"vocabulary_s": round(vocabulary_s, 3), "compile_ms": round(compile_ms, 3),
            "trie_nodes": vocab.num_nodes, "states": masks.automaton.num_states,
            "mask_ms": {phase: percentiles(v) for phase, v in runs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds and 32 tokens, not 10 and 100")
    args = parser.parse_args()
    seeds, max_tokens = (3, 32) if args.quick else (10, 100)
    engine = Engine([MODEL], budget_mib=700)
    timed_request(engine, max_tokens=4, temperature=0)  # warm up: first-call costs out of the figures
    decode = {
        "plain_greedy": timed_request(engine, max_tokens=max_tokens, temperature=0),
        "plain_t0.8": timed_request(engine, max_tokens=max_tokens, temperature=0.8, seed=0),
        "json_schema_greedy": timed_request(engine, max_tokens=max_tokens, temperature=0,
                                            response_format=RESPONSE_FORMAT),
        "json_schema_t0.8": timed_request(engine, max_tokens=max_tokens, temperature=0.8, seed=0,
                                          response_format=RESPONSE_FORMAT),
    }
    replies = [timed_request(engine, max_tokens=max_tokens, temperature=0.8, seed=s,
                             response_format=RESPONSE_FORMAT) for s in range(seeds)]
    for row in decode.values():
        row.pop("contents")
    valid = sum(r["finish_reasons"] == ["stop"] for r in replies)
    result = {
        "benchmark": "structured", "quick": args.quick, "model": MODEL.name, "backend": "cpu (numpy reference)",
        "machine": platform.machine(), "python": platform.python_version(), "max_tokens": max_tokens,
        "decode": decode,
        "seeds": {"count": seeds, "finished_stop": valid,
                  "parsed": sum(_parses(r["contents"][0]) for r in replies),
                  "completion_tokens": [r["completion_tokens"] for r in replies]},
        **mask_costs(engine, [r["contents"][0] for r in replies]),
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
