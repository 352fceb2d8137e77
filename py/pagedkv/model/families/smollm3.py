"""SmolLM3: llama's layer, but every fourth layer (3, 7, 11, ...) has no rotary ("NoPE"); llama.cpp fixes the
period at 4 (its n_no_rope_layer_step), the file does not store it."""
from ..family import Family

SMOLLM3 = Family(name="smollm3", rope_pairing="adjacent", no_rope_every=4)
