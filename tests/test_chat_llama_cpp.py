"""Chat prompts of Llama 3, Qwen2.5 and TinyLlama (Zephyr) style files equal what llama.cpp's server builds.

The server renders the file's template (/apply-template, BOS text stripped
when the vocabulary adds BOS) and tokenizes the result with BOS added; our
ChatTemplate must render the same text and a Conversation must hold the same
ids, turn after turn.
"""

from __future__ import annotations

import datetime
import json
import urllib.request

import pytest
from llama_server import llama_server
from tokenizer_vocabs import (
    LLAMA3_STYLE_TEMPLATE,
    QWEN25_STYLE_TEMPLATE,
    ZEPHYR_STYLE_TEMPLATE,
    bpe_vocab,
    spm_vocab,
    write_vocab_gguf,
)

from pagedkv.chat import ChatTemplate, Conversation
from pagedkv.tokenizer import Tokenizer

CASES = {
    "llama3": (lambda: bpe_vocab("llama-bpe"), LLAMA3_STYLE_TEMPLATE),
    "qwen25": (lambda: bpe_vocab("qwen2"), QWEN25_STYLE_TEMPLATE),
    "tinyllama": (spm_vocab, ZEPHYR_STYLE_TEMPLATE),
}
TURNS = [
    {"role": "user", "content": "Hi there! What is 1234 + 5678? 中文 😀"},
    {"role": "assistant", "content": "It's 6912.\n\nAnything else?"},
    {"role": "user", "content": "  Spaces  around, and a newline\n"},
]


def _post(origin: str, path: str, body: dict) -> dict:
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(origin + path, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module", params=list(CASES))
def served(request, tmp_path_factory):
    make_spec, template = CASES[request.param]
    spec = make_spec()
    gguf = write_vocab_gguf(tmp_path_factory.mktemp(request.param) / "chat.gguf", spec, chat_template=template)
    manifest = {"tokenizer": spec, "chat_template": template}
    tok = Tokenizer.from_manifest(manifest)
    with llama_server(gguf) as origin:
        yield tok, ChatTemplate.from_manifest(manifest, tok), origin


@pytest.mark.parametrize("system", [None, "Be brief. "])
def test_prompt_text_and_ids_equal_llama_cpp_turn_by_turn(served, system):
    tok, template, origin = served
    head = [{"role": "system", "content": system}] if system else []
    for n in (1, 3):
        messages = head + TURNS[:n]
        server_prompt = _post(origin, "/apply-template", {"messages": messages})["prompt"]
        assert template.render(messages, add_generation_prompt=True) == server_prompt
        server_ids = _post(origin, "/tokenize", {"content": server_prompt, "add_special": True, "parse_special": True})
        assert Conversation(tok, template, messages).prompt_ids() == server_ids["tokens"]


def test_history_grows_by_appending_and_equals_a_fresh_prompt(served):
    tok, template, origin = served
    conversation = Conversation(tok, template)
    prompt = conversation.add_user(TURNS[0]["content"])
    reply = tok.encode_after(TURNS[1]["content"], prompt[-1])  # what the model would generate
    conversation.add_generated(reply + [tok.eos_token_id])
    before = conversation.ids
    prompt = conversation.add_user(TURNS[2]["content"])
    assert prompt[: len(before)] == before
    assert prompt == Conversation(tok, template, TURNS).prompt_ids()
    assert prompt[0] == tok.bos_token_id if tok.add_bos else prompt[0] != tok.bos_token_id


def test_llama3_template_sees_the_date_and_raises():
    template = ChatTemplate(LLAMA3_STYLE_TEMPLATE, bos_token="<|begin_of_text|>", strip_bos=True)
    text = template.render([{"role": "user", "content": "x"}], add_generation_prompt=False)
    assert "Today Date: " + datetime.datetime.now().strftime("%d %b %Y") + "\n\n" in text
    assert not text.startswith("<|begin_of_text|>")
    with pytest.raises(ValueError, match="roles must alternate"):
        template.render([{"role": "assistant", "content": "x"}], add_generation_prompt=True)
