"""GGUF test files nobody wrote by hand, made at test time from pinned inputs and cached under .cache/test-gguf/.

- tiny random `llama` / `qwen2` models (widths multiples of 256, so K-quants can cover every tensor) carrying
  SmolLM2's tokenizer metadata from the pinned GGUF, so the tokenizer and chat template work;
- the same with K-quant tensors (TINY_K: one recipe per K type, and llama.cpp's Q4_K_M per-tensor mix);
- tiny `qwen3` / `smollm3` / `gemma3` models (TINY_FAMILIES: what each family adds over llama / qwen2, with
  heads * head_dim != hidden; only llama.cpp runs them so far);
- SmolLM2-135M requantized from the pinned Q4_1 file to Q8_0 / Q6_K / Q4_0 or the Q4_K_M mix (576-wide rows
  cannot be K-quantized: they fall back as llama.cpp's quantizer does, quantize.FALLBACK).

Quantization is py/pagedkv/model/quantize.py's (gguf.quants for the legacy types, its numpy port for the
K-quants; tests/test_quants.py checks both against gguf's dequantization).

A file's name holds the sha256 of its inputs (the maker's spec, MAKER_VERSION and the pinned GGUF's sha256),
so an unchanged recipe reuses the file and a changed one makes a new file.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

from pagedkv.model.convert import SMOLLM2_GGUF_SHA256
from pagedkv.model.quantize import FALLBACK, q4_k_m_types, quantize
from pagedkv.model.quants import BY_GGUF, QK_K, WEIGHT_TYPES

MAKER_VERSION = 2
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-gguf"
# Metadata keys copied from the pinned SmolLM2 GGUF into the tiny models (the tokenizer and the chat template).
TOKENIZER_PREFIXES = ("tokenizer.",)
EMBD_STD = 0.3
GAIN = 4.0

# name -> recipe. Types are GGML type names; "layers" sets attention / ffn types; norms and biases stay F32.
TINY = {
    "tiny-llama": {"arch": "llama", "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512, "layers": 2,
                   "rope_base": 10000.0, "eps": 1e-5, "embd": "Q8_0", "output": None,
                   "attn": "Q4_1", "ffn_type": "Q4_1", "seed": 21},
    "tiny-llama3-rope": {"arch": "llama", "hidden": 256, "heads": 4, "kv_heads": 1, "ffn": 512, "layers": 2,
                         "rope_base": 500000.0, "eps": 1e-5, "embd": "Q8_0", "output": "F16",
                         "attn": "Q8_0", "ffn_type": "Q8_0", "seed": 12,
                         # llama3 scaling with a short original context, so the factors bend short positions too
                         "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_context": 32}},
    "tiny-llama-linear": {"arch": "llama", "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512, "layers": 2,
                          "rope_base": 10000.0, "eps": 1e-5, "embd": "F16", "output": "Q8_0",
                          "attn": "Q4_1", "ffn_type": "Q8_0", "seed": 13, "linear": 4.0},
    "tiny-qwen2": {"arch": "qwen2", "hidden": 256, "heads": 4, "kv_heads": 1, "ffn": 512, "layers": 2,
                   "rope_base": 1000000.0, "eps": 1e-6, "embd": "Q8_0", "output": "Q8_0",
                   "attn": "Q8_0", "ffn_type": "Q4_1", "seed": 34},
}

# K-quant recipes (same keys; "mix": "Q4_K_M" replaces every matrix's type by quantize.q4_k_m_types' choice,
# "types" overrides single tensors). All run on WebGPU too: tiny-llama-q5_k's q4_K attn_k beside q5_K stacks
# losslessly as q5_K; the Q4_K_M mixes put q6_K attn_v beside q4_K attn_q / attn_k in their last layer, which
# the GPU multiplies one by one. tiny-llama-q4_k_m's seed is 46 because seed 44's file diverged from llama.cpp
# at a margin of 0.689, above the near-tie rule's 0.5: llama.cpp rounds activations to 8 bits before its
# quantized matmuls, and its top-1/top-2 margins differ from our f32 ones by up to 1.9 logits on these tiny
# models (mean 0.2-0.4), on the Q8_0 / Q4_1 files as well.
_LLAMA_K = {"arch": "llama", "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512, "layers": 2,
            "rope_base": 10000.0, "eps": 1e-5}
_QWEN2_K = {**_LLAMA_K, "arch": "qwen2", "rope_base": 1000000.0, "eps": 1e-6}
TINY_K = {
    "tiny-llama-q4_k": {**_LLAMA_K, "embd": "Q4_K", "output": None, "attn": "Q4_K", "ffn_type": "Q4_K", "seed": 41},
    "tiny-llama-q5_k": {**_LLAMA_K, "embd": "Q6_K", "output": "Q5_K", "attn": "Q5_K", "ffn_type": "Q5_K", "seed": 42,
                        "types": {"blk.0.attn_k.weight": "Q4_K"}},
    "tiny-qwen2-q6_k": {**_QWEN2_K, "kv_heads": 1, "embd": "Q6_K", "output": "Q6_K", "attn": "Q6_K",
                        "ffn_type": "Q6_K", "seed": 43},
    "tiny-llama-q4_k_m": {**_LLAMA_K, "embd": "Q4_K", "output": "Q6_K", "attn": "Q4_K", "ffn_type": "Q4_K",
                          "seed": 46, "mix": "Q4_K_M"},
    "tiny-qwen2-q4_k_m": {**_QWEN2_K, "embd": "Q4_K", "output": None, "attn": "Q4_K", "ffn_type": "Q4_K",
                          "seed": 45, "mix": "Q4_K_M"},
}


# Architectures beyond llama / qwen2, each recipe exercising what its family adds (llama.cpp's src/models/*.cpp
# and the load_hparams / load_tensors cases of src/llama-model.cpp):
# - qwen3: no q/k/v biases; per-head RMSNorm of q and k (attn_q_norm / attn_k_norm, [head_dim]) before NEOX rope;
#   "head_dim" 128 with 4 heads over hidden 256 (qwen3.attention.key_length / value_length), so attn_q is 512 rows
#   and attn_output takes 512 columns; GQA.
# - smollm3: the llama graph (NORM rope, llama tensor names, no biases), but no rope where (layer + 1) % 4 == 0
#   (llama.cpp hard-codes hparams.n_no_rope_layer_step = 4 for LLM_ARCH_SMOLLM3; no GGUF key): 5 layers, so
#   layer 3 is a no-rope layer; tied output, as SmolLM3's.
# - gemma3: q/k norms; post_attention_norm and post_ffw_norm; GeGLU (tanh GELU); the embedding scaled by
#   sqrt(hidden); tied output; NEOX rope; sliding-window attention of "sliding_window" positions on every layer
#   but each 6th (set_swa_pattern(6): layer il slides when il % 6 < 5, so layer 5 is global), the sliding ones
#   with rope base 10000 (hard-coded rope_freq_base_train_swa), the global ones with gemma3.rope.freq_base; q
#   scaled by 1/sqrt(head_dim) (f_attention_scale; 1/sqrt(hidden/heads) only for a 62-layer "27B"). Norm
#   weights are used as stored (a converted file already holds 1 + w). A window of 32 lets short prompts cross it.
# Norm gains as TINY's, but gemma3's post norms ("post_gain") set each layer's share of the residual stream, which
# starts from the embedding times sqrt(hidden) = 16 (std 4.8): at GAIN (4) the tied head echoed one id 16 times
# (margins ~30), at 16 / 32 it still fell into runs of one id; GAIN * sqrt(hidden) = 64 keeps the embedding's share
# about TINY's. llama.cpp's greedy ids on 40-token prompts then have median top-1/top-2 margins of 2-4 logits
# (tests/test_gguf_new_families_llama_cpp.py).
TINY_FAMILIES = {
    "tiny-qwen3": {"arch": "qwen3", "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 128, "ffn": 512,
                   "layers": 2, "rope_base": 1000000.0, "eps": 1e-6, "embd": "Q8_0", "output": "Q4_K",
                   "attn": "Q4_K", "ffn_type": "Q8_0", "seed": 51},
    "tiny-smollm3": {"arch": "smollm3", "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512, "layers": 5,
                     "rope_base": 5000000.0, "eps": 1e-6, "embd": "Q4_K", "output": None,
                     "attn": "Q8_0", "ffn_type": "Q4_K", "seed": 52},
    "tiny-gemma3": {"arch": "gemma3", "hidden": 256, "heads": 4, "kv_heads": 1, "head_dim": 128, "ffn": 512,
                    "layers": 7, "rope_base": 1000000.0, "eps": 1e-6, "embd": "Q8_0", "output": None,
                    "attn": "F16", "ffn_type": "Q4_K", "seed": 53, "sliding_window": 32,
                    "post_gain": 64.0},
}
# tiny-gemma3 with Gemma 3 270M's head size (256: twice the widest head of the others) for the WebGPU kernels'
# wide-head paths (tests/native/test_model_families_native.py); llama.cpp does not run it here.
TINY_WIDE_HEADS = {"tiny-gemma3-hd256": {**TINY_FAMILIES["tiny-gemma3"], "head_dim": 256}}


def _key(spec: dict) -> str:
    blob = json.dumps({"spec": spec, "maker": MAKER_VERSION, "source": SMOLLM2_GGUF_SHA256,
                       "scales": [EMBD_STD, GAIN]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cached(name: str, spec: dict, make) -> Path:
    """CACHE/<name>-<key>.gguf, made by make(path) through a temporary file when absent."""
    path = CACHE / f"{name}-{_key(spec)}.gguf"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        make(tmp)
        tmp.replace(path)
    return path


def _copy_metadata(reader, writer, keep) -> None:
    """Copy reader's key/values whose key passes keep(key) into writer, with their exact GGUF types."""
    import gguf

    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or not keep(key):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)


def llama3_factors(head_dim: int, base: float, factor: float, low_freq_factor: float, high_freq_factor: float,
                   original_context: int) -> np.ndarray:
    """(head_dim/2,) rope_freqs.weight as convert_hf_to_gguf writes it for rope_scaling "llama3"."""
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    low_wavelen, high_wavelen = original_context / low_freq_factor, original_context / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _tensor_specs(spec: dict) -> list[tuple[str, tuple[int, ...], str, float]]:
    """(name, numpy shape (rows, cols), GGML type, std) of every tensor of a tiny recipe; a negative std -g
    stands for a norm weight: g * (1 + 0.1 * noise)."""
    h, ffn = spec["hidden"], spec["ffn"]
    hd = spec.get("head_dim", h // spec["heads"])
    q, kv = spec["heads"] * hd, spec["kv_heads"] * hd
    # The layers' outputs outweigh the embedding in the residual stream, so a tied head does not just echo the
    # input token: the greedy ids vary and their top-1/top-2 margins are mostly a few logits wide.
    gain = GAIN
    # output_norm's gain of 3 widens the logits (std ~14), so that near ties (margin < 0.5) are rare.
    out = [("token_embd.weight", (49152, h), spec["embd"], EMBD_STD), ("output_norm.weight", (h,), "F32", -3.0)]
    if spec["output"]:
        out.append(("output.weight", (49152, h), spec["output"], EMBD_STD))
    for i in range(spec["layers"]):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (h,), "F32", -1.0), (p + "ffn_norm.weight", (h,), "F32", -1.0),
                (p + "attn_q.weight", (q, h), spec["attn"], h ** -0.5),
                (p + "attn_k.weight", (kv, h), spec["attn"], h ** -0.5),
                (p + "attn_v.weight", (kv, h), spec["attn"], h ** -0.5),
                (p + "attn_output.weight", (h, q), spec["attn"], gain * q ** -0.5),
                (p + "ffn_gate.weight", (ffn, h), spec["ffn_type"], h ** -0.5),
                (p + "ffn_up.weight", (ffn, h), spec["ffn_type"], h ** -0.5),
                (p + "ffn_down.weight", (h, ffn), spec["ffn_type"], gain * ffn ** -0.5)]
        if spec["arch"] == "qwen2":
            out += [(p + "attn_q.bias", (h,), "F32", 0.5), (p + "attn_k.bias", (kv,), "F32", 0.5),
                    (p + "attn_v.bias", (kv,), "F32", 0.5)]
        if spec["arch"] in ("qwen3", "gemma3"):
            out += [(p + "attn_q_norm.weight", (hd,), "F32", -1.0), (p + "attn_k_norm.weight", (hd,), "F32", -1.0)]
        if spec["arch"] == "gemma3":
            out += [(p + "post_attention_norm.weight", (h,), "F32", -spec["post_gain"]),
                    (p + "post_ffw_norm.weight", (h,), "F32", -spec["post_gain"])]
    if "mix" in spec:
        out = _mixed(out, spec["layers"])
    overrides = spec.get("types", {})
    return [(name, shape, overrides.get(name, type_name), std) for name, shape, type_name, std in out]


def _mix_types(shapes: dict[str, tuple[int, ...]], n_layers: int) -> dict[str, str]:
    """Tensor name -> GGML type name of llama.cpp's Q4_K_M choice (quantize.q4_k_m_types)."""
    return {name: WEIGHT_TYPES[t].gguf for name, t in q4_k_m_types(shapes, n_layers).items()}


def _mixed(specs: list, n_layers: int) -> list:
    types = _mix_types({name: shape for name, shape, _, _ in specs}, n_layers)
    return [(name, shape, types[name], std) for name, shape, _, std in specs]


def _encode(w: np.ndarray, type_name: str) -> tuple[np.ndarray, object]:
    from gguf import GGMLQuantizationType

    qtype = GGMLQuantizationType[type_name]
    if type_name == "F32":
        return w.astype(np.float32), qtype
    if type_name == "F16":
        return w.astype(np.float16), qtype
    return quantize(w, BY_GGUF[type_name].name), qtype


def _write_tiny(path: Path, spec: dict, source: Path) -> None:
    import gguf

    arch, h = spec["arch"], spec["hidden"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(spec["layers"])
    writer.add_context_length(2048)
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(spec["ffn"])
    writer.add_head_count(spec["heads"])
    writer.add_head_count_kv(spec["kv_heads"])
    writer.add_rope_freq_base(spec["rope_base"])
    if "head_dim" in spec:
        writer.add_key_length(spec["head_dim"])
        writer.add_value_length(spec["head_dim"])
    writer.add_rope_dimension_count(spec.get("head_dim", h // spec["heads"]))
    writer.add_layer_norm_rms_eps(spec["eps"])
    if "sliding_window" in spec:
        writer.add_sliding_window(spec["sliding_window"])
    if "linear" in spec:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(spec["linear"])
    _copy_metadata(gguf.GGUFReader(source), writer, lambda key: key.startswith(TOKENIZER_PREFIXES))
    rng = np.random.default_rng(spec["seed"])
    for name, shape, type_name, std in _tensor_specs(spec):
        noise = rng.standard_normal(shape)
        w = -std * (1.0 + 0.1 * noise) if std < 0 else std * noise
        data, qtype = _encode(w, type_name)
        writer.add_tensor(name, data, raw_dtype=qtype)
    if "llama3" in spec:
        writer.add_tensor("rope_freqs.weight", llama3_factors(h // spec["heads"], spec["rope_base"], **spec["llama3"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_gguf(name: str, source: Path) -> Path:
    """The tiny model `name` (a key of TINY, TINY_K, TINY_FAMILIES or TINY_WIDE_HEADS), made from the pinned SmolLM2 GGUF `source`
    when not cached."""
    spec = next(recipes[name] for recipes in (TINY, TINY_K, TINY_FAMILIES, TINY_WIDE_HEADS) if name in recipes)
    return _cached(name, spec, lambda path: _write_tiny(path, spec, source))


def requantized_types(shapes: dict[str, tuple[int, ...]], n_layers: int, type_name: str) -> dict[str, str]:
    """Tensor name -> GGML type name of SmolLM2 requantized to type_name ("Q4_K_M": the mix), as llama.cpp's
    quantizer picks them: 1-D tensors F32, a K-quant falls back (FALLBACK) on rows not a multiple of 256."""
    if type_name == "Q4_K_M":
        return _mix_types(shapes, n_layers)
    fallback = {WEIGHT_TYPES[k].gguf: WEIGHT_TYPES[v].gguf for k, v in FALLBACK.items()}
    out = {}
    for name, shape in shapes.items():
        out[name] = "F32" if len(shape) == 1 else type_name
        if len(shape) == 2 and shape[1] % QK_K and type_name in fallback:
            out[name] = fallback[type_name]
    return out


def _write_requantized(path: Path, source: Path, type_name: str) -> None:
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(path), "llama")
    _copy_metadata(reader, writer, lambda key: key not in ("general.architecture", "general.file_type"))
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}  # fastest dim. last
    types = requantized_types(shapes, int(reader.fields["llama.block_count"].contents()), type_name)
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).reshape(shapes[t.name])
        data, qtype = _encode(w, types[t.name])
        writer.add_tensor(t.name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def requantized_smollm2(source: Path, type_name: str = "Q8_0") -> Path:
    """SmolLM2-135M-Instruct dequantized from the pinned Q4_1 file and quantized again to type_name: "Q8_0",
    "Q6_K", "Q4_0", ... or "Q4_K_M" (requantized_types)."""
    return _cached(f"smollm2-135m-{type_name.lower()}", {"requantize": type_name},
                   lambda path: _write_requantized(path, source, type_name))
