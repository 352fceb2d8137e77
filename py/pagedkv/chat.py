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

from pagedkv.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant")
RENDER_SECONDS = 2.0  # a template renders a conversation in milliseconds; one still busy after this runs away
MAX_RANGE_ITEMS = 100_000  # items range() may yield in one render, every range and every pass over it together
MAX_RENDER_CHARS = 1 << 20  # output (and any value built) beyond 4 x the messages' own text: markers, not megabytes
# What ChatTemplate.check renders: the turns every chat template must accept (no system message: Gemma's refuses one).
SAMPLE_CONVERSATION = (
    {"role": "user", "content": "Hello! Who are you?"},
    {"role": "assistant", "content": "I am a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
)


def validate_messages(messages: object) -> list[dict[str, str]]:
    """Check a message list and return fresh ``{"role", "content"}`` dicts.

    Raises ValueError naming the first offending message.
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of {{'role', 'content'}} objects, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty; give at least one {'role': 'user', 'content': ...} message")
    return [validate_message(m, index=i) for i, m in enumerate(messages)]


def validate_message(message: object, *, index: int = 0) -> dict[str, str]:
    """Check one message and return a fresh ``{"role", "content"}`` dict."""
    if not isinstance(message, dict):
        raise ValueError(f"message {index} must be an object with 'role' and 'content', got {type(message).__name__}")
    missing = [k for k in ("role", "content") if k not in message]
    if missing:
        raise ValueError(f"message {index} lacks {missing}")
    role, content = message["role"], message["content"]
    if role not in ROLES:
        raise ValueError(f"message {index} has unknown role {role!r}; expected one of {list(ROLES)}")
    if not isinstance(content, str):
        raise ValueError(f"message {index} ({role}) content must be a string, got {type(content).__name__}")
    try:
        content.encode("utf-8")
    except UnicodeEncodeError as exc:  # a browser's text can hold half of a UTF-16 pair (a cut emoji)
        where = f"after {content[max(0, exc.start - 12):exc.start]!r}" if exc.start else "at its start"
        raise ValueError(f"message {index} ({role}) is not valid text: it holds a lone surrogate "
                         f"U+{ord(content[exc.start]):04X} (half of an emoji or other character) {where}; "
                         "delete that character and send it again") from None
    return {"role": role, "content": content}


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

    def render(self, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
        """Render ``messages`` (validated); with ``add_generation_prompt`` end with the assistant opener."""
        checked = validate_messages(messages)
        budget = _RenderBudget(MAX_RENDER_CHARS + 4 * sum(len(m["content"]) for m in checked))
        chunks, size = [], 0
        try:
            for chunk in self._template.generate(
                messages=checked,
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
        self, tokenizer: Tokenizer, template: ChatTemplate, messages: Iterable[dict] = ()
    ) -> None:
        """Start a conversation, optionally replaying earlier ``messages`` (as text)."""
        self.tokenizer = tokenizer
        self.template = template
        self._messages: list[dict[str, str]] = []
        # The tokenizer's own BOS (llama.cpp adds it to every prompt when the file says so).
        self._ids: list[int] = [tokenizer.bos_token_id] if tokenizer.add_bos else []
        self._text = ""  # what self._ids decode to, as the template rendered it
        for index, message in enumerate(messages):
            checked = validate_message(message, index=index)
            self.add_message(checked["role"], checked["content"])

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
        message = validate_message({"role": role, "content": content}, index=len(self._messages))
        messages = self._messages + [message]
        rendered = self.template.render(messages, add_generation_prompt=False)
        suffix = self._suffix_after(self._text, rendered)
        self._ids.extend(self._encode_after(suffix, self._ids))
        self._text += suffix
        self._messages = messages

    def prompt_ids(self) -> list[int]:
        """Ids to feed the model for the next assistant reply: history + the assistant opener."""
        return self._ids + self._encode_after(self._generation_prompt(), self._ids)

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
        rendered = self.template.render(messages, add_generation_prompt=False)
        closing = self._suffix_after(self._text + opener + content, rendered)
        opener_ids = self._encode_after(opener, self._ids)
        self._ids += opener_ids + generated + self._encode_after(closing, self._ids + opener_ids + generated)
        self._text += opener + content + closing
        self._messages = messages
        return content

    def _encode_after(self, text: str, previous: Sequence[int]) -> list[int]:
        return self.tokenizer.encode_after(text, previous[-1] if previous else None)

    def _generation_prompt(self) -> str:
        if not self._messages:
            raise ValueError("conversation has no messages; add a user message before asking for a reply")
        rendered = self.template.render(self._messages, add_generation_prompt=True)
        return self._suffix_after(self._text, rendered)

    @staticmethod
    def _suffix_after(prefix: str, rendered: str) -> str:
        if not rendered.startswith(prefix):
            raise ValueError(
                "the chat template re-rendered earlier turns differently when a message was added; "
                "it is not append-only, so the token history cannot be reused"
            )
        return rendered[len(prefix) :]
