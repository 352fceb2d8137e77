"""Kernel variants composed from parts: which shaders/ files, in which order, make e.g. `matvec_gpu_sg_q4_K`.

A variant is a kernel body (matvec_gpu_main.wgsl, matmul_nibble.wgsl, ...) preceded by the parts it is
written against: the weight format's bindings and decoders, the lane reduction, and the `enable` lines those
need. The axes are spelled out below as small tables; VARIANTS is their product, name -> Variant, the one
place a kernel name maps to part files (ShaderLibrary composes them; a name not here is a file of its own).
A later axis (a fused epilogue, say) is one more table and one more loop.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .wgsl_instance import instance

SUBGROUPS = "enable subgroups;"
F16 = "enable f16;"


@dataclass(frozen=True)
class Variant:
    """A kernel made of `parts` (shaders/<part>.wgsl, in this order, the body last) under `enables`."""

    parts: tuple[str, ...]
    enables: tuple[str, ...] = ()
    # (prefix, parts, binding offset): a second decoder composed under a name prefix (wgsl_instance.py), before
    # the body; its sources follow the parts' in compose()
    instances: tuple[tuple[str, tuple[str, ...], int], ...] = ()
    # storage bindings the parts declare `read` that this kernel writes (the fold's KV cache: its new row)
    writable: tuple[str, ...] = ()

    @property
    def all_parts(self) -> tuple[str, ...]:
        """The part files whose sources compose() takes, in its order: the parts, then each instance's."""
        return (*self.parts, *(p for _, parts, _ in self.instances for p in parts))

    def compose(self, name: str, sources: list[str]) -> str:
        """The WGSL of kernel `name` from the (include-expanded) sources of all_parts: the enable lines, a
        header naming the parts, then each part's source, one blank line apart, the instances renamed
        (wgsl_instance.instance) in front of the body."""
        head = "".join(line + "\n" for line in self.enables) + ("\n" if self.enables else "")
        listed = " + ".join(f"{p}.wgsl" for p in self.parts)
        for prefix, parts, offset in self.instances:
            listed += f"\n// {prefix}* instance (bindings + {offset}): " + " + ".join(f"{p}.wgsl" for p in parts)
        header = f"// {name}, composed by ShaderLibrary (backends/webgpu/shader_variants.py):\n// {listed}\n"
        own, rest = sources[: len(self.parts)], sources[len(self.parts):]
        renamed = []
        for prefix, parts, offset in self.instances:
            renamed.append(instance("\n".join(rest[: len(parts)]), prefix, offset))
            rest = rest[len(parts):]
        body = [*own[:-1], *renamed, own[-1]]
        text = head + header + "\n" + "".join(source + "\n" for source in body)
        for name in self.writable:
            text, n = re.subn(rf"var<storage, read> {name} :", f"var<storage, read_write> {name} :", text)
            if n != 1:
                raise ValueError(f"{name}: {n} `var<storage, read> {name}` declarations in the parts of {name!r}, "
                                 "expected 1")
        return text


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


# ffn_gpu[_sg][_f16]_<gate|up>_<down>: a decode layer's gate | up and down in one dispatch (ffn_gpu_main.wgsl),
# down's decoder a `down_` instance at bindings 16.. (wgsl_instance.py). The (gate | up, down) type pairs: each
# type with itself, and llama.cpp's K-quant mixes whose down is wider (Q4_K_M, Q5_K_M: q6_K down); with the
# f16-arithmetic decoders (`enable f16;`) where both types have one. Any other pair keeps two dispatches
# (plan.py): every pair of 11 types would compile 242 kernels for mixes no model file has.
FFN_DOWN_PREFIX, FFN_DOWN_BINDINGS = "down_", 16
FFN_PAIRS = (*((t, t) for t in GPU_WEIGHTS), ("q4_K", "q6_K"), ("q5_K", "q6_K"))
FFN_F16_TYPES = tuple(GPU_WEIGHTS_F16)


def ffn_gpu_shader(gate_up: str, down: str, subgroups: bool, f16: bool) -> str:
    """ffn_gpu[_sg][_f16]_<gate|up type>_<down type>: the f16 decoders only where both types have one."""
    f16 = f16 and gate_up in FFN_F16_TYPES and down in FFN_F16_TYPES
    return f"ffn_gpu_{'sg_' if subgroups else ''}{'f16_' if f16 else ''}{gate_up}_{down}"


# paged_attention_gpu[_sg]_fold[_f16]_<q|k|v type>: the decode attention that computes its own q | k | v
# (paged_attention_gpu_fold.wgsl, entry point main_fold): the weight type's decoder with attention_qkv_io.wgsl and
# matvec_gpu_rows.wgsl as a `qkv_` instance at bindings 16.. (its x at 16 + the type's parts, its uniform 2 later),
# the KV cache bindings writable (the new token's row); the f16-arithmetic decoder where the q | k | v matvec it
# replaces would run one (the same dot products).
FOLD_PREFIX, FOLD_BINDINGS = "qkv_", 16


def fold_shader(dtype: str, subgroups: bool, f16: bool = False) -> str:
    """paged_attention_gpu[_sg]_fold[_f16]_<dtype>: the f16 decoder only where the type has one."""
    f16 = f16 and dtype in GPU_WEIGHTS_F16
    return f"paged_attention_gpu{'_sg' if subgroups else ''}_fold{'_f16' if f16 else ''}_{dtype}"


# The cpu family's attention kernels, each in a variant by head width: (widest heads, name suffix, the part sizing
# its private accumulator: a private array cannot take an override's size), narrowest first; the first that holds
# the heads runs them (kv_attention_gpu.cpu_heads).
CPU_ATTENTION = ("paged_attention", "paged_prefill_attention")
CPU_ATTENTION_HEADS: tuple[tuple[int, str, str], ...] = (
    (64, "_narrow", "attention_heads_64"), (128, "", "attention_heads_128"), (256, "_wide", "attention_heads_256"))


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
        for f16, weights in ((False, GPU_WEIGHTS), (True, GPU_WEIGHTS_F16)):
            for gate_up, down in FFN_PAIRS:
                if gate_up in weights and down in weights:
                    table[ffn_gpu_shader(gate_up, down, bool(sg), f16)] = Variant(
                        (*weights[gate_up], reduce, "ffn_gpu_main"), (*enables, *((F16,) if f16 else ())),
                        ((FFN_DOWN_PREFIX, weights[down], FFN_DOWN_BINDINGS),))
        table[f"paged_attention_gpu{sg}"] = Variant(("paged_kv_read", reduce, "paged_attention_gpu_main"), enables)
        for f16, by_type in ((False, GPU_WEIGHTS), (True, GPU_WEIGHTS_F16)):
            for dtype, weights in by_type.items():
                table[fold_shader(dtype, bool(sg), f16)] = Variant(
                    ("paged_kv_read", reduce, "paged_attention_gpu_main", "paged_attention_gpu_fold"),
                    (*enables, *((F16,) if f16 else ())),
                    ((FOLD_PREFIX, (*weights, "attention_qkv_io"), FOLD_BINDINGS),), ("k_cache", "v_cache"))
    for dtype in GPU_MATMUL_TYPES:
        table[f"matmul_gpu_{dtype}"] = Variant((*GPU_WEIGHTS[dtype], "matmul_gpu_main"))
    for _, suffix, heads in CPU_ATTENTION_HEADS:
        for kernel in CPU_ATTENTION:
            table[f"{kernel}{suffix}"] = Variant((heads, f"{kernel}_main"))
    return table


VARIANTS: dict[str, Variant] = _variants()
