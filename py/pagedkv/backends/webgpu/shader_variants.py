"""Kernel variants composed from parts: which shaders/ files, in which order, make e.g. `matvec_gpu_sg_q4_K`.

A variant is a kernel body (matvec_gpu_main.wgsl, matmul_nibble.wgsl, ...) preceded by the parts it is
written against: the weight format's bindings and decoders, the lane reduction, and the `enable` lines those
need. The axes are spelled out below as small tables; VARIANTS is their product, name -> Variant, the one
place a kernel name maps to part files (ShaderLibrary composes them; a name not here is a file of its own).
A later axis (a fused epilogue, say) is one more table and one more loop.
"""
from __future__ import annotations

from dataclasses import dataclass

SUBGROUPS = "enable subgroups;"
F16 = "enable f16;"


@dataclass(frozen=True)
class Variant:
    """A kernel made of `parts` (shaders/<part>.wgsl, in this order, the body last) under `enables`."""

    parts: tuple[str, ...]
    enables: tuple[str, ...] = ()

    def compose(self, name: str, sources: list[str]) -> str:
        """The WGSL of kernel `name`: the enable lines, a header naming the parts, then each part's
        (include-expanded) source, one blank line apart."""
        head = "".join(line + "\n" for line in self.enables) + ("\n" if self.enables else "")
        listed = " + ".join(f"{p}.wgsl" for p in self.parts)
        header = f"// {name}, composed by ShaderLibrary (backends/webgpu/shader_variants.py):\n// {listed}\n"
        return head + header + "\n" + "".join(source + "\n" for source in sources)


# ---------------------------------------------------------------- the axes

FLOATS = ("f32", "f16", "bf16")  # read through <type>_words.wgsl
# Nibble-coded types: <type>_weights.wgsl binds the scales and decodes a block's nibbles (nibble_codes.wgsl).
NIBBLE = ("q4_0", "q4_K", "q5_0", "q5_1", "q5_K", "q6_K")

# cpu family (software adapters): (parts before the body, body) per kernel and weight type. q4_1 and q8_0
# have matvec / matmul files of their own (matvec_q4_1.wgsl, ...); embedding.wgsl is q8_0's embedding.
CPU_KERNELS: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "embedding": {**{t: ((f"{t}_words",), "embedding_float") for t in FLOATS},
                  **{t: ((f"{t}_weights",), "embedding_nibble") for t in NIBBLE},
                  "q4_1": (("q4_1_scales",), "embedding_nibble")},
    "matvec": {**{t: ((f"{t}_words",), "matvec_float") for t in FLOATS},
               **{t: ((f"{t}_weights", "nibble_io"), "matvec_nibble") for t in NIBBLE}},
    "matmul": {**{t: ((f"{t}_words",), "matmul_float") for t in FLOATS},
               **{t: ((f"{t}_weights",), "matmul_nibble") for t in NIBBLE}},
}

# gpu family: a weight type's bindings and the lane decoder the body calls (gpu_*_words.wgsl), f32 math ...
GPU_WEIGHTS: dict[str, tuple[str, ...]] = {
    **{t: (f"{t}_words", "float_weights", "gpu_float_words") for t in FLOATS},
    **{t: (f"{t}_weights", "nibble_io", "gpu_nibble_words") for t in NIBBLE},
    "q4_1": ("q4_1_weights", "gpu_q4_1_words"),
    "q8_0": ("q8_0_weights", "gpu_q8_0_words"),
}
# ... and the types whose matvec also has an f16-arithmetic decoder (`enable f16;`, the device's shader-f16).
GPU_WEIGHTS_F16: dict[str, tuple[str, ...]] = {
    "q4_1": ("q4_1_weights", "gpu_q4_1_words_f16"),
    "q8_0": ("q8_0_weights", "gpu_q8_0_words_f16"),
}
# matmul_gpu_<type>: the matvec decoder's parts (its word_weights) over matmul_gpu_main.wgsl, every quantized type
GPU_MATMUL_TYPES = ("q4_1", "q8_0", *NIBBLE)

# Lane reductions of the gpu family: name suffix of matvec_gpu / paged_attention_gpu -> (enables, part).
# subgroupAdd where the device has subgroups, else a workgroup-memory tree.
REDUCTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "": ((), "reduce_tree"),
    "_sg": ((SUBGROUPS,), "reduce_subgroup"),
}
# What a gpu-family matvec reads and writes around its dot products (matvec_gpu_main.wgsl's load_x / store8):
# name suffix -> io part. _merge: the decode attention's partition merge as the output projection's prologue;
# _rope_kv: bias, RoPE and the KV-cache write as the q | k | v projection's epilogue; _argmax: the LM head of a
# greedy step writes each workgroup's best row, not logits (plan.layer_program).
MATVEC_IO: dict[str, str] = {"": "matvec_io", "_merge": "matvec_io_merge", "_rope_kv": "matvec_io_rope_kv",
                             "_argmax": "matvec_io_argmax"}


# The cpu family's attention by head width: name suffix -> the part sizing its private accumulator (a private
# array cannot take an override's size).
CPU_ATTENTION_HEADS: dict[str, str] = {"": "attention_heads_128", "_wide": "attention_heads_256"}


def _variants() -> dict[str, Variant]:
    table: dict[str, Variant] = {}
    for kernel, by_type in CPU_KERNELS.items():
        for dtype, (weights, body) in by_type.items():
            table[f"{kernel}_{dtype}"] = Variant((*weights, body))
    for sg, (enables, reduce) in REDUCTIONS.items():
        for io, io_part in MATVEC_IO.items():
            for dtype, weights in GPU_WEIGHTS.items():
                table[f"matvec_gpu{sg}_{dtype}{io}"] = Variant((*weights, reduce, io_part, "matvec_gpu_main"),
                                                               enables)
            for dtype, weights in GPU_WEIGHTS_F16.items():
                table[f"matvec_gpu{sg}_f16_{dtype}{io}"] = Variant((*weights, reduce, io_part, "matvec_gpu_main"),
                                                                   (*enables, F16))
        table[f"paged_attention_gpu{sg}"] = Variant(("paged_kv_read", reduce, "paged_attention_gpu_main"), enables)
    for dtype in GPU_MATMUL_TYPES:
        table[f"matmul_gpu_{dtype}"] = Variant((*GPU_WEIGHTS[dtype], "matmul_gpu_main"))
    for suffix, heads in CPU_ATTENTION_HEADS.items():
        for kernel in ("paged_attention", "paged_prefill_attention"):
            table[f"{kernel}{suffix}"] = Variant((heads, f"{kernel}_main"))
    return table


VARIANTS: dict[str, Variant] = _variants()
