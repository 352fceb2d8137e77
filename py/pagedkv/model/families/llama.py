"""Llama (2, 3.x; also TinyLlama, SmolLM2): RMSNorm before attention and FFN, SwiGLU, rotary on every layer.

llama.cpp's converter permutes a llama model's q / k rows so rotary pairs are adjacent dims (2i, 2i+1), which is
how llama.cpp ("NORM" rope) and every backend here rotate. Llama 3's rope scaling arrives as the file's
rope_freqs.weight factors, linear scaling as rope.scaling.*: the config holds both.
"""
from ..family import Family

LLAMA = Family(name="llama", rope_pairing="adjacent", attention_bias=True)
