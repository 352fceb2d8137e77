"""The qwen3 / smollm3 / gemma3 test GGUFs (tests/gguf_models.py TINY_FAMILIES) load in llama.cpp, which
generates from them with top-1/top-2 margins wide enough for greedy ids to be compared (the near-tie rule's
0.5). Only llama.cpp runs them here: our engine does not take these architectures yet."""
from __future__ import annotations

import numpy as np
import pytest
from gguf_models import TINY_FAMILIES, tiny_gguf
from llama_reference import NEAR_TIE, llama_cpp_greedy
from model_fixtures import gguf_path  # noqa: F401  (pytest fixture)

NUM_TOKENS = 16
# (recipe, prompt length): 40 tokens each; tiny-gemma3 also past 3 of its 32-position windows.
CASES = [(name, 40) for name in sorted(TINY_FAMILIES)] + [("tiny-gemma3", 100)]


def prompt(n: int) -> list[int]:
    """n fixed ids of ordinary tokens (SmolLM2's special tokens are ids 0..16)."""
    return np.random.default_rng(n).integers(100, 49152, n).tolist()


@pytest.mark.parametrize(("name", "length"), CASES)
def test_llama_cpp_generates_with_clear_margins(gguf_path, name, length):  # noqa: F811
    ref = llama_cpp_greedy(tiny_gguf(name, gguf_path), prompt(length), NUM_TOKENS)
    margins = [m for m in ref["margins"] if m is not None]
    print(name, length, ref["output_ids"], [round(m, 2) for m in margins])  # pytest -s
    assert len(ref["output_ids"]) == NUM_TOKENS
    assert len(set(ref["output_ids"])) > 1, ref  # not one token echoed
    assert margins and np.median(margins) > NEAR_TIE, ref
