"""Tool calls as text: the format a model writes them in, the prompt that states tools to a template that does not
read them, and the calls parsed back out of a reply streamed in pieces.

Three formats (docs/api.md, "Tools"):

- ``tagged``: each call a JSON object ``{"name": ..., "arguments": {...}}`` on its own line between
  ``<tool_call>`` and ``</tool_call>`` (Qwen2.5's and Hermes' format), several calls one after another. Ours too:
  a template that does not read ``tools`` (SmolLM2's), or reads them in a format not listed here, gets them
  stated in the system message in this format (generic_messages), and its history's calls and results rendered
  as this text.
- ``json``: the whole reply one JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.x's templates, which
  read ``tools`` and ask for JSON); ``arguments`` is read as ``parameters``. One call a reply: Llama's templates
  refuse a history message with more.
- ``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name": ..., "arguments": {...}}`` objects (Mistral's v3
  templates: Mistral 7B v0.3, Nemo, Small), several calls in one array.

A template's format is read off its source (ToolFormat.of, by NATIVE_FORMATS). Pure Python: the page's worker
shares it.
"""
from __future__ import annotations

import json
import secrets
import string
import uuid
from dataclasses import dataclass

__all__ = ["CALL_OPEN", "CALL_CLOSE", "MISTRAL_CALLS", "NATIVE_FORMATS", "ToolCall", "ToolCallParser", "ToolFormat",
           "generic_messages"]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_CALLS = "[TOOL_CALLS]"
# A template that reads `tools` writes calls in its model's own format, told by text that only that format's
# templates hold (the first found wins). One that reads them and holds none of these gets ours: its own format is
# one this engine could not parse, so the tools go to it as text in the tagged format (generic_messages).
NATIVE_FORMATS = (
    (CALL_OPEN, "tagged"),  # Qwen2.5, Qwen3, Hermes: "<tool_call>\n{...}\n</tool_call>"
    (MISTRAL_CALLS, "mistral"),  # Mistral v3 (7B v0.3, Nemo, Small): "[TOOL_CALLS][{...}, ...]"
    # Llama 3.1 to 3.3: 'Respond in the format {"name": function name, "parameters": dictionary of argument ...'
    ('"parameters": dictionary of argument name', "json"),
)
MISTRAL_ID_CHARS = string.ascii_letters + string.digits
MISTRAL_ID_LENGTH = 9  # Mistral's templates refuse (raise_exception) a call id of any other length
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
GENERIC_INSTRUCTION = (
    "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as JSON "
    "schemas:\n{tools}\n\nTo call a function, reply with a JSON object holding its name and arguments within "
    f"{CALL_OPEN}{CALL_CLOSE} tags:\n{CALL_OPEN}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}"
    f"\n{CALL_CLOSE}\nA function's result comes back in a user message within {RESPONSE_OPEN}{RESPONSE_CLOSE} tags."
)


@dataclass(frozen=True)
class ToolFormat:
    """How a model's chat template states tools and how its model writes a call. `native`: the template reads
    `tools` itself (they go to it as HF transformers' apply_chat_template passes them); else they are stated in
    the system message in our tagged format (generic_messages). `kind`: "tagged", "json" or "mistral" (module
    docstring)."""

    kind: str
    native: bool

    @classmethod
    def of(cls, template_source: str) -> ToolFormat:
        """A template that never mentions `tools` cannot state them (SmolLM2's): ours. One that does is in the
        format of the first NATIVE_FORMATS marker its source holds; with none, ours (its own format is unknown)."""
        if "tools" in template_source:
            for marker, kind in NATIVE_FORMATS:
                if marker in template_source:
                    return cls(kind, native=True)
        return cls("tagged", native=False)

    @property
    def arguments_key(self) -> str:
        """The key a call's arguments sit under in the text the model writes."""
        return "parameters" if self.kind == "json" else "arguments"

    def call_text(self, name: str, arguments: dict) -> str:
        """One call written as the model writes it in this format."""
        body = json.dumps({"name": name, self.arguments_key: arguments}, ensure_ascii=False)
        if self.kind == "tagged":
            return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"
        return f"{MISTRAL_CALLS}[{body}]" if self.kind == "mistral" else body

    def call_id(self) -> str:
        """A new id for a returned call, one the template takes back in the history: Mistral's refuse any but 9
        letters and digits; others get OpenAI's `call_...` shape."""
        if self.kind == "mistral":
            return "".join(secrets.choice(MISTRAL_ID_CHARS) for _ in range(MISTRAL_ID_LENGTH))
        return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a reply: the function's name and its arguments as compact JSON text (OpenAI's
    `function.arguments`)."""

    name: str
    arguments: str


def generic_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """`messages` for a template that does not read tools: the tools stated in the system message (after its own
    text; a system message of their own when there is none), each assistant call written as tagged text after
    the message's content, and each run of tool results one user message of `<tool_response>` blocks. Every
    message comes out as plain {role, content} (a `name` kept)."""
    out: list[dict] = []
    if tools:
        listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        instruction = GENERIC_INSTRUCTION.replace("{tools}", listed)
        if messages and messages[0]["role"] == "system":
            first, messages = messages[0], messages[1:]
            out.append(dict(first, content=f"{first['content']}\n\n{instruction}" if first["content"] else instruction))
        else:
            out.append({"role": "system", "content": instruction})
    tagged = ToolFormat("tagged", native=False)
    for message in messages:
        if message["role"] == "tool":
            result = f"{RESPONSE_OPEN}\n{message['content']}\n{RESPONSE_CLOSE}"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
            continue
        plain = {k: v for k, v in message.items() if k != "tool_calls"}
        calls = [tagged.call_text(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in message.get("tool_calls", ())]
        if calls:
            plain["content"] = "\n".join(([message["content"]] if message["content"] else []) + calls)
        out.append(plain)
    return [{k: v for k, v in m.items() if k != "tool_results"} for m in out]


class ToolCallParser:
    """The calls in a reply given as text pieces, in one format. `push(piece)` and, at the end, `finish()` return
    events in order: text to show (str) and ToolCall. Text that may begin a call is held back until decided (as
    StopStrings holds a stop string's start). A call that does not parse, or names no function in `names`, is
    shown as the text it was (Mistral's array: the whole of it, if any call in it does not). Whitespace next to a
    call is dropped, so the content is the text around the calls. Events depend only on the whole text, not on
    where it was cut into pieces: a streamed reply assembles to the reply parsed in one piece."""

    def __init__(self, fmt: ToolFormat, names: frozenset[str]) -> None:
        self.fmt, self.names = fmt, names
        self._open = MISTRAL_CALLS if fmt.kind == "mistral" else CALL_OPEN  # what begins a call (tagged, mistral)
        self._held = ""  # text not yet decided: the start of a call, or a tail that may begin one
        self._in_call = False  # tagged, mistral: after the opening marker
        self._decided = False  # json: the reply is known not to be a call (its first non-space is not "{")
        self._space = ""  # whitespace held until text follows it (shown) or a call does (dropped)
        self._after_call = False  # whitespace after a call is dropped too
        self.num_calls = 0

    def push(self, piece: str) -> list:
        self._held += piece
        return self._json() if self.fmt.kind == "json" else self._marked()

    def finish(self) -> list:
        """The events of what is held when the reply ends: an unclosed call that parses is a call."""
        held, self._held = self._held, ""
        if self._in_call:
            self._in_call = False
            events = self._call(held, f"{self._open}{held}")
        elif self.fmt.kind == "json" and not self._decided:
            events = self._call(held, held)
        else:
            events = self._text(held)
        if self._space and not self.num_calls:
            events.append(self._space)
        self._space = ""
        return events

    def _marked(self) -> list:
        """tagged and mistral: text up to the opening marker, then a call up to its end (_call_end)."""
        events = []
        while True:
            if self._in_call:
                end = self._call_end()
                if end is None:
                    return events
                close = CALL_CLOSE if self.fmt.kind == "tagged" else ""  # a Mistral array's own "]" ends it
                body, self._held, self._in_call = self._held[:end], self._held[end + len(close):], False
                events += self._call(body, f"{self._open}{body}{close}")
                continue
            start = self._held.find(self._open)
            if start >= 0:
                events += self._text(self._held[:start])
                self._held, self._in_call = self._held[start + len(self._open):], True
                continue
            keep = next((n for n in range(min(len(self._open) - 1, len(self._held)), 0, -1)
                         if self._held.endswith(self._open[:n])), 0)
            text, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
            return events + self._text(text)

    def _call_end(self) -> int | None:
        """Where the held call's text ends, or None while undecided. tagged: at `</tool_call>` (which follows).
        mistral: after the JSON value that follows the marker (the value decides whether it is a call); a value
        that does not start with `[` ends at once (it is text)."""
        if self.fmt.kind == "tagged":
            end = self._held.find(CALL_CLOSE)
            return end if end >= 0 else None
        body = self._held.lstrip()
        if not body:
            return None
        at = len(self._held) - len(body)
        if body[0] != "[":
            return at
        if "]" not in body:  # no array closes without one: spare the decoder a text that cannot end yet
            return None
        try:
            _, end = json.JSONDecoder().raw_decode(body)
        except (json.JSONDecodeError, RecursionError):
            return None  # unfinished, or not JSON at all: decided when the reply ends (finish)
        return at + end

    def _json(self) -> list:
        if not self._decided:
            stripped = self._held.lstrip()
            if not stripped or stripped.startswith("{"):
                return []  # a call until the reply shows otherwise: decided at its end
            self._decided = True
        held, self._held = self._held, ""
        return self._text(held)

    def _call(self, body: str, as_text: str) -> list:
        calls = self._parse(body)
        if calls is None:
            return self._text(as_text)
        self._space, self._after_call = "", True
        self.num_calls += len(calls)
        return calls

    def _parse(self, body: str) -> list[ToolCall] | None:
        """The calls `body` holds: one JSON call object (tagged, json) or a non-empty array of them (mistral);
        None if it is not that."""
        try:
            value = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            return None
        if self.fmt.kind != "mistral":
            call = self._one(value, ())
            return None if call is None else [call]
        calls = [self._one(v, ("id",)) for v in value] if isinstance(value, list) and value else [None]
        return None if None in calls else calls

    def _one(self, value: object, optional: tuple[str, ...]) -> ToolCall | None:
        """One call object: its name and arguments (as `arguments` or `parameters`), and keys in `optional` (a
        Mistral model may echo the `id` its template writes into the history's calls)."""
        if not isinstance(value, dict):
            return None
        keys = set(value) - set(optional)
        if keys - {"name", "arguments", "parameters"} or len(keys) != 2:
            return None
        arguments = value.get("arguments", value.get("parameters"))
        if value.get("name") not in self.names or not isinstance(arguments, dict):
            return None
        return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False, separators=(",", ":")))

    def _text(self, text: str) -> list:
        """Text outside calls: shown, less a whitespace tail held until the next text or call decides it."""
        body = text.rstrip()
        if not body:
            self._space += text
            return []
        shown = body.lstrip() if self._after_call else self._space + body
        self._space, self._after_call = text[len(body):], False
        return [shown]
