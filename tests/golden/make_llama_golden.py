"""Produce tests/golden/llama_golden.json with llama.cpp (llama-cpp-python) on the pinned SmolLM2 GGUF.

Independent reference for the numpy forward: llama.cpp tokenizes each rendered
ChatML prompt (special tokens on), evaluates it in one batch, then decodes
greedily one token at a time, recording every position's top-1/top-2 logit
margin and the first position's top-10 logits. The test suite only reads the
JSON; it never needs llama_cpp.

    pip install llama-cpp-python gguf jinja2   # builds llama.cpp from source
    python3 tests/golden/make_llama_golden.py [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "py"))

from pagedkv.model.convert import SMOLLM2_GGUF_SHA256, fetch_smollm2_gguf  # noqa: E402

NUM_TOKENS = 24
OUT = Path(__file__).with_name("llama_golden.json")

PARAGRAPH = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a goldsmith "
    "from Mainz, combined several existing technologies into a practical system for mass-producing books. "
    "Movable type had been used in East Asia for centuries, but Gutenberg's metal type, cast in a hand mould, "
    "together with an oil-based ink and a screw press adapted from wine making, made printing fast and cheap "
    "enough to change European society. Within fifty years, presses operated in more than two hundred cities, "
    "and millions of volumes had been printed. Literacy rose, scholars could compare identical copies of texts, "
    "and ideas travelled faster than ever before. Historians link the press to the Renaissance, the Reformation "
    "and the Scientific Revolution, although they still debate how large its role really was. Critics at the "
    "time worried that cheap books would spread errors and dangerous opinions, a complaint that sounds familiar "
    "in the age of the internet."
)

CHATS = [
    ("short_fact", [{"role": "user", "content": "What is the capital of France?"}]),
    ("poem", [{"role": "user", "content": "Write a short poem about the sea."}]),
    ("explain", [{"role": "user", "content": "Explain what a hash table is in two sentences."}]),
    ("code", [{"role": "user", "content": "Write a Python function that returns the factorial of n."}]),
    (
        "multi_turn",
        [
            {"role": "system", "content": "You are a concise math tutor."},
            {"role": "user", "content": "What is 12 * 7?"},
            {"role": "assistant", "content": "12 * 7 = 84."},
            {"role": "user", "content": "And what is that divided by 4? Explain the steps."},
        ],
    ),
    ("long_paragraph", [{"role": "user", "content": "Summarize the following text in three sentences.\n\n" + PARAGRAPH}]),
    ("french", [{"role": "user", "content": "Quelle est la capitale de l'Allemagne ? Réponds en une phrase, s'il te plaît."}]),
    ("russian", [{"role": "user", "content": "Расскажи коротко о Москве."}]),
]


def render(template_source: str, messages: list[dict]) -> str:
    """Render the GGUF's chat template as Hugging Face does (sandboxed jinja2, trim/lstrip blocks)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template_source).render(messages=messages, add_generation_prompt=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "models")
    args = parser.parse_args()

    import gguf
    import llama_cpp

    gguf_path = fetch_smollm2_gguf(args.cache)
    template = gguf.GGUFReader(gguf_path).fields["tokenizer.chat_template"].contents()
    llm = llama_cpp.Llama(
        model_path=str(gguf_path), n_ctx=2048, n_batch=512, logits_all=True, n_threads=2, seed=0, verbose=False
    )
    cases = []
    for name, messages in CHATS:
        prompt = render(template, messages)
        prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(prompt_ids)  # one batched prefill
        output_ids, margins = [], []
        first_top10 = None
        for step in range(NUM_TOKENS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)  # (vocab,)
            order = np.argsort(-logits, kind="stable")
            if step == 0:
                first_top10 = {"ids": order[:10].tolist(), "logits": [float(logits[i]) for i in order[:10]]}
            output_ids.append(int(order[0]))
            margins.append(float(logits[order[0]] - logits[order[1]]))
            llm.eval([int(order[0])])  # incremental decode, one token
        text = llm.detokenize(output_ids).decode("utf-8", errors="replace")
        cases.append(
            {
                "name": name,
                "messages": messages,
                "prompt_text": prompt,
                "prompt_ids": prompt_ids,
                "output_ids": output_ids,
                "output_text": text,
                "top1_top2_margins": margins,
                "first_top10": first_top10,
            }
        )
        print(f"{name}: {len(prompt_ids)} prompt tokens, min margin {min(margins[:16]):.3f}: {text!r}")
    golden = {
        "note": "llama.cpp greedy decoding of the pinned GGUF; prompt prefilled in one batch, then one token per "
        "eval; continues past <|im_end|> so every case has the same length. Produced by make_llama_golden.py.",
        "versions": {
            "llama_cpp_python": version("llama_cpp_python"),
            "gguf": version("gguf"),
            "numpy": np.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "gguf_sha256": SMOLLM2_GGUF_SHA256,
        "num_tokens": NUM_TOKENS,
        "cases": cases,
    }
    OUT.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
