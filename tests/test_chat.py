"""Chat template rendering and append-only conversation token history."""

from __future__ import annotations

import pytest

from gguf_tokenizer import gguf_manifest_sections, smollm2_tokenizer
from pagedkv.chat import SAMPLE_CONVERSATION, ChatTemplate, Conversation, validate_messages

DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def template(tok):
    return ChatTemplate.from_manifest(gguf_manifest_sections(), tok)


def fresh_ids(tok, template, messages, *, add_generation_prompt):
    return tok.encode(template.render(messages, add_generation_prompt=add_generation_prompt))


# ---------------------------------------------------------------- rendering


def test_default_system_message_when_none_given(template):
    text = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_explicit_system_message_replaces_default(template):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert template.render(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )


def test_rendered_prompt_ids(tok, template):
    ids = fresh_ids(tok, template, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert ids == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
        19712, 8182, 2, 198, 1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198,
    ]  # fmt: skip


def test_template_sees_bos_eos_and_raise_exception(tok):
    t = ChatTemplate("{{ bos_token }}|{{ eos_token }}|{{ messages[0]['content'] | tojson }}", bos_token="<s>", eos_token="</s>")
    assert t.render([{"role": "user", "content": "é\"<"}], add_generation_prompt=False) == '<s>|</s>|"é\\"<"'
    failing = ChatTemplate("{{ raise_exception('only user/assistant alternation') }}")
    with pytest.raises(ValueError, match="failed to render: only user/assistant alternation"):
        failing.render([{"role": "user", "content": "x"}], add_generation_prompt=False)


def test_template_is_sandboxed():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="failed to render"):
        t.render([{"role": "user", "content": "x"}], add_generation_prompt=False)


def test_trim_and_lstrip_blocks_like_hf():
    t = ChatTemplate("{% for m in messages %}\n    {{ m['content'] }}\n{% endfor %}")
    assert t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], add_generation_prompt=False) == "    a\n    b\n"


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "messages is empty"),
        ("hi", "messages must be a list"),
        ([{"role": "robot", "content": "x"}], "message 0 has unknown role 'robot'"),
        ([{"role": "user", "content": "x"}, {"role": "user", "content": 5}], "message 1 \\(user\\) content must be a string or a list of text parts, got int"),
        ([{"role": "user", "content": None}], "content must be a string or a list of text parts, got NoneType"),
        ([{"role": "user"}], "message 0 lacks \\['content'\\]"),
        (["hello"], "message 0 must be an object"),
        ([{"role": "user", "content": "Hi \ud83d there"}],
         "^message 0 \\(user\\) is not valid text: it holds a lone surrogate U\\+D83D \\(half of an emoji or other "
         "character\\) after 'Hi '; delete that character and send it again$"),
        ([{"role": "user", "content": "\udc00"}], "lone surrogate U\\+DC00 .* at its start;"),
    ],
)
def test_invalid_messages_rejected(template, messages, message):
    with pytest.raises(ValueError, match=message):
        validate_messages(messages)
    with pytest.raises(ValueError, match=message):
        template.render(messages, add_generation_prompt=True)


def test_bad_template_source_rejected():
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ValueError, match="non-empty string"):
        ChatTemplate("")
    with pytest.raises(ValueError, match="no 'chat_template'"):
        ChatTemplate.from_manifest({"tokenizer": {}})


# -------------------------------------------------------------- conversation


def test_each_turn_extends_the_previous_turn_exactly(tok, template):
    conv = Conversation(tok, template)
    prompt1 = conv.add_user("What is 2+2?")
    assert prompt1 == fresh_ids(tok, template, conv.messages, add_generation_prompt=True)
    generated1 = tok.encode("2+2 equals 4.") + [tok.im_end_id]  # as the sampler returns it, stop token included
    assert conv.add_generated(generated1) == "2+2 equals 4."

    prompt2 = conv.add_user("And 3+3?")
    assert prompt2[: len(prompt1) + len(generated1)] == prompt1 + generated1
    assert prompt2 == fresh_ids(tok, template, conv.messages, add_generation_prompt=True)

    generated2 = tok.encode("3+3 equals 6.")  # stopped by max tokens: no stop token
    conv.add_generated(generated2)
    prompt3 = conv.add_user("Привет! 你好 👍")
    assert prompt3[: len(prompt2) + len(generated2)] == prompt2 + generated2
    assert prompt3 == fresh_ids(tok, template, conv.messages, add_generation_prompt=True)
    assert conv.messages == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 equals 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "3+3 equals 6."},
        {"role": "user", "content": "Привет! 你好 👍"},
    ]
    assert conv.ids == prompt3[: conv.num_tokens]
    assert prompt3[conv.num_tokens :] == [1, 520, 9531, 198]  # <|im_start|>assistant\n


def test_history_keeps_generated_ids_where_fresh_encode_differs(tok, template):
    """The model may emit a non-canonical split; the history keeps its exact ids.

    A fresh render + encode tokenizes the same text canonically, so the two id
    lists differ exactly in the assistant's reply span and decode to the same text.
    """
    conv = Conversation(tok, template, [{"role": "system", "content": "Be brief."}])
    prompt1 = conv.add_user("Say hello.")
    generated = [tok.token_to_id(c) for c in "Hello"]  # five single-letter tokens
    assert generated != tok.encode("Hello")
    conv.add_generated(generated)
    prompt2 = conv.add_user("Again.")
    assert prompt2[: len(prompt1) + len(generated)] == prompt1 + generated

    fresh = fresh_ids(tok, template, conv.messages, add_generation_prompt=True)
    canonical = tok.encode("Hello")
    assert fresh == prompt1 + canonical + prompt2[len(prompt1) + len(generated) :]
    assert tok.decode(fresh) == tok.decode(prompt2)


def test_reply_starting_with_whitespace_differs_from_fresh_encode(tok, template):
    """Generated text is never re-tokenized together with the opener's newline.

    ``"assistant\\n"`` + ``"  x"`` pre-tokenizes jointly as ``"\\n "``, ``" x"``
    but the history holds ``"\\n"`` (prompt) then the generated ids.
    """
    conv = Conversation(tok, template)
    prompt1 = conv.add_user("Indent.")
    generated = tok.encode("  x")
    conv.add_generated(generated)
    prompt2 = conv.add_user("Ok")
    assert prompt2[: len(prompt1) + len(generated)] == prompt1 + generated
    fresh = fresh_ids(tok, template, conv.messages, add_generation_prompt=True)
    assert fresh != prompt2
    assert tok.decode(fresh) == tok.decode(prompt2)


def test_replayed_messages_equal_fresh_encode(tok, template):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]
    conv = Conversation(tok, template, messages)
    assert conv.ids == fresh_ids(tok, template, messages, add_generation_prompt=False)
    assert conv.prompt_ids() == fresh_ids(tok, template, messages, add_generation_prompt=True)


def test_conversation_rejects_bad_input_and_keeps_state(tok, template):
    conv = Conversation(tok, template)
    with pytest.raises(ValueError, match="no messages"):
        conv.prompt_ids()
    conv.add_user("Hi")
    before = (conv.ids, conv.messages)
    with pytest.raises(ValueError, match="unknown role 'robot'"):
        conv.add_message("robot", "x")
    with pytest.raises(ValueError, match="content must be a string"):
        conv.add_user(5)
    with pytest.raises(ValueError, match=r"message 1 \(user\) is not valid text: it holds a lone surrogate U\+D83D"):
        conv.add_user("cut emoji \ud83d")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        conv.add_generated([5, 49152])
    with pytest.raises(ValueError, match="is not an int"):
        conv.add_generated([5, "6"])
    assert (conv.ids, conv.messages) == before
    with pytest.raises(ValueError, match="message 0 has unknown role"):
        Conversation(tok, template, [{"role": "bot", "content": "x"}])


def test_non_append_only_template_is_detected(tok):
    counting = ChatTemplate("{{ messages | length }}{% for m in messages %}|{{ m['content'] }}{% endfor %}")
    conv = Conversation(tok, counting)
    conv.add_user("a")
    before = conv.ids
    with pytest.raises(ValueError, match="not append-only"):
        conv.add_user("b")
    assert conv.ids == before and len(conv.messages) == 1


def test_checkpoint_rollback_restores_exact_history(tok, template):
    conv = Conversation(tok, template)
    conv.add_user("first")
    conv.add_generated(tok.encode("reply one"))
    cp = conv.checkpoint()
    ids, messages = conv.ids, conv.messages
    prompt = conv.add_user("second")
    conv.add_generated(tok.encode("reply two"))
    conv.rollback(cp)
    assert conv.ids == ids and conv.messages == messages
    assert conv.add_user("second") == prompt


@pytest.mark.parametrize("source,problem", [
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "it built a namespace value of 2,097,152 items (at most 1,048,580)"),
    ("{% for i in range(100) %}{{ 'y' * 20000 }}{% endfor %}", "its output passed 1,048,580 characters"),
    ("{{ 9 ** 999999 }}", "it raised 9 to the power 999,999"),
    ("{% set r = range(50000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
     "its range() calls yield more than 100,000 items in one render"),
    ("{% for i in range(99999)[1:] %}{% for j in range(99999)[1:] %}{% endfor %}{% endfor %}",
     "its range() calls yield more than 100,000 items in one render"),
    ("{{ 'ab' | list | first + 1 }}", 'TypeError: can only concatenate str (not "int") to str'),
])
def test_every_render_is_bounded_and_its_errors_are_value_errors(source, problem):
    t = ChatTemplate(source)
    with pytest.raises(ValueError) as info:
        t.render([{"role": "user", "content": "x"}], add_generation_prompt=True)
    assert str(info.value) == f"chat template failed to render: {problem}"


def test_bounded_range_behaves_as_range():
    t = ChatTemplate("{{ range(3) | list }} {{ range(2, 8, 3) | length }} {{ range(4) | reverse | join(',') }} "
                     "{% for i in range(3) %}{{ loop.index }}/{{ loop.length }} {% endfor %}{{ range(5)[1:3] }}")
    assert t.render([{"role": "user", "content": "x"}], add_generation_prompt=False) == \
        "[0, 1, 2] 2 3,2,1,0 1/3 2/3 3/3 range(1, 3)"


def test_check_renders_the_sample_conversation(template):
    template.check()  # SmolLM2's ChatML
    assert template.render(SAMPLE_CONVERSATION, add_generation_prompt=True).endswith(
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match=r"^chat template failed to render: no system messages$"):
        ChatTemplate("{% if messages[0]['role'] == 'user' %}{{ raise_exception('no system messages') }}{% endif %}"
                     ).check()
