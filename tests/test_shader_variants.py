"""Kernel variants composed from part files (backends/webgpu/shader_variants.py, ShaderLibrary), in CPython.

Every name the host code asks for is a file of shaders/ or a variant of whole parts; a variant's source is
its enable lines, a header and its parts in order; the page's path (dist/shaders/ through build.py's
manifest) composes the same text as the repo's shaders/. tests/native/test_shader_variants_native.py
compiles every variant.
"""
from __future__ import annotations

import re

import build
import pytest
from pagedkv.backends.webgpu import model_kernels as ops
from pagedkv.backends.webgpu.kv_attention_gpu import decode_kernels, prefill_kernel
from pagedkv.backends.webgpu.native import SHADERS, repo_shaders
from pagedkv.backends.webgpu.shader_variants import FFN_PAIRS, GPU_WEIGHTS, VARIANTS, ffn_gpu_shader, fold_shader
from pagedkv.backends.webgpu.wgsl_instance import instance
from pagedkv.engine import run_sync

FILES = {p.stem for p in SHADERS.glob("*.wgsl")}


def sources(library, names) -> dict[str, str]:
    async def run():
        return {name: await library.source(name) for name in names}

    return run_sync(run())


def test_every_part_is_a_file_and_no_variant_is_one():
    # 58, the gpu matvecs' _merge, _rope_kv and _argmax, 6 more gpu matmuls; the cpu family's attention by head width;
    # 30 fused FFNs: 13 type pairs and 2 with f16 decoders, with and without subgroups; 26 decode attentions with
    # q | k | v inside: one a weight type and 2 with f16 decoders, with and without subgroups
    assert len(VARIANTS) == 204
    assert sum(name.startswith("ffn_gpu") for name in VARIANTS) == 30
    assert sum("_fold" in name for name in VARIANTS) == 26
    assert {part for v in VARIANTS.values() for part in v.all_parts} <= FILES
    assert not set(VARIANTS) & FILES
    assert {line for v in VARIANTS.values() for line in v.enables} == {"enable subgroups;", "enable f16;"}


def test_every_kernel_name_the_host_asks_for_resolves():
    names = {f"{kernel}_{dtype}" for kernel in ("matvec", "matmul") for dtype in ops.LINEAR_TYPES}
    names |= {f"embedding_{dtype}" for dtype in ops.LINEAR_TYPES if dtype != "q8_0"} | {"embedding"}
    names |= {ops.gpu_matvec_shader(dtype, subgroups, f16, io) for dtype in ops.LINEAR_TYPES
              for subgroups in (False, True) for f16 in (False, True) for io in ("", "_merge", "_rope_kv", "_argmax")}
    names |= {f"matmul_gpu_{dtype}" for dtype in ops.GPU_MATMUL_TYPES}
    names |= {ffn_gpu_shader(gate_up, down, subgroups, f16) for gate_up, down in FFN_PAIRS
              for subgroups in (False, True) for f16 in (False, True)}
    names |= {decode_kernels("gpu", subgroups, 64).attention for subgroups in (False, True)}
    names |= {fold_shader(dtype, subgroups, f16) for dtype in GPU_WEIGHTS for subgroups in (False, True)
              for f16 in (False, True)}
    names |= {k for head_dim in (64, 128, 256) for k in (decode_kernels("cpu", False, 16, head_dim).attention,
                                                   prefill_kernel("cpu", 1, head_dim, 4, 16, 16).name)}
    assert len(names) == 209
    missing = names - FILES - set(VARIANTS)
    assert not missing
    # every variant is asked for by some host code (none is dead)
    assert set(VARIANTS) <= names


def test_shaders_has_no_include_only_file():
    include_only = []
    for path in SHADERS.glob("*.wgsl"):
        code = [line for line in path.read_text().splitlines()
                if line.strip() and not line.startswith("//") and not line.startswith("enable ")]
        if not code:
            include_only.append(path.name)
    assert include_only == []


def test_a_variant_is_its_enables_a_header_and_its_parts_in_order():
    library = repo_shaders()
    got = sources(library, ["matvec_gpu_sg_f16_q8_0"])["matvec_gpu_sg_f16_q8_0"]
    parts = sources(library, ["q8_0_weights", "gpu_q8_0_words_f16", "reduce_subgroup", "matvec_io", "matvec_gpu_main"])
    assert got == ("enable subgroups;\nenable f16;\n\n"
                   "// matvec_gpu_sg_f16_q8_0, composed by ShaderLibrary (backends/webgpu/shader_variants.py):\n"
                   "// q8_0_weights.wgsl + gpu_q8_0_words_f16.wgsl + reduce_subgroup.wgsl + matvec_io.wgsl + "
                   "matvec_gpu_main.wgsl\n"
                   "\n" + "".join(text + "\n" for text in parts.values()))
    # the parts' includes are expanded too: nothing is left for the device to resolve
    assert not re.search(r"^//#include", got, re.MULTILINE)
    cpu = sources(library, ["embedding_q4_1"])["embedding_q4_1"]
    assert cpu.startswith("// embedding_q4_1, composed by ShaderLibrary (backends/webgpu/shader_variants.py):\n"
                          "// q4_1_scales.wgsl + embedding_nibble.wgsl\n\n// ")


def test_the_pages_manifest_lists_part_files_and_composes_the_same_text(tmp_path):
    manifest = build.build_shaders(tmp_path)
    assert set(manifest) == FILES
    names = sorted(VARIANTS) + ["residual_add", "matvec_q8_0"]
    page = sources(repo_shaders(tmp_path / "shaders"), names)
    assert page == sources(repo_shaders(), names)


def test_a_second_decoder_is_its_parts_renamed_under_a_prefix_with_its_bindings_moved():
    """The fused FFN's down decoder (wgsl_instance.py): every module-scope name of its parts prefixed, member
    reads (`.x`) and builtins untouched, bindings + 16; a struct field named like a module-scope name is refused."""
    text = ("@group(0) @binding(1) var<storage, read> d : array<u32>;\nstruct S {\n  a : f32,\n}\n"
            "const N : u32 = 2u;\nfn f(i : u32) -> f32 {\n  let s = S(f32(d[i]));\n  return s.a * f32(N);\n}\n")
    assert instance(text, "down_", 16) == (
        "@group(0) @binding(17) var<storage, read> down_d : array<u32>;\nstruct down_S {\n  a : f32,\n}\n"
        "const down_N : u32 = 2u;\nfn down_f(i : u32) -> f32 {\n  let s = down_S(f32(down_d[i]));\n"
        "  return s.a * f32(down_N);\n}\n")
    with pytest.raises(ValueError, match=r"struct fields \['N'\] are named like module-scope declarations"):
        instance(text.replace("  a : f32", "  N : f32"), "down_", 16)
    library = repo_shaders()
    got = sources(library, ["ffn_gpu_sg_q4_K_q6_K"])["ffn_gpu_sg_q4_K_q6_K"]
    gate_up = sources(library, ["q4_K_weights", "nibble_io", "gpu_nibble_words", "reduce_subgroup"])
    down = sources(library, ["q6_K_weights", "nibble_io", "gpu_nibble_words"])
    body = sources(library, ["ffn_gpu_main"])["ffn_gpu_main"]
    assert got == ("enable subgroups;\n\n"
                   "// ffn_gpu_sg_q4_K_q6_K, composed by ShaderLibrary (backends/webgpu/shader_variants.py):\n"
                   "// q4_K_weights.wgsl + nibble_io.wgsl + gpu_nibble_words.wgsl + reduce_subgroup.wgsl + "
                   "ffn_gpu_main.wgsl\n"
                   "// down_* instance (bindings + 16): q6_K_weights.wgsl + nibble_io.wgsl + gpu_nibble_words.wgsl\n\n"
                   + "".join(text + "\n" for text in gate_up.values())
                   + instance("\n".join(down.values()), "down_", 16) + "\n" + body + "\n")
    assert "@group(0) @binding(17) var<storage, read> down_sc : array<u32>;" in got  # q6_K's scales
    assert "@group(0) @binding(1) var<storage, read> sc : array<vec4<u32>>;" in got  # q4_K's
