"""A tiny random llama model in the web format, for fast tests of the whole pipeline.

Same manifest, shard layout, quant formats (Q8_0 embedding, Q4_1 matrices,
F32 norms), tokenizer kind (byte-level BPE, SmolLM pre-tokenizer) and ChatML
template as the real model, so the same loader, tokenizer, chat and forward
code run on it. Its BPE merges are learned deterministically from a short
built-in text until the vocabulary reaches TINY_VOCAB.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace

import numpy as np

from ..pretokenize import split_words
from ..tokenizer import TOKEN_CONTROL, TOKEN_NORMAL, bytes_to_unicode
from .config import ModelConfig
from .layout import pack_float, pack_q4_1, pack_q8_0, quantize_q4_1, quantize_q8_0
from .quants import pack_gguf
from .weights import expected_shapes
from .writer import PackedTensor, write_model

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_VOCAB = 512
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_MERGE_TEXT = (
    "You are a helpful assistant. The user asks a question and the assistant answers it. "
    "The quick brown fox jumps over the lazy dog, then the dog sleeps in the sun. "
    "A paged cache stores keys and values in blocks; each sequence has a table of blocks. "
    "When the cache is full, the scheduler waits or preempts the newest request. "
    "Tokens are generated one at a time, and every token reads all earlier tokens. "
    "What is the capital of France? Paris is the capital and the largest city of France. "
    "Please write a short poem about the sea, the wind, the stars and the night. "
    "Hello, how are you today? I am fine, thank you for asking; and how is your family? "
    "Numbers like 12 and 345 are split into single digits before merging. "
    "def forward(self, tokens): return self.model(tokens) # python code with brackets"
)


def tiny_config() -> ModelConfig:
    """The tiny model's hyper-parameters (2 layers, hidden 64, GQA 4 over 2, vocab 512)."""
    return ModelConfig(
        architecture="llama", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128,
        vocab=TINY_VOCAB, rope_base=100000.0, rope_convention="adjacent_pairs", rms_eps=1e-5,
        context_length=256, tied_embeddings=True,
    )  # fmt: skip


def mixed_config() -> ModelConfig:
    """The mixed-types test model's hyper-parameters: tiny_config's, with widths that are multiples of 256 so
    that K-quants can cover every matrix (hidden 256, 4 heads of 64 over 2 KV heads, ffn 512)."""
    return replace(tiny_config(), hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512)


# write_tiny_model(dtypes=MIXED_DTYPES, config=mixed_config()): every quantized weight type at least once, the
# tied embedding (the LM head too) in q6_K, and stacked groups (q|k|v, gate|up: backends/webgpu/fused.py) of
# types that the GPU runs in their lossless common type (q4_K + q5_K -> q5_K, q4_1 + q5_1 -> q5_1,
# q5_0 + q4_0 + q8_0 -> q8_0), as llama.cpp's Q4_K_M mixes q5_0 and q8_0 in SmolLM2's q|k|v.
MIXED_DTYPES = {
    "token_embd.weight": "q6_K",
    "blk.0.attn_q.weight": "q4_K", "blk.0.attn_k.weight": "q4_K", "blk.0.attn_v.weight": "q5_K",
    "blk.0.attn_output.weight": "q4_0", "blk.0.ffn_gate.weight": "q4_1", "blk.0.ffn_up.weight": "q5_1",
    "blk.0.ffn_down.weight": "q6_K",
    "blk.1.attn_q.weight": "q5_0", "blk.1.attn_k.weight": "q4_0", "blk.1.attn_v.weight": "q8_0",
    "blk.1.attn_output.weight": "q4_K", "blk.1.ffn_gate.weight": "q8_0", "blk.1.ffn_up.weight": "q8_0",
    "blk.1.ffn_down.weight": "q4_1",
}  # fmt: skip

# llama.cpp's Q4_K_M on a llama model of 256-multiple widths (q4_K q / k beside a q6_K v in use_more_bits
# layers) and, for the gate|up path, a q4_K gate beside a q6_K up: no lossless common type, so layer 0's
# q|k|v and gate|up run unstacked on WebGPU (backends/webgpu/fused.stacks); layer 1 is all q4_K (stacked).
Q4_K_M_DTYPES = {
    "token_embd.weight": "q6_K", "attn_q.weight": "q4_K", "attn_k.weight": "q4_K", "attn_v.weight": "q4_K",
    "attn_output.weight": "q4_K", "ffn_gate.weight": "q4_K", "ffn_up.weight": "q4_K", "ffn_down.weight": "q4_K",
    "blk.0.attn_v.weight": "q6_K", "blk.0.ffn_up.weight": "q6_K", "blk.0.ffn_down.weight": "q6_K",
}  # fmt: skip
# The same split in the tiny model's defaults (q4_1 matrices, q8_0 embedding), types with a gpu-family tiled
# matmul (model_kernels.GPU_MATMUL_TYPES) and no common type: the gpu family's prefill writes the layouts too.
GPU_MATMUL_SPLIT_DTYPES = {"blk.0.attn_v.weight": "q8_0", "blk.0.ffn_gate.weight": "q8_0"}


def learn_merges(text: str, num_merges: int) -> list[str]:
    """Greedy byte-level BPE training: most frequent pair first, lexicographically smallest on ties."""
    byte_char = bytes_to_unicode()
    words = Counter(
        tuple(byte_char[b] for b in w.encode("utf-8")) for w in split_words(text, "smollm")
    )  # symbol tuple -> count
    merges: list[str] = []
    while len(merges) < num_merges:
        pairs: Counter = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            raise ValueError(f"merge text too short: only {len(merges)} merges of {num_merges} learned")
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(f"{best[0]} {best[1]}")
        merged = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def tiny_tokenizer() -> dict:
    """Manifest "tokenizer" section: 3 specials, 256 byte tokens, learned merges up to TINY_VOCAB."""
    byte_tokens = [bytes_to_unicode()[b] for b in range(256)]
    merges = learn_merges(_MERGE_TEXT, TINY_VOCAB - len(SPECIAL_TOKENS) - 256)
    tokens = list(SPECIAL_TOKENS) + byte_tokens + [m.replace(" ", "") for m in merges]
    if len(set(tokens)) != len(tokens):
        raise AssertionError("tiny vocabulary has duplicate tokens")
    return {
        "model": "gpt2",
        "pre": "smollm",
        "tokens": tokens,
        "token_types": [TOKEN_CONTROL] * len(SPECIAL_TOKENS) + [TOKEN_NORMAL] * (len(tokens) - len(SPECIAL_TOKENS)),
        "merges": merges,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "unknown_token_id": 0,
        "padding_token_id": 2,
    }


def _tensor_dtype(name: str, dtypes: dict[str, str]) -> str | None:
    """The dtype `dtypes` asks for `name`: by full name, else by its name without the "blk.N." prefix."""
    return dtypes.get(name, dtypes.get(name.split(".", 2)[-1] if name.startswith("blk.") else name))


def _packed(name: str, shape: tuple, w: np.ndarray, dtype: str) -> PackedTensor:
    from .quantize import quantize  # gguf's quantizers: CPython only, and only when a dtype is asked for

    return PackedTensor(name, dtype, shape, pack_gguf(dtype, quantize(w, dtype), shape))


def write_tiny_model(out_dir: str | os.PathLike, seed: int = 0, dtypes: dict[str, str] | None = None,
                     config: ModelConfig | None = None) -> dict:
    """Write a tiny random model (same format as the converted one) into out_dir; returns the manifest.

    dtypes: weight type per tensor, by full name ("blk.1.attn_v.weight") or for every layer by the name
    after "blk.N." ("ffn_down.weight"); unnamed tensors keep the defaults (f32 norms, q8_0 embedding, q4_1
    matrices). config: other hyper-parameters (K-quants need row lengths that are multiples of 256)."""
    config = config or tiny_config()
    dtypes = dtypes or {}
    rng = np.random.default_rng(seed)
    tensors = []
    for name, shape in expected_shapes(config).items():
        asked = _tensor_dtype(name, dtypes)
        if len(shape) == 1:  # norm weights: near 1 so activations keep their scale
            w = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            tensors.append(PackedTensor(name, "f32", shape, pack_float(w, "f32")) if asked is None
                           else _packed(name, shape, w, asked))
            continue
        if name == "token_embd.weight":  # small: the tied LM head would otherwise give near-one-hot softmaxes
            w = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            w = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        if asked is not None:
            tensors.append(_packed(name, shape, w, asked))
        elif name == "token_embd.weight":
            tensors.append(PackedTensor(name, "q8_0", shape, pack_q8_0(*quantize_q8_0(w))))
        else:
            tensors.append(PackedTensor(name, "q4_1", shape, pack_q4_1(*quantize_q4_1(w))))
    unused = sorted(set(dtypes) - {k for n in expected_shapes(config) for k in (n, n.split(".", 2)[-1])})
    if unused:
        raise ValueError(f"dtypes names tensors the model does not have: {unused}")
    source = {"file": "tiny-random", "seed": seed, "sha256": None}
    if dtypes:
        source["dtypes"] = dict(sorted(dtypes.items()))
    return write_model(out_dir, config, tensors, tiny_tokenizer(), TINY_CHAT_TEMPLATE, source)
