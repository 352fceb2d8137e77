"""Qwen2 / Qwen2.5: llama's layer with q / k / v biases and rotary on "NEOX" pairs (i, i + head_dim/2).

The converter permutes each head's q and k rows (and biases) into adjacent pairs, which leaves every q . k
unchanged, so the backends keep one rotary.
"""
from ..family import Family

QWEN2 = Family(name="qwen2", rope_pairing="neox", attention_bias=True)
