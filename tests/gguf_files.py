"""Test helper: tiny llama GGUFs made at test time with gguf.GGUFWriter, with SmolLM2's real tokenizer and
chat template (from the pinned GGUF) and random weights in the types the engine loads today."""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.gguf_writer import GGUFValue
from gguf.quants import quantize as gguf_quantize
from gguf_tokenizer import gguf_manifest_sections

from pagedkv.model.config import ModelConfig
from pagedkv.model.synthetic import write_llama_metadata
from pagedkv.model.weights import expected_shapes


def tiny_llama_config(vocab: int) -> ModelConfig:
    """2 layers, hidden 64, GQA 4 over 2 heads of 16, ffn 128, context 256: widths Q8_0 / Q4_1 can hold."""
    return ModelConfig(
        architecture="llama", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128, vocab=vocab,
        rope_base=100000.0, rope_convention="adjacent_pairs", rms_eps=1e-5, context_length=256,
        tied_embeddings=True,
    )  # fmt: skip


def write_tiny_gguf(path, seed: int = 0, matrix_type: Q = Q.Q4_1) -> ModelConfig:
    """A tiny llama GGUF: Q8_0 embedding (tied output), `matrix_type` matrices, F32 norms. Returns its config."""
    sections = gguf_manifest_sections()
    tok = sections["tokenizer"]
    cfg = tiny_llama_config(len(tok["tokens"]))
    writer = gguf.GGUFWriter(str(path), "llama")
    write_llama_metadata(writer, cfg, tok, sections["chat_template"])
    rng = np.random.default_rng(seed)
    for name, shape in expected_shapes(cfg).items():
        w = rng.standard_normal(shape).astype(np.float32)
        qtype = Q.F32 if len(shape) == 1 else Q.Q8_0 if name == "token_embd.weight" else matrix_type
        writer.add_tensor(name, w if qtype == Q.F32 else gguf_quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return cfg


def write_small_gguf(path, metadata: dict | None = None, data: dict | None = None) -> None:
    """tiny.py's model (tiny_config, tiny_tokenizer, TINY_CHAT_TEMPLATE) as a ~450 KB GGUF of F32 tensors, made
    hostile on demand: `metadata` maps a key to (value, gguf.GGUFValueType[, item type]) to write instead, or to
    None to leave it out; `data` maps a tensor name to (array, GGML type) to store instead of its F32 weights."""
    from pagedkv.model.tiny import TINY_CHAT_TEMPLATE, tiny_config, tiny_tokenizer

    cfg = tiny_config()
    writer = gguf.GGUFWriter(str(path), "llama")
    write_llama_metadata(writer, cfg, tiny_tokenizer(), TINY_CHAT_TEMPLATE)
    for key, value in (metadata or {}).items():
        if value is None:
            del writer.kv_data[0][key]
        else:
            writer.kv_data[0][key] = GGUFValue(*value)
    rng = np.random.default_rng(0)
    for name, shape in expected_shapes(cfg).items():
        array, qtype = (data or {}).get(name, (rng.standard_normal(shape).astype(np.float32), Q.F32))
        writer.add_tensor(name, array, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
