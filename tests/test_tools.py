"""What OpenAI clients send, and tool calls: every new request form parse_request takes and every 400 it gives
(exact message and param); tools rendered through Qwen2.5's, Llama 3.1's and Mistral Nemo's own templates and, for
SmolLM2's, which does not read tools, or one that reads them in an unknown format, stated in our tagged format;
calls parsed from replies in each format, a reply cut into pieces at every position parsing to the same events as
whole; the streamed deltas assembling to the non-streamed message; the forced calls' grammars."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
import json

import pytest

from gguf_tokenizer import gguf_manifest_sections
from pagedkv.api import _collect
from pagedkv.chat import ChatTemplate
from pagedkv.completions import ApiError, chunk, completion, parse_request, tool_call_deltas
from pagedkv.tool_calls import ToolCall, ToolCallParser, ToolFormat, generic_messages
from pagedkv.grammar import SchemaError
from pagedkv.grammar.automaton import Automaton
from pagedkv.tools import ToolChoice, call_grammar
from tool_templates import LLAMA31_TOOLS_TEMPLATE, MISTRAL_NEMO_TOOLS_TEMPLATE, QWEN25_TOOLS_TEMPLATE


def run_alone(coro):
    """asyncio.run in a thread of its own: when the browser tests ran first, Playwright's sync API keeps a loop
    running in this thread, where asyncio.run refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
USER = [{"role": "user", "content": "hi"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
# A tool-call turn as the Vercel AI SDK sends it back (content null), then the tool's result.
HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"}]


def parse(**fields):
    return parse_request({"model": "m", "messages": USER} | fields, ["m"])


# ---------------------------------------------------------------- requests


def test_clients_forms_are_accepted():
    req = parse(messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "Weather in Paris?", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "22 C"},
                                                                {"type": "text", "text": "sunny"}]},
    ], tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}},
        metadata={"app": "demo"}, store=False, parallel_tool_calls=False, service_tier="auto", modalities=["text"],
        user="u1")
    assert req.messages == [
        {"role": "system", "content": "Be\nbrief."},
        {"role": "user", "content": "Weather in Paris?", "name": "ann"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "22 C\nsunny", "tool_call_id": "call_1"},
    ]
    assert req.tools == (WEATHER, TIME) and req.tool_choice == ToolChoice("function", "get_time")
    assert req.parallel_tool_calls is False and req.shown_tools == (WEATHER, TIME)
    assert parse(tools=[WEATHER]).tool_choice == ToolChoice("auto")
    assert parse(tools=[WEATHER], tool_choice="none").shown_tools == ()  # "none": the model is told of no tools
    assert parse(tools=None, tool_choice=None, metadata=None, store=None, service_tier="default").tools == ()
    assert parse(tools=[dict(WEATHER, function=dict(WEATHER["function"], strict=True))],
                 tool_choice="required").tool_choice.forced


STRICT = dict(WEATHER, function=dict(WEATHER["function"], strict=True))
REFUSED = [
    ({"tools": []}, "tools", "tools is empty; give at least one tool, or leave tools out"),
    ({"tools": "x"}, "tools", "tools must be a list of {'type': 'function', 'function': {...}} objects, got str"),
    ({"tools": [{"type": "custom", "custom": {}}]}, "tools[0]",
     "tools[0] must be {'type': 'function', 'function': {name, description, parameters, strict}} (this engine calls "
     "functions only), got {'type': 'custom', 'custom': {}}"),
    ({"tools": [{"type": "function", "function": []}]}, "tools[0].function",
     "tools[0].function must be an object, got list"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name",
     "tools[0].function.name must be 1 to 64 letters, digits, '_' or '-', got 'a b'"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name",
     "tools[1].function.name 'get_weather' names an earlier tool too; names must differ"),
    ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]}, "tools[0].function.x",
     "tools[0].function has unknown field 'x'; a function holds ['name', 'description', 'parameters', 'strict']"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]}, "tools[0].function.description",
     "tools[0].function.description must be a string"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters", "tools[0].function.parameters must be a JSON schema of type 'object' (the "
     "arguments are an object), got {'type': 'array'}"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools[0].function.strict",
     "tools[0].function.strict must be true or false, got 'yes'"),
    ({"tools": [STRICT]}, "tools[0].function.strict",
     "tools[0].function.strict is true with tool_choice 'auto': the engine holds a call to its schema by constrained "
     "decoding, which it applies only where a call is forced; send tool_choice 'required' (or the function by "
     "name), or strict false"),
    ({"tool_choice": "auto"}, "tool_choice", "tool_choice is only allowed when tools are given"),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice",
     "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}, got 'any'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice.function.name", "tool_choice names the function 'g', which tools does not hold; tools: "
     "['get_weather']"),
    ({"store": True}, "store", "store must be false here, got True: it keeps completions on OpenAI's servers for "
     "evals and distillation, and the engine keeps nothing past a request (pagedkv.session continues a chat)"),
    ({"service_tier": "flex"}, "service_tier",
     "service_tier must be 'auto' or 'default' here, got 'flex': a tab has one tier, its own"),
    ({"modalities": ["text", "audio"]}, "modalities",
     "modalities must be ['text'] here, got ['text', 'audio']: the models here write text only"),
    ({"metadata": {"a": 1}}, "metadata", "metadata must be an object of at most 16 string values (keys up to 64 "
     "characters, values up to 512), got {'a': 1}"),
    ({"parallel_tool_calls": 1}, "parallel_tool_calls", "parallel_tool_calls must be true or false, got 1"),
    ({"reasoning_effort": "low"}, "reasoning_effort", "reasoning_effort is not supported by this engine: it budgets "
     "a reasoning model's thinking, and no model here thinks under a budget"),
    ({"functions": []}, "functions",
     "functions is not supported by this engine: OpenAI's deprecated form of tools; send tools"),
    ({"function_call": "auto"}, "function_call",
     "function_call is not supported by this engine: OpenAI's deprecated form of tool_choice; send tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]", "message 0 (user) content[0] is an image ('image_url' part); this engine serves text "
     "models only (none reads images, audio or files): send text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_audio"}]}]},
     "messages[0].content[1]", "message 0 (user) content[1] is audio ('input_audio' part); this engine serves text "
     "models only (none reads images, audio or files): send text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}, "messages[0].content[0]",
     "message 0 (user) content[0] is a file ('file' part); this engine serves text models only (none reads images, "
     "audio or files): send text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0]",
     "message 0 (user) content[0] must be a text part {'type': 'text', 'text': str}, got {'type': 'text'}"),
    ({"messages": [{"role": "user", "content": "x", "foo": 1}]}, "messages[0].foo",
     "message 0 (user) has unknown field 'foo'; a user message holds ['role', 'content', 'name']"),
    ({"messages": [{"role": "user", "content": "x", "name": ""}]}, "messages[0].name",
     "message 0 (user) name must be a non-empty string, got ''"),
    ({"messages": [{"content": "x"}]}, "messages[0].role", "message 0 lacks ['role']"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role",
     "message 0 has unknown role 'function'; expected one of ['system', 'developer', 'user', 'assistant', 'tool']"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content",
     "message 0 (assistant) content must be a string or a list of text parts, got NoneType"),
    ({"messages": [{"role": "assistant", "tool_calls": []}]}, "messages[0].content", "message 0 lacks ['content']"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": {}}]}, "messages[0].tool_calls",
     "message 0 (assistant) tool_calls must be a non-empty list, got {}"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [dict(CALL, type="x")]}]},
     "messages[0].tool_calls[0]", "message 0 (assistant) tool_calls[0] must be {'id': str, 'type': 'function', "
     "'function': {'name': str, 'arguments': str}}, got " + repr(dict(CALL, type="x"))),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        dict(CALL, function={"name": "f", "arguments": "[1]"})]}]}, "messages[0].tool_calls[0].function.arguments",
     "message 0 (assistant) tool_calls[0].function.arguments must be the JSON text of an object, got '[1]'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id",
     "message 0 (tool) needs tool_call_id, the id of the call it answers, got None"),
    ({"messages": [*HISTORY[:3], dict(HISTORY[3], tool_call_id="call_2")]}, "messages[3].tool_call_id",
     "message 3 (tool) answers tool_call_id 'call_2', which no earlier assistant message's tool_calls holds"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c", "name": "f"}]}, "messages[0].name",
     "message 0 (tool) has unknown field 'name'; a tool message holds ['role', 'content', 'tool_call_id']"),
]


@pytest.mark.parametrize(("fields", "param", "message"), REFUSED, ids=[p for _, p, _ in REFUSED])
def test_refused_with_the_field_named(fields, param, message):
    with pytest.raises(ApiError) as err:
        parse(**fields)
    assert (err.value.status, err.value.param, err.value.message) == (400, param, message)


def test_a_legacy_body_with_tools_is_told_where_they_belong():
    with pytest.raises(ApiError) as err:
        parse_request({"model": "m", "prompt": "x", "tools": [WEATHER]}, ["m"], legacy=True)
    assert (err.value.param, err.value.message) == (
        "tools", "tools is a Chat Completions field (/v1/chat/completions); a legacy completion calls no tools")


# ---------------------------------------------------------------- rendering

QWEN_TOOLS = (
    '<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
    'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' + json.dumps(WEATHER)
    + '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    '</tool_call><|im_end|>\n')
QWEN_TURNS = (
    '<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", '
    '"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n22 C, sunny\n'
    '</tool_response><|im_end|>\n<|im_start|>assistant\n')
LLAMA_TOOLS = (
    '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: '
    'December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven '
    'the following functions, please respond with a JSON for a function call with its proper arguments that best '
    'answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument '
    'name and its value}.Do not use variables.\n\n' + json.dumps(WEATHER, indent=4) + '\n\nWeather in Paris?<|eot_id|>'
    '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}'
    '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"22 C, sunny"<|eot_id|><|start_header_id|>assistant'
    '<|end_header_id|>\n\n')


def test_qwen25s_template_states_the_tools_and_writes_calls_and_results_itself():
    template = ChatTemplate(QWEN25_TOOLS_TEMPLATE)
    assert template.tool_format == ToolFormat("tagged", native=True)
    assert template.render(HISTORY, add_generation_prompt=True, tools=[WEATHER]) == QWEN_TOOLS + QWEN_TURNS
    # tool_choice "none": no tools stated, the history's call and result still written by the template
    assert template.render(HISTORY, add_generation_prompt=True) == \
        "<|im_start|>system\nBe brief.<|im_end|>\n" + QWEN_TURNS


def test_llama31s_template_takes_json_calls():
    template = ChatTemplate(LLAMA31_TOOLS_TEMPLATE, bos_token="<|begin_of_text|>")
    assert template.tool_format == ToolFormat("json", native=True)
    assert template.render(HISTORY, add_generation_prompt=True, tools=[WEATHER]) == LLAMA_TOOLS


def test_smollm2s_template_gets_the_tools_in_our_format():
    template = ChatTemplate.from_manifest(gguf_manifest_sections())
    assert "tools" not in template.source and template.tool_format == ToolFormat("tagged", native=False)
    instruction = (
        "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as JSON "
        "schemas:\n" + json.dumps(WEATHER) + "\n\nTo call a function, reply with a JSON object holding its name and "
        "arguments within <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call>\nA function's result comes back in a user message within "
        "<tool_response></tool_response> tags.")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    two_results = [*HISTORY[:2], dict(HISTORY[2], tool_calls=[CALL, dict(CALL, id="call_2")]), HISTORY[3],
                   {"role": "tool", "tool_call_id": "call_2", "content": "9 C"}]
    assert template.render(two_results, add_generation_prompt=True, tools=[WEATHER]) == (
        f"<|im_start|>system\nBe brief.\n\n{instruction}<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        f"<|im_start|>assistant\n{call}\n{call}<|im_end|>\n<|im_start|>user\n<tool_response>\n22 C, sunny\n"
        "</tool_response>\n<tool_response>\n9 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # no system message: the instruction is one of its own (SmolLM2's default system prompt is not rendered)
    assert template.render(USER, add_generation_prompt=False, tools=[WEATHER]) == (
        f"<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")


MISTRAL_CALL = dict(CALL, id="Xy7Pq2Rs9")  # Mistral's templates take 9 letters and digits, nothing else
MISTRAL_HISTORY = [*HISTORY[:2], dict(HISTORY[2], tool_calls=[MISTRAL_CALL]), dict(HISTORY[3], tool_call_id="Xy7Pq2Rs9")]
MISTRAL_TOOLS = ('[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather", "description": "Weather '
                 'now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": '
                 '["city"]}}}][/AVAILABLE_TOOLS]')


def test_mistral_nemos_template_reads_tools_and_takes_mistral_call_ids():
    template = ChatTemplate(MISTRAL_NEMO_TOOLS_TEMPLATE, bos_token="<s>", eos_token="</s>")
    assert template.tool_format == ToolFormat("mistral", native=True)
    # its own rendering: the tools before the last user message (the system message only joins that one), the
    # call as a [TOOL_CALLS] array with its id, the result as [TOOL_RESULTS]
    assert template.render(MISTRAL_HISTORY, add_generation_prompt=True, tools=[WEATHER]) == (
        f'<s>{MISTRAL_TOOLS}[INST]Weather in Paris?[/INST][TOOL_CALLS][{{"name": "get_weather", "arguments": '
        '{"city": "Paris"}, "id": "Xy7Pq2Rs9"}]</s>[TOOL_RESULTS]{"content": 22 C, sunny, "call_id": '
        '"Xy7Pq2Rs9"}[/TOOL_RESULTS]')
    assert template.render(HISTORY[:2], add_generation_prompt=True, tools=[WEATHER]) == \
        f"<s>{MISTRAL_TOOLS}[INST]Be brief.\n\nWeather in Paris?[/INST]"
    # OpenAI's call_... ids are refused by the template: the ids the engine gives a Mistral model's calls are
    # ones it takes back
    with pytest.raises(ValueError) as err:
        template.render(HISTORY, add_generation_prompt=True, tools=[WEATHER])
    assert str(err.value) == "chat template failed to render: Tool call IDs should be alphanumeric strings with " \
                             "length 9!"
    ids = {template.tool_format.call_id() for _ in range(20)}
    assert len(ids) == 20 and all(len(i) == 9 and i.isascii() and i.isalnum() for i in ids)
    fresh = [*HISTORY[:2], dict(HISTORY[2], tool_calls=[dict(CALL, id=min(ids))]),
             dict(HISTORY[3], tool_call_id=min(ids))]
    assert f'"id": "{min(ids)}"}}]</s>' in template.render(fresh, add_generation_prompt=True, tools=[WEATHER])
    assert ToolFormat("tagged", native=True).call_id().startswith("call_")


# A template that reads `tools` in a format of its own (here: a <function=...> tag, no marker NATIVE_FORMATS lists).
UNKNOWN_TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>Call as <function=name>{args}</function>\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.mark.parametrize(("source", "expected"), [
    (QWEN25_TOOLS_TEMPLATE, ToolFormat("tagged", native=True)),
    (LLAMA31_TOOLS_TEMPLATE, ToolFormat("json", native=True)),
    (MISTRAL_NEMO_TOOLS_TEMPLATE, ToolFormat("mistral", native=True)),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", ToolFormat("tagged", native=False)),  # no tools: ours
    (UNKNOWN_TOOLS_TEMPLATE, ToolFormat("tagged", native=False)),  # tools in an unknown format: ours
], ids=["qwen", "llama", "mistral", "no-tools", "unknown"])
def test_each_template_format_is_read_off_its_source(source, expected):
    assert ToolFormat.of(source) == expected


def test_a_template_with_an_unknown_tool_format_gets_the_tools_in_ours():
    """Its own format could not be parsed back, so it is not given `tools`: they come as text in the system
    message, in the tagged format the parser reads, as for a template that reads none."""
    template = ChatTemplate(UNKNOWN_TOOLS_TEMPLATE)
    stated = generic_messages(HISTORY, [WEATHER])
    assert "<tools>" not in template.render(HISTORY, add_generation_prompt=True, tools=[WEATHER])
    assert template.render(HISTORY, add_generation_prompt=True, tools=[WEATHER]) == "".join(
        f"<{m['role']}>{m['content']}</{m['role']}>\n" for m in stated) + "<assistant>"
    assert stated[0]["content"].startswith("Be brief.\n\n# Tools\n") and "<tool_call>" in stated[2]["content"]


# ---------------------------------------------------------------- parsing

TAGGED, JSON_CALLS = ToolFormat("tagged", native=True), ToolFormat("json", native=True)
MISTRAL = ToolFormat("mistral", native=True)
NAMES = frozenset({"get_weather", "get_time"})
PARIS = ToolCall("get_weather", '{"city":"Paris"}')
PARSED = [
    (TAGGED, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', [PARIS]),
    (TAGGED, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n',
     ["Let me look.", PARIS, ToolCall("get_time", "{}")]),
    (TAGGED, 'A <tool_call> B', ["A <tool_call> B"]),  # unclosed, not JSON: the text it was
    (TAGGED, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', [PARIS]),  # unclosed at the end
    (TAGGED, '<tool_call>{"name": "nope", "arguments": {}}</tool_call> ok',
     ['<tool_call>{"name": "nope", "arguments": {}}</tool_call> ok']),  # no such function: text
    (TAGGED, '<tool_call>{"name": "get_time", "arguments": []}</tool_call>',
     ['<tool_call>{"name": "get_time", "arguments": []}</tool_call>']),
    (TAGGED, ' Plain <tool text\n', [" Plain <tool text\n"]),  # no call: whitespace kept
    (TAGGED, '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n\nDone. ',
     [ToolCall("get_time", "{}"), "Done."]),  # whitespace next to a call dropped
    (JSON_CALLS, ' {"name": "get_weather", "parameters": {"city": "Paris"}}', [PARIS]),
    (JSON_CALLS, '{"name": "get_weather", "arguments": {"city": "Paris"}}\n', [PARIS]),
    (JSON_CALLS, '{"name": "get_weather"}', ['{"name": "get_weather"}']),
    (JSON_CALLS, 'It is {"a": 1}', ['It is {"a": 1}']),
    (JSON_CALLS, '\n {"name": "get_time", "parameters": {}, "x": 1}', ['\n {"name": "get_time", "parameters": {}, '
                                                                       '"x": 1}']),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', [PARIS]),
    (MISTRAL, 'Let me look. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "Xy7Pq2Rs9"}, '
              '{"name": "get_time", "arguments": {}}] Done.', ["Let me look.", PARIS, ToolCall("get_time", "{}"),
                                                               "Done."]),  # two calls in one array, ids echoed
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "nope", "arguments": {}}]',
     ['[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "nope", "arguments": {}}]']),
    (MISTRAL, '[TOOL_CALLS] sure [x]', ["[TOOL_CALLS] sure [x]"]),  # no array after the marker: text
    (MISTRAL, '[TOOL_CALLS][] [TOOL_CALLS][{"name": "get_time", "arguments": {}}]', ["[TOOL_CALLS][]",
                                                                                    ToolCall("get_time", "{}")]),
    (MISTRAL, 'A [TOOL_CALLS][{"name": "get_time"', ['A [TOOL_CALLS][{"name": "get_time"']),  # cut off: text
    (MISTRAL, 'Plain [TOOL_ text', ["Plain [TOOL_ text"]),
]


def events_of(parser: ToolCallParser, pieces: list[str]) -> list:
    """The parser's events with adjacent texts joined (where a cut falls decides only how text is split)."""
    out = []
    for event in [e for p in pieces for e in parser.push(p)] + parser.finish():
        if isinstance(event, str) and out and isinstance(out[-1], str):
            out[-1] += event
        else:
            out.append(event)
    return out


@pytest.mark.parametrize(("fmt", "text", "expected"), PARSED)
def test_calls_parse_the_same_however_the_reply_is_cut(fmt, text, expected):
    assert events_of(ToolCallParser(fmt, NAMES), [text]) == expected
    for cut in range(len(text) + 1):
        assert events_of(ToolCallParser(fmt, NAMES), [text[:cut], text[cut:]]) == expected, cut
    assert events_of(ToolCallParser(fmt, NAMES), list(text)) == expected


def test_text_that_may_begin_a_call_is_held_back():
    parser = ToolCallParser(TAGGED, NAMES)
    assert parser.push("Sure <tool") == ["Sure"]  # the space waits: a call may follow it
    assert parser.push("s here") == [" <tools here"]
    assert parser.push(" <tool_call>{") == []
    json_parser = ToolCallParser(JSON_CALLS, NAMES)
    assert json_parser.push('  {"name": "get_time",') == [] and json_parser.push(' "parameters": {}}') == []
    assert json_parser.finish() == [ToolCall("get_time", "{}")]


def test_streamed_deltas_assemble_to_the_message():
    deltas = tool_call_deltas(0, "call_a", "get_weather", '{"city":"Paris"}') + \
        tool_call_deltas(1, "call_b", "get_time", "{}")
    assert deltas[:2] == [{"index": 0, "id": "call_a", "type": "function",
                           "function": {"name": "get_weather", "arguments": ""}},
                          {"index": 0, "function": {"arguments": '{"city":"Paris"}'}}]
    pieces = [chunk("c", "m", 1, 0, role=True), chunk("c", "m", 1, 0, text="Checking.")]
    pieces += [chunk("c", "m", 1, 0, tool_call=d) for d in deltas]
    pieces += [chunk("c", "m", 1, 0, finish_reason="tool_calls"), chunk("c", "m", 1, use={"total_tokens": 3})]
    assert pieces[2]["choices"][0]["delta"] == {"tool_calls": [deltas[0]]}

    async def collect():
        async def stream():
            for piece in pieces:
                yield piece
        return await _collect(stream(), legacy=False)

    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]
    out = run_alone(collect())
    assert out == completion("c", "m", 1, [{"index": 0, "text": "Checking.", "finish_reason": "tool_calls",
                                            "tool_calls": calls}], {"total_tokens": 3})
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Checking.", "tool_calls": calls}
    only_calls = completion("c", "m", 1, [{"index": 0, "text": "", "finish_reason": "tool_calls",
                                           "tool_calls": calls}], {})
    assert only_calls["choices"][0]["message"] == {"role": "assistant", "content": None, "tool_calls": calls}


# ---------------------------------------------------------------- a forced call's grammar


def test_a_forced_calls_grammar_is_the_format_around_the_parameters_schema():
    tagged = Automaton(call_grammar(TAGGED, (WEATHER, TIME), ToolChoice("required")).term)
    assert tagged.matches('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert tagged.matches('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert not tagged.matches('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')  # city required
    assert not tagged.matches('<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}\n</tool_call>')
    assert not tagged.matches('{"name": "get_time", "arguments": {}}')  # the tags are part of the call
    named = Automaton(call_grammar(JSON_CALLS, (WEATHER, TIME), ToolChoice("function", "get_time")).term)
    assert named.matches('{"name": "get_time", "parameters": {}}')
    assert not named.matches('{"name": "get_weather", "parameters": {"city": "Paris"}}')  # not the one named
    assert not named.matches('{"name": "get_time", "arguments": {}}')  # Llama's key is "parameters"
    odd = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "not": {"const": "y"}}}}}}
    with pytest.raises(SchemaError) as err:
        call_grammar(TAGGED, (TIME, odd), ToolChoice("required"))
    assert err.value.param == "tools[1].function.parameters.properties.x.not"


WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TIME_CALL = '{"name": "get_time", "arguments": {}}'


def test_a_forced_call_is_one_call_in_each_format():
    """"required" takes one call of any tool, in the template's format, with or without parallel_tool_calls (a
    second call cannot follow); what it lets a Mistral model write, the Mistral parser reads back."""
    tools, required = (WEATHER, TIME), ToolChoice("required")
    blocks = [f"<tool_call>\n{c}\n</tool_call>" for c in (WEATHER_CALL, TIME_CALL)]
    tagged = Automaton(call_grammar(TAGGED, tools, required).term)
    assert (tagged.matches(blocks[0]), tagged.matches(blocks[1]), tagged.matches("\n".join(blocks))) == \
        (True, True, False)
    mistral = Automaton(call_grammar(MISTRAL, tools, required).term)
    assert mistral.matches(f"[TOOL_CALLS][{WEATHER_CALL}]") and mistral.matches(f"[TOOL_CALLS][{TIME_CALL}]")
    assert not mistral.matches(f"[TOOL_CALLS][{WEATHER_CALL}, {TIME_CALL}]")
    assert not mistral.matches("[TOOL_CALLS][]") and not mistral.matches(f"[{WEATHER_CALL}]")
    named = Automaton(call_grammar(MISTRAL, tools, ToolChoice("function", "get_time")).term)
    assert named.matches(f"[TOOL_CALLS][{TIME_CALL}]") and not named.matches(f"[TOOL_CALLS][{WEATHER_CALL}]")
    assert mistral.matches(MISTRAL.call_text("get_time", {})) and tagged.matches(TAGGED.call_text("get_time", {}))
    parser = ToolCallParser(MISTRAL, NAMES)
    assert parser.push(f"[TOOL_CALLS][{WEATHER_CALL}]") + parser.finish() == [PARIS]
