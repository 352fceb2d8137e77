"""Gemma 3: embeddings times sqrt(hidden); per-head q / k RMSNorm before rotary (NEOX pairs); RMSNorms after the
attention and after the FFN too; GeGLU with tanh GELU; a tied head; five of every six layers attend to a sliding
window (`gemma3.attention.sliding_window`, 512 tokens in the 270M) with rotary base 10,000, the sixth (5, 11, 17,
...) to everything with the file's `rope.freq_base` (1e6). The file stores neither the 10,000 nor the period:
llama.cpp supplies them, and so does this declaration. The GGUF's norm gains already hold Gemma's + 1.

q . k is scaled by 1/sqrt(head_dim), except in the 27B (62 layers), whose query_pre_attn_scalar is hidden / heads:
llama.cpp's rule. Its instruct models' turns are `<start_of_turn>user ... <end_of_turn>`; a file without a chat
template gets that format.
"""
from ..family import Family, SlidingWindow

# Gemma's turn format (its instruct models' template, text only): a system message opens the first user turn.
GEMMA_TURNS = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

GEMMA3 = Family(
    name="gemma3", rope_pairing="neox", activation="gelu_tanh", qk_norm=True, post_norms=True,
    embedding_scale=True, sliding_window=SlidingWindow(period=6, rope_base=10_000.0),
    query_scale_dim=lambda config: config.hidden // config.n_heads if config.n_layers == 62 else config.head_dim,
    chat_template=GEMMA_TURNS, chat_template_name="Gemma's <start_of_turn> turns",
)
