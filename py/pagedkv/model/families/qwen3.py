"""Qwen3: qwen2's layer without biases, with a per-head RMSNorm of q and k before rotary (NEOX pairs); its heads
need not tile the hidden size (Qwen3-0.6B: 16 x 128 query dims against 1,024)."""
from ..family import Family

QWEN3 = Family(name="qwen3", rope_pairing="neox", qk_norm=True)
