"""Write tests/golden/gemma3_golden.json: llama.cpp's greedy ids on the pinned Gemma 3 270M GGUF (a base model:
raw completions, no chat template).

For each prompt text: llama.cpp's own tokenization (`/tokenize`, BOS added as the file says), then 24 greedy ids
from its `/completion` with the top-1 minus top-2 logprob margin at each (None where the server reports none: a
token ending inside a UTF-8 character). The last prompt is longer than 1,500 tokens and states a fact only at its
start, so Gemma's 512-token window layers cannot see it and only its global layers can. Nothing from `pagedkv`
makes the ids (the GGUF is fetched by its pinned helper only).

    python3 tests/golden/make_gemma3_golden.py
"""
from __future__ import annotations

import json
import random
import sys
import urllib.request
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent / "py"))

from llama_reference import _complete, _margins  # noqa: E402
from llama_server import llama_server  # noqa: E402
from model_fixtures import cached_gemma3_gguf  # noqa: E402

from pagedkv.model.convert import GEMMA3_GGUF_SHA256  # noqa: E402

NUM_TOKENS = 24
OUT = HERE / "gemma3_golden.json"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "Q: What is 17 multiplied by 3?\nA:",
    "Die Hauptstadt von Deutschland ist",
    "The three primary colors are",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
]
SUBJECTS = ["The river", "A merchant", "The old bridge", "Every winter", "The library", "A young painter",
            "The harbour", "Our neighbour", "The mountain road", "A quiet student"]
VERBS = ["carried", "remembered", "painted", "described", "counted", "followed", "visited", "guarded"]
OBJECTS = ["the boats of the morning", "a map of the northern valleys", "forty lanterns", "the names of the stars",
           "a basket of green apples", "the songs of the market", "the ruins near the lake", "a letter from the coast"]


def long_prompt(seed: int = 20261206, sentences: int = 190) -> str:
    """A fact at the start, ~1,600 tokens of seeded filler, then the question about the fact."""
    rng = random.Random(seed)
    filler = " ".join(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(sentences))
    return ("Remember this: the password of the blue door is OCTOPUS-417.\n\n" + filler +
            "\n\nQuestion: what is the password of the blue door?\nAnswer: the password of the blue door is")


def tokenize(origin: str, text: str) -> list[int]:
    req = urllib.request.Request(origin + "/tokenize", data=json.dumps({"content": text, "add_special": True,
                                                                        "parse_special": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())["tokens"]


def main() -> None:
    gguf = cached_gemma3_gguf()
    cases = []
    with llama_server(gguf, n_ctx=4096) as origin:
        for text in [*PROMPTS, long_prompt()]:
            ids = tokenize(origin, text)
            answer = _complete(origin, ids, NUM_TOKENS)
            out = answer["tokens"]
            margins = dict(_margins(answer, out))
            cases.append({"text": text, "prompt_ids": ids, "output_ids": out,
                          "margins": [None if margins.get(i) is None else round(margins[i], 4)
                                      for i in range(NUM_TOKENS)]})
            print(len(ids), out[:6], file=sys.stderr)
    if len(cases[-1]["prompt_ids"]) <= 1500:
        raise SystemExit(f"the long prompt is only {len(cases[-1]['prompt_ids'])} tokens")
    OUT.write_text(json.dumps({"gguf_sha256": GEMMA3_GGUF_SHA256, "xllamacpp": version("xllamacpp"),
                               "num_tokens": NUM_TOKENS, "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}: {len(cases)} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
