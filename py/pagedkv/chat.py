"""Conversations rendered with the model's own jinja2 chat template.

The template (ChatML for SmolLM2) ships inside the model file and is rendered
the way Hugging Face renders it: a sandboxed jinja2 environment with
``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, and the
``raise_exception`` / ``tojson`` / ``strftime_now`` helpers templates use.
The template comes from a file anyone may write, so each render is bounded (_RenderBudget): time, the items
of ``range()``, the size of ``*`` products and namespace values, and the output's length.

A ``Conversation`` keeps the token ids of everything said so far. A new turn
appends only the tokens of the newly rendered suffix, and a reply is kept as
the exact ids the model generated, so each prompt starts with exactly the
previous prompt + reply ids and the prefix cache hits every earlier block.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from pagedkv.slices import SLICE_CHARS, SLICE_MESSAGES, Slices, run_slices
from pagedkv.tokenizer import Tokenizer
from pagedkv.tool_calls import ToolFormat, generic_messages

ROLES = ("system", "developer", "user", "assistant", "tool")
# What a message of each role may hold besides its role (OpenAI's fields). `name` is OpenAI's participant name: it
# reaches the template as the message's `name`, which a template may read (SmolLM2's, Qwen2.5's and Llama 3's don't).
MESSAGE_FIELDS = {
    "system": ("content", "name"),
    "developer": ("content", "name"),
    "user": ("content", "name"),
    "assistant": ("content", "name", "tool_calls"),
    "tool": ("content", "tool_call_id"),
}
# Content parts that are not text: each refused with what it would need.
NON_TEXT_PARTS = {"image_url": "an image", "input_audio": "audio", "file": "a file", "refusal": "a refusal"}
RENDER_SECONDS = 2.0  # a template renders a conversation in milliseconds; one still busy after this runs away
MAX_RANGE_ITEMS = 100_000  # items range() may yield in one render, every range and every pass over it together
MAX_RENDER_CHARS = 1 << 20  # output (and any value built) beyond 4 x the messages' own text: markers, not megabytes
# What ChatTemplate.check renders: the turns every chat template must accept (no system message: Gemma's refuses one).
SAMPLE_CONVERSATION = (
    {"role": "user", "content": "Hello! Who are you?"},
    {"role": "assistant", "content": "I am a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
)


class MessageError(ValueError):
    """A message the engine refuses; `param` names where it is wrong (``messages[1].content[0]``), for the 400."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


def validate_messages(messages: object) -> list[dict]:
    """Check a message list and return fresh checked messages (validate_message); a tool result must answer a
    call of an earlier assistant message.

    Raises MessageError naming the first offending message.
    """
    return run_slices(validate_messages_slices(messages))


def validate_messages_slices(messages: object) -> Slices[list[dict]]:
    """validate_messages in slices (slices.py): a pause after every SLICE_MESSAGES messages."""
    if not isinstance(messages, (list, tuple)):
        raise MessageError(f"messages must be a list of {{'role', 'content'}} objects, got {type(messages).__name__}")
    if not messages:
        raise MessageError("messages is empty; give at least one {'role': 'user', 'content': ...} message")
    checked = []
    for i, message in enumerate(messages):
        checked.append(validate_message(message, index=i))
        if (i + 1) % SLICE_MESSAGES == 0:
            yield
    called: set[str] = set()
    for index, message in enumerate(checked):
        called.update(call["id"] for call in message.get("tool_calls", ()))
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise MessageError(f"message {index} (tool) answers tool_call_id {message['tool_call_id']!r}, which no "
                               "earlier assistant message's tool_calls holds", f"messages[{index}].tool_call_id")
    return checked


def validate_message(message: object, *, index: int = 0) -> dict:
    """Check one message and return a fresh ``{"role", "content"}`` dict, with ``name``, ``tool_calls`` (each
    ``{"id", "type": "function", "function": {"name", "arguments": JSON text of an object}}``) or
    ``tool_call_id`` where the message has them. Content given as text parts is joined by newlines; an
    assistant's null content (a tool-call turn) is ""; the developer role is the system role (OpenAI's newer
    name for it)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise MessageError(f"message {index} must be an object with 'role' and 'content', got "
                           f"{type(message).__name__}", where)
    role = message.get("role")
    if "role" not in message:
        raise MessageError(f"message {index} lacks ['role']", f"{where}.role")
    if role not in ROLES:
        raise MessageError(f"message {index} has unknown role {role!r}; expected one of {list(ROLES)}", f"{where}.role")
    unknown = [k for k in message if k != "role" and k not in MESSAGE_FIELDS[role]]
    if unknown:
        raise MessageError(f"message {index} ({role}) has unknown field {unknown[0]!r}; a {role} message holds "
                           f"{['role', *MESSAGE_FIELDS[role]]}", f"{where}.{unknown[0]}")
    checked = {"role": "system" if role == "developer" else role}
    tool_calls = message.get("tool_calls")
    if "content" not in message and not tool_calls:
        raise MessageError(f"message {index} lacks ['content']", f"{where}.content")
    content = message.get("content")
    if content is None and tool_calls:
        content = ""  # a tool-call turn (the AI SDK sends null): the calls are the message
    checked["content"] = _content(content, role, index)
    if message.get("name") is not None:
        if not isinstance(message["name"], str) or not message["name"]:
            raise MessageError(f"message {index} ({role}) name must be a non-empty string, got {message['name']!r}",
                               f"{where}.name")
        checked["name"] = message["name"]
    if tool_calls is not None:
        checked["tool_calls"] = _tool_calls(tool_calls, index)
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise MessageError(f"message {index} (tool) needs tool_call_id, the id of the call it answers, got "
                               f"{call_id!r}", f"{where}.tool_call_id")
        checked["tool_call_id"] = call_id
    return checked


def _content(content: object, role: str, index: int) -> str:
    """A message's text: a string, or the text parts of a list (OpenAI's `[{type: "text", text}]`) joined by
    newlines, as vLLM joins them for a template that takes text."""
    where = f"messages[{index}].content"
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in NON_TEXT_PARTS:
                raise MessageError(f"message {index} ({role}) content[{j}] is {NON_TEXT_PARTS[kind]} ({kind!r} part); "
                                   "this engine serves text models only (none reads images, audio or files): send "
                                   "text parts", f"{where}[{j}]")
            if kind != "text" or not isinstance(part.get("text"), str) or set(part) != {"type", "text"}:
                raise MessageError(f"message {index} ({role}) content[{j}] must be a text part "
                                   f"{{'type': 'text', 'text': str}}, got {part!r:.80}", f"{where}[{j}]")
            texts.append(part["text"])
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise MessageError(f"message {index} ({role}) content must be a string or a list of text parts, got "
                           f"{type(content).__name__}", where)
    try:
        content.encode("utf-8")
    except UnicodeEncodeError as exc:  # a browser's text can hold half of a UTF-16 pair (a cut emoji)
        at = f"after {content[max(0, exc.start - 12):exc.start]!r}" if exc.start else "at its start"
        raise MessageError(f"message {index} ({role}) is not valid text: it holds a lone surrogate "
                           f"U+{ord(content[exc.start]):04X} (half of an emoji or other character) {at}; "
                           "delete that character and send it again", where) from None
    return content


def _tool_calls(calls: object, index: int) -> list[dict]:
    """An assistant message's tool_calls, checked (their arguments the JSON text of an object: a template reads
    them as one)."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(calls, list) or not calls:
        raise MessageError(f"message {index} (assistant) tool_calls must be a non-empty list, got {calls!r:.80}", where)
    checked = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or set(call) - {"id", "type", "function"} or call.get("type") != "function" \
                or not isinstance(call.get("id"), str) or not call["id"] or not isinstance(function, dict) \
                or set(function) != {"name", "arguments"} or not isinstance(function["name"], str) \
                or not isinstance(function["arguments"], str):
            raise MessageError(f"message {index} (assistant) tool_calls[{j}] must be {{'id': str, 'type': "
                               f"'function', 'function': {{'name': str, 'arguments': str}}}}, got {call!r:.120}", at)
        try:
            arguments = json.loads(function["arguments"])
        except (json.JSONDecodeError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict):
            raise MessageError(f"message {index} (assistant) tool_calls[{j}].function.arguments must be the JSON "
                               f"text of an object, got {function['arguments']!r:.80}", f"{at}.function.arguments")
        checked.append({"id": call["id"], "type": "function", "function": dict(function)})
    return checked


def _template_message(message: dict) -> dict:
    """A checked message as a template reads it: a call's arguments an object (templates write them with tojson)."""
    if "tool_calls" not in message:
        return message
    calls = [dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"])))
             for c in message["tool_calls"]]
    return dict(message, tool_calls=calls)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: object, indent: int | None = None) -> str:
    # HF's variant: no HTML escaping, non-ASCII kept as is.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _RenderBudget:
    """What one render may spend: RENDER_SECONDS, MAX_RANGE_ITEMS and `max_chars` per value and in all of its
    output. Past any of them it raises TemplateError. Its names start with "_" so the sandbox keeps a template
    from calling them (it reaches the template as a variable, for _Sandbox.call_binop)."""

    def __init__(self, max_chars: int) -> None:
        self._deadline = time.monotonic() + RENDER_SECONDS
        self._range_items = MAX_RANGE_ITEMS
        self._max_chars = max_chars

    def _tick(self) -> None:
        if time.monotonic() > self._deadline:
            raise jinja2.TemplateError(f"it ran for more than {RENDER_SECONDS:g} s")

    def _spend_range(self, n: int) -> None:
        self._range_items -= n
        if self._range_items < 0:
            raise jinja2.TemplateError(f"its range() calls yield more than {MAX_RANGE_ITEMS:,} items in one render")

    def _sized(self, value, what: str = "a value"):
        if isinstance(value, (str, list, tuple)) and len(value) > self._max_chars:
            raise jinja2.TemplateError(f"it built {what} of {len(value):,} items (at most {self._max_chars:,})")
        return value

    def _range(self, *args) -> "_BoundedRange":
        items = range(*args)
        if len(items) > MAX_RANGE_ITEMS:
            raise jinja2.TemplateError(f"it asked for range({', '.join(map(repr, args))}) ({len(items):,} items; "
                                       f"at most {MAX_RANGE_ITEMS:,} in one render)")
        return _BoundedRange(items, self)

    def _namespace(self, *args, **kwargs) -> Namespace:
        return _BoundedNamespace(self, *args, **kwargs)


class _BoundedRange(Sequence):
    """range() in a template: each pass over it is charged to the render's budget, and checks its deadline."""

    def __init__(self, items: range, budget: _RenderBudget) -> None:
        self._items, self._budget = items, budget

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index):
        item = self._items[index]
        return _BoundedRange(item, self._budget) if isinstance(index, slice) else item  # a slice stays charged

    def __repr__(self) -> str:
        return repr(self._items)

    def __iter__(self):
        self._budget._spend_range(len(self._items))
        for n, item in enumerate(self._items):
            if n % 1024 == 0:
                self._budget._tick()
            yield item


class _BoundedNamespace(Namespace):
    """namespace() in a template, the one state a loop can grow from pass to pass: its values are bounded."""

    def __init__(self, budget: _RenderBudget, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_budget_of_render", budget)

    def __setitem__(self, name: str, value) -> None:
        budget = object.__getattribute__(self, "_budget_of_render")  # Namespace's own lookup sees only its values
        budget._tick()
        super().__setitem__(name, budget._sized(value, "a namespace value"))


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox with `*` and `**` checked: "x" * 10**9 and 9**9**9 are refused before they are computed."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator: str, left, right):
        budget = context.get("_render_budget")
        if operator == "**" and isinstance(right, int) and abs(right) > 64 and isinstance(left, (int, float)) \
                and abs(left) > 1:
            raise jinja2.TemplateError(f"it raised {left!r} to the power {right:,}")
        if operator == "*" and budget is not None:
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > budget._max_chars:
                    raise jinja2.TemplateError(f"it repeated a value of {len(seq):,} items {n:,} times (at most "
                                               f"{budget._max_chars:,} items)")
        return super().call_binop(context, operator, left, right)


class ChatTemplate:
    """A compiled jinja2 chat template."""

    def __init__(
        self, source: str, *, bos_token: str = "", eos_token: str = "", strip_bos: bool = False, strip_eos: bool = False
    ) -> None:
        """Compile ``source``; ``bos_token``/``eos_token`` are exposed to it as variables.

        ``strip_bos``/``strip_eos``: the tokenizer adds BOS/EOS itself, so a
        rendering that starts with the BOS text (ends with the EOS text) loses
        it, as llama.cpp's server does, and the prompt holds one BOS, not two.
        """
        if not isinstance(source, str) or not source:
            raise ValueError("chat template must be a non-empty string")
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc} (line {exc.lineno})") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.strip_bos = strip_bos
        self.strip_eos = strip_eos
        self.tool_format = ToolFormat.of(source)

    @classmethod
    def from_manifest(cls, manifest: dict, tokenizer: Tokenizer | None = None) -> ChatTemplate:
        """The template stored in a model manifest; BOS/EOS text taken from ``tokenizer``."""
        source = manifest.get("chat_template") if isinstance(manifest, dict) else None
        if not source:
            raise ValueError("model manifest has no 'chat_template'")
        bos = eos = ""
        if tokenizer is None:
            return cls(source)
        if tokenizer.bos_token_id is not None:
            bos = tokenizer.id_to_token(tokenizer.bos_token_id)
        if tokenizer.eos_token_id is not None:
            eos = tokenizer.id_to_token(tokenizer.eos_token_id)
        return cls(source, bos_token=bos, eos_token=eos, strip_bos=tokenizer.add_bos, strip_eos=tokenizer.add_eos)

    def check(self) -> None:
        """Render SAMPLE_CONVERSATION, with and without the generation prompt, so that a template that fails or
        runs away is refused when the model loads, not at its first message; ValueError saying why."""
        for add_generation_prompt in (True, False):
            self.render(SAMPLE_CONVERSATION, add_generation_prompt=add_generation_prompt)

    def render(self, messages: Sequence[dict], *, add_generation_prompt: bool,
               tools: Sequence[dict] | None = None) -> str:
        """Render ``messages`` (validated); with ``add_generation_prompt`` end with the assistant opener:
        render_slices done at once."""
        return run_slices(self.render_slices(messages, add_generation_prompt=add_generation_prompt, tools=tools))

    def render_slices(self, messages: Sequence[dict], *, add_generation_prompt: bool,
                      tools: Sequence[dict] | None = None) -> Slices[str]:
        """render(), pausing after every SLICE_CHARS characters of output (slices.py): jinja writes a template's
        output piece by piece.

        ``tools`` (OpenAI's function tools, checked): a template that reads them (``tool_format.native``) gets them
        as ``tools``, and the messages' tool calls and results as they are, each call's arguments an object, as
        HF transformers' apply_chat_template passes them; for any other template the tools, calls and results
        become text in our format (tool_calls.generic_messages)."""
        checked = yield from validate_messages_slices(messages)
        if self.tool_format.native:
            inputs = {"messages": [_template_message(m) for m in checked]} | ({"tools": list(tools)} if tools else {})
        else:
            inputs = {"messages": generic_messages(checked, list(tools) if tools else None)}
        text_size = sum(len(m["content"]) for m in inputs["messages"]) + (len(json.dumps(tools)) if tools else 0)
        budget = _RenderBudget(MAX_RENDER_CHARS + 4 * text_size)
        chunks, size, since_pause = [], 0, 0
        try:
            for chunk in self._template.generate(
                **inputs,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                range=budget._range,
                namespace=budget._namespace,
                _render_budget=budget,
            ):
                size += len(chunk)
                if size > budget._max_chars:
                    raise jinja2.TemplateError(f"its output passed {budget._max_chars:,} characters")
                budget._tick()
                chunks.append(chunk)
                since_pause += len(chunk)
                if since_pause >= SLICE_CHARS:
                    since_pause, paused = 0, time.monotonic()
                    yield
                    budget._deadline += time.monotonic() - paused  # RENDER_SECONDS is the render's own time
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed to render: {exc}") from exc
        except Exception as exc:  # the template is a file's code: its errors are the file's, said as such
            raise ValueError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc
        text = "".join(chunks)
        if self.strip_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        if self.strip_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text


class Conversation:
    """A multi-turn chat whose token ids only ever grow by appending."""

    def __init__(
        self, tokenizer: Tokenizer, template: ChatTemplate, messages: Iterable[dict] = (), *,
        tools: Sequence[dict] = ()
    ) -> None:
        """Start a conversation, optionally replaying earlier ``messages`` (as text). ``tools``: the function
        tools every rendering states (ChatTemplate.render)."""
        self.tokenizer = tokenizer
        self.template = template
        self.tools = tuple(tools)
        self._messages: list[dict] = []
        # The tokenizer's own BOS (llama.cpp adds it to every prompt when the file says so).
        self._ids: list[int] = [tokenizer.bos_token_id] if tokenizer.add_bos else []
        self._text = ""  # what self._ids decode to, as the template rendered it
        messages = list(messages)
        if messages:
            self.add_messages(messages)

    @property
    def messages(self) -> list[dict[str, str]]:
        """Copies of the messages so far."""
        return [dict(m) for m in self._messages]

    @property
    def ids(self) -> list[int]:
        """Token ids of every finished message (no generation prompt)."""
        return list(self._ids)

    @property
    def num_tokens(self) -> int:
        """Number of token ids of every finished message."""
        return len(self._ids)

    def checkpoint(self) -> tuple:
        """An opaque copy of the history, for `rollback` (a refused turn, a regenerated reply)."""
        return (tuple(dict(m) for m in self._messages), tuple(self._ids), self._text)

    def rollback(self, checkpoint: tuple) -> None:
        """Return to a `checkpoint` of this conversation: later messages and ids are dropped."""
        messages, ids, text = checkpoint
        self._messages, self._ids, self._text = [dict(m) for m in messages], list(ids), text

    def add_message(self, role: str, content: str) -> None:
        """Append a message given as text (system, user, or a known assistant reply)."""
        self.add_messages([{"role": role, "content": content}])

    def add_messages(self, messages: Sequence[dict]) -> None:
        """Append messages (validate_message's forms: tool calls and results too) in one rendering: a template
        may write a run of them as one turn (Qwen2.5's tool results), or need the next to render the first
        (Llama 3's tools go into the first user message)."""
        run_slices(self.add_messages_slices(messages))

    def add_messages_slices(self, messages: Sequence[dict]) -> Slices[None]:
        """add_messages in slices (slices.py): the rendering and the tokenizing pause every SLICE_CHARS
        characters. The conversation changes only at the end."""
        messages = yield from validate_messages_slices(self._messages + list(messages))
        rendered = yield from self.template.render_slices(messages, add_generation_prompt=False, tools=self.tools)
        suffix = self._suffix_after(self._text, rendered)
        ids = yield from self.tokenizer.encode_after_slices(suffix, self._ids[-1] if self._ids else None)
        self._ids.extend(ids)
        self._text += suffix
        self._messages = messages

    def prompt_ids(self) -> list[int]:
        """Ids to feed the model for the next assistant reply: history + the assistant opener."""
        return run_slices(self.prompt_ids_slices())

    def prompt_ids_slices(self) -> Slices[list[int]]:
        """prompt_ids in slices (slices.py)."""
        opener = yield from self._generation_prompt_slices()
        return self._ids + (yield from self.tokenizer.encode_after_slices(opener, self._ids[-1] if self._ids else None))

    def add_user(self, content: str) -> list[int]:
        """Append a user message and return the prompt ids for the reply."""
        self.add_message("user", content)
        return self.prompt_ids()

    def add_generated(self, generated_ids: Sequence[int]) -> str:
        """Record the model's reply as the exact ids it generated; return the reply text.

        A trailing end-of-generation token (``tokenizer.eog_ids``: EOS,
        ``<|im_end|>``, ``<|eot_id|>``...) is dropped from the reply; the
        template's own closing (``<|im_end|>\\n`` for ChatML) is appended instead,
        so with ChatML (closing = ``<|im_end|>`` + newline) the history starts with
        prompt + generated ids even when the stop token is included.
        The reply text is the lossy UTF-8 decode of the ids (a character cut by
        max_tokens becomes U+FFFD); the ids themselves are kept as generated.
        """
        generated = [self.tokenizer.check_id(i) for i in generated_ids]
        if generated and generated[-1] in self.tokenizer.eog_ids:
            generated.pop()
        opener = self._generation_prompt()
        content = self.tokenizer.decode(generated)
        message = {"role": "assistant", "content": content}
        messages = self._messages + [message]
        rendered = self._render(messages, add_generation_prompt=False)
        closing = self._suffix_after(self._text + opener + content, rendered)
        opener_ids = self._encode_after(opener, self._ids)
        self._ids += opener_ids + generated + self._encode_after(closing, self._ids + opener_ids + generated)
        self._text += opener + content + closing
        self._messages = messages
        return content

    def _encode_after(self, text: str, previous: Sequence[int]) -> list[int]:
        return self.tokenizer.encode_after(text, previous[-1] if previous else None)

    def _generation_prompt(self) -> str:
        return run_slices(self._generation_prompt_slices())

    def _generation_prompt_slices(self) -> Slices[str]:
        if not self._messages:
            raise ValueError("conversation has no messages; add a user message before asking for a reply")
        rendered = yield from self.template.render_slices(self._messages, add_generation_prompt=True, tools=self.tools)
        return self._suffix_after(self._text, rendered)

    def _render(self, messages: list[dict], *, add_generation_prompt: bool) -> str:
        return self.template.render(messages, add_generation_prompt=add_generation_prompt, tools=self.tools)

    @staticmethod
    def _suffix_after(prefix: str, rendered: str) -> str:
        if not rendered.startswith(prefix):
            raise ValueError(
                "the chat template re-rendered earlier turns differently when a message was added; "
                "it is not append-only, so the token history cannot be reused"
            )
        return rendered[len(prefix) :]
