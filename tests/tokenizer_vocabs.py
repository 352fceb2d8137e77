"""Test helper: small synthetic vocabularies of every kind we read, written into tiny GGUF models.

Nothing is hand-written: BPE merges are learned from the pinned tokenizer
corpus (tests/golden/tokenizer_corpus.json) with the tiny model's trainer,
SentencePiece pieces likewise from its ``▁``-escaped words, with scores by
merge order. Each vocabulary goes into a one-layer ``llama`` GGUF with random
F32 weights, which llama.cpp's server loads, so its /tokenize is the oracle.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from pagedkv.tokenizer import (
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    bytes_to_unicode,
)

CORPUS = json.loads((Path(__file__).parent / "golden" / "tokenizer_corpus.json").read_text(encoding="utf-8"))
# Training text: the corpus without its special-token entries, so that no learned
# entry spells "<|im_end|>" and the like (llama.cpp would promote it to control).
CORPUS_TEXT = "\n".join(e["text"] for e in CORPUS if not e["name"].startswith("special_"))

# Per pre-tokenizer: control tokens (BOS, EOS first), a user-defined token, the
# add_bos flag as the real files of that family carry it.
BPE_FAMILIES = {
    "llama-bpe": (
        ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"], "<|reserved_0|>", True
    ),
    "qwen2": (["<|endoftext|>", "<|im_end|>", "<|im_start|>"], "<tool_call>", False),
    "smollm": (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], "<repo_name>", False),
    "gpt-2": (["<|endoftext|>", "<|sep|>"], "<|user_def|>", False),
    "default": (["<s>", "</s>"], "<|ud|>", False),
}
# Whole words given their own entry with no merge path: llama-bpe takes such a
# word whole (llama.cpp's ignore_merges); every other pre-tokenizer merges it.
WHOLE_WORDS = ("Ġthirteen", "Ġjumps", "Ġcache")
NUM_MERGES = 600
NUM_PIECES = 500
_SPM_RARE = 2  # characters seen fewer times than this get no piece: byte fallback


def learn_pairs(chunks: list[tuple[str, ...]], count: int, allowed=lambda a, b: True) -> list[tuple[str, str]]:
    """Greedy pair training over symbol sequences: most frequent pair first, smallest on ties."""
    seqs = Counter(chunks)
    learned: list[tuple[str, str]] = []
    while len(learned) < count:
        freq: Counter = Counter()
        for seq, n in seqs.items():
            for a, b in zip(seq, seq[1:]):
                if allowed(a, b):
                    freq[a, b] += n
        best = min(freq, key=lambda p: (-freq[p], p))
        learned.append(best)
        joined = Counter()
        for seq, n in seqs.items():
            parts = list(seq)
            k = 0
            while k < len(parts) - 1:
                if (parts[k], parts[k + 1]) == best:
                    parts[k : k + 2] = [parts[k] + parts[k + 1]]
                k += 1
            joined[tuple(parts)] += n
        seqs = joined
    return learned


def bpe_vocab(pre: str) -> dict:
    """Manifest ``tokenizer`` section of a byte-level BPE vocabulary for pre-tokenizer ``pre``.

    Merges are learned over whole lines, so entries cross the places where
    pre-tokenizers differ (contractions, punctuation before newlines,
    whitespace runs); every two- and three-digit ASCII number is an entry too,
    so digit grouping shows in the ids.
    """
    controls, user_defined, add_bos = BPE_FAMILIES[pre]
    alphabet = bytes_to_unicode()
    lines = [tuple(alphabet[b] for b in line.encode("utf-8")) for line in CORPUS_TEXT.split("\n") if line]
    pairs = learn_pairs(lines, NUM_MERGES)
    digits = "0123456789"
    pairs += [(a, b) for a in digits for b in digits] + [(a + b, c) for a in digits for b in digits for c in digits]
    merges = [f"{a} {b}" for a, b in pairs]
    merged = list(dict.fromkeys(a + b for a, b in pairs))
    normal = [alphabet[b] for b in range(256)] + merged
    normal += [w for w in WHOLE_WORDS if w not in normal]
    tokens = normal + controls + [user_defined]
    if len(set(tokens)) != len(tokens):
        raise AssertionError(f"{pre} vocabulary has duplicate tokens")
    types = [TOKEN_NORMAL] * len(normal) + [TOKEN_CONTROL] * len(controls) + [TOKEN_USER_DEFINED]
    return {
        "model": "gpt2", "pre": pre, "tokens": tokens, "token_types": types, "merges": merges,
        "bos_token_id": len(normal), "eos_token_id": len(normal) + 1, "add_bos_token": add_bos,
    }  # fmt: skip


def _spm_pieces(text: str, count: int) -> tuple[list[str], list[str]]:
    """Characters (seen at least _SPM_RARE times) and ``count`` merged pieces, most frequent pair first."""
    words = [tuple("\u2581" + w) for w in text.replace("\n", " ").split(" ") if w]
    chars = Counter(c for word in words for c in word)
    alphabet = sorted(c for c, n in chars.items() if n >= _SPM_RARE)
    known = set(alphabet)
    pairs = learn_pairs(words, count, lambda a, b: (a in known or len(a) > 1) and (b in known or len(b) > 1))
    return alphabet, list(dict.fromkeys(a + b for a, b in pairs))


def spm_vocab(*, add_space_prefix: bool | None = None) -> dict:
    """Manifest ``tokenizer`` section of a Llama 2 style SentencePiece vocabulary (byte fallback, scores)."""
    alphabet, pieces = _spm_pieces(CORPUS_TEXT, NUM_PIECES)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    scores = [0.0] * len(tokens)
    # Merged pieces score by merge order; single characters below every piece.
    for rank, piece in enumerate(pieces):
        tokens.append(piece), types.append(TOKEN_NORMAL), scores.append(-float(rank))
    for rank, char in enumerate(alphabet):
        tokens.append(char), types.append(TOKEN_NORMAL), scores.append(-1e4 - rank)
    tokens.append("<|tool|>"), types.append(TOKEN_USER_DEFINED), scores.append(0.0)
    # Kinds llama.cpp overrides by text: end-of-turn / fill-in-the-middle markers become control,
    # <|channel|> becomes user-defined.
    for text, kind in (("<|eot_id|>", TOKEN_NORMAL), ("<|fim_prefix|>", TOKEN_NORMAL), ("<|channel|>", TOKEN_CONTROL)):
        tokens.append(text), types.append(kind), scores.append(-1.0)
    if len(set(tokens)) != len(tokens):
        raise AssertionError("SentencePiece vocabulary has duplicate tokens")
    spec = {
        "model": "llama", "tokens": tokens, "token_types": types, "scores": scores,
        "bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0, "add_bos_token": True, "add_eos_token": False,
    }  # fmt: skip
    if add_space_prefix is not None:
        spec["add_space_prefix"] = add_space_prefix
    return spec


def write_vocab_gguf(path: Path, spec: dict, chat_template: str | None = None, seed: int = 0) -> Path:
    """A one-layer ``llama`` GGUF (random F32 weights) carrying ``spec``'s vocabulary."""
    import gguf

    hidden, ffn, n_heads, n_kv = 64, 128, 4, 2
    vocab = len(spec["tokens"])
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_dimension_count(hidden // n_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(spec["model"])
    if spec["model"] == "gpt2":
        writer.add_tokenizer_pre(spec["pre"])
        writer.add_token_merges(spec["merges"])
    else:
        writer.add_token_scores(spec["scores"])
    writer.add_token_list(spec["tokens"])
    writer.add_token_types(spec["token_types"])
    writer.add_bos_token_id(spec["bos_token_id"])
    writer.add_eos_token_id(spec["eos_token_id"])
    if spec.get("unknown_token_id") is not None:
        writer.add_unk_token_id(spec["unknown_token_id"])
    writer.add_add_bos_token(spec["add_bos_token"])
    if "add_eos_token" in spec:
        writer.add_add_eos_token(spec["add_eos_token"])
    if "add_space_prefix" in spec:
        writer.add_add_space_prefix(spec["add_space_prefix"])
    if chat_template:
        writer.add_chat_template(chat_template)
    rng = np.random.default_rng(seed)
    kv = hidden // n_heads * n_kv
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for name, shape in {
        "attn_norm": (hidden,), "attn_q": (hidden, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
        "attn_output": (hidden, hidden), "ffn_norm": (hidden,), "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn),
    }.items():  # fmt: skip
        shapes[f"blk.0.{name}.weight"] = shape
    for name, shape in shapes.items():
        writer.add_tensor(name, (0.02 * rng.standard_normal(shape)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Chat templates written for these tests in the style of the families' own
# (the same jinja constructs: bos_token, strftime_now / date_string, system
# message extraction with trim, a tools switch left off, raise_exception).
LLAMA3_STYLE_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- raise_exception("tools are not part of this test") }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception("roles must alternate user/assistant") }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN25_STYLE_TEMPLATE = """{%- if tools %}
    {{- raise_exception("tools are not part of this test") }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a small test model. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

ZEPHYR_STYLE_TEMPLATE = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""
