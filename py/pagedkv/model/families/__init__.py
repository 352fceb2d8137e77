"""Every model family the engine runs, one declaration a file (model/family.py says what a declaration holds).

Adding a family is a file here, its GGUF tensor names in the converter if they are new, and goldens.
"""
from __future__ import annotations

from ..family import Family
from .gemma3 import GEMMA3
from .llama import LLAMA
from .qwen2 import QWEN2
from .qwen3 import QWEN3
from .smollm3 import SMOLLM3

FAMILIES: dict[str, Family] = {f.name: f for f in (LLAMA, QWEN2, QWEN3, GEMMA3, SMOLLM3)}
