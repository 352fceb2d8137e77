"""The tools of a Chat Completions request: `tools` and `tool_choice` checked (ValueError-like ToolError naming the
field, for the 400), and the grammar that forces a call where `tool_choice` asks for one.

OpenAI's shapes: `tools: [{type: "function", function: {name, description?, parameters?, strict?}}]`,
`tool_choice: "auto" | "none" | "required" | {type: "function", function: {name}}`. What the engine does with
them: docs/api.md, "Tools". Pure Python: the page's worker shares it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .grammar import Grammar
from .slices import Slices, run_slices
from .tool_calls import CALL_CLOSE, CALL_OPEN, MISTRAL_CALLS, ToolFormat

__all__ = ["MAX_TOOLS", "ToolChoice", "ToolError", "call_grammar", "call_grammar_slices", "check_tool_choice",
           "check_tools"]

MAX_TOOLS = 128  # OpenAI's limit
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")


class ToolError(ValueError):
    """A tools or tool_choice value refused; `param` names where (``tools[0].function.name``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolChoice:
    """`mode`: "auto" (the model may call), "none" (it does not: the tools are not shown to it), "required" (it
    calls one of them) or "function" (it calls `name`)."""

    mode: str = "none"
    name: str | None = None

    @property
    def forced(self) -> bool:
        """A call is forced: decoding is constrained to one (call_grammar)."""
        return self.mode in ("required", "function")


def check_tools(value: object) -> tuple[dict, ...]:
    """Check `tools`; returns fresh `{type: "function", function: {...}}` dicts as given."""
    if not isinstance(value, list):
        raise ToolError(f"tools must be a list of {{'type': 'function', 'function': {{...}}}} objects, got "
                        f"{type(value).__name__}", "tools")
    if not value:  # OpenAI refuses it too
        raise ToolError("tools is empty; give at least one tool, or leave tools out", "tools")
    if len(value) > MAX_TOOLS:
        raise ToolError(f"tools holds at most {MAX_TOOLS} tools, got {len(value)}", "tools")
    tools, names = [], set()
    for i, tool in enumerate(value):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) != {"type", "function"}:
            raise ToolError(f"{at} must be {{'type': 'function', 'function': {{name, description, parameters, "
                            f"strict}}}} (this engine calls functions only), got {tool!r:.120}", at)
        function = tool["function"]
        if not isinstance(function, dict):
            raise ToolError(f"{at}.function must be an object, got {type(function).__name__}", f"{at}.function")
        unknown = [k for k in function if k not in FUNCTION_FIELDS]
        if unknown:
            raise ToolError(f"{at}.function has unknown field {unknown[0]!r}; a function holds {list(FUNCTION_FIELDS)}",
                            f"{at}.function.{unknown[0]}")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolError(f"{at}.function.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}",
                            f"{at}.function.name")
        if name in names:
            raise ToolError(f"{at}.function.name {name!r} names an earlier tool too; names must differ",
                            f"{at}.function.name")
        names.add(name)
        if not isinstance(function.get("description", ""), str):
            raise ToolError(f"{at}.function.description must be a string", f"{at}.function.description")
        parameters = function.get("parameters", {})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ToolError(f"{at}.function.parameters must be a JSON schema of type 'object' (the arguments are an "
                            f"object), got {parameters!r:.120}", f"{at}.function.parameters")
        if not isinstance(function.get("strict", False), (bool, type(None))):
            raise ToolError(f"{at}.function.strict must be true or false, got {function['strict']!r}",
                            f"{at}.function.strict")
        tools.append({"type": "function", "function": dict(function)})
    return tuple(tools)


def check_tool_choice(value: object, tools: tuple[dict, ...]) -> ToolChoice:
    """Check `tool_choice` against the checked `tools` (none: only an absent tool_choice, as OpenAI says). Absent
    with tools: "auto". A strict tool under "auto" is refused: strict needs constrained decoding, which a call
    gets only where it is forced."""
    if not tools:
        if value is not None:
            raise ToolError("tool_choice is only allowed when tools are given", "tool_choice")
        return ToolChoice()
    value = "auto" if value is None else value
    if value in ("auto", "none", "required"):
        choice = ToolChoice(value)
    elif isinstance(value, dict) and value.get("type") == "function" and set(value) == {"type", "function"} \
            and isinstance(value["function"], dict) and set(value["function"]) == {"name"}:
        name = value["function"]["name"]
        names = [t["function"]["name"] for t in tools]
        if name not in names:
            raise ToolError(f"tool_choice names the function {name!r}, which tools does not hold; tools: {names}",
                            "tool_choice.function.name")
        choice = ToolChoice("function", name)
    else:
        raise ToolError("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                        f"{{'name': ...}}}}, got {value!r:.120}", "tool_choice")
    if choice.mode == "auto":
        strict = next((i for i, t in enumerate(tools) if t["function"].get("strict")), None)
        if strict is not None:
            raise ToolError(f"tools[{strict}].function.strict is true with tool_choice 'auto': the engine holds a "
                            "call to its schema by constrained decoding, which it applies only where a call is "
                            "forced; send tool_choice 'required' (or the function by name), or strict false",
                            f"tools[{strict}].function.strict")
    return choice


def call_grammar(fmt: ToolFormat, tools: tuple[dict, ...], choice: ToolChoice) -> Grammar:
    """The grammar a forced call is decoded under: one call written as `fmt` writes it (tagged:
    `<tool_call>\n{"name": "f", "arguments": ...}\n</tool_call>`; json: `{"name": "f", "parameters": ...}`;
    mistral: `[TOOL_CALLS][{"name": "f", "arguments": ...}]`) with the chosen function's name ("required": any of
    the tools') and arguments valid under that function's parameters schema. The name and keys are literal text:
    the model chooses only the arguments. One call, whatever parallel_tool_calls says: under a grammar that let
    more follow, SmolLM2-135M (greedy) began a second call after its first and ran into max_tokens (docs/api.md,
    "Tools"). SchemaError (param `tools[i].function.parameters...`) for a schema keyword the grammar cannot hold
    to."""
    return run_slices(call_grammar_slices(fmt, tools, choice))


def call_grammar_slices(fmt: ToolFormat, tools: tuple[dict, ...], choice: ToolChoice) -> Slices[Grammar]:
    """call_grammar in slices (slices.py): each parameters schema compiles in slices."""
    calls = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        if choice.mode != "required" and function["name"] != choice.name:
            continue
        head = f'{{"name": {json.dumps(function["name"])}, "{fmt.arguments_key}": '
        arguments = yield from Grammar.json_schema_slices(function.get("parameters", {"type": "object"}),
                                                          f"tools[{i}].function.parameters")
        calls.append(Grammar.literal(head) + arguments + Grammar.literal("}"))
    call = calls[0] if len(calls) == 1 else Grammar.any_of(calls)
    if fmt.kind == "tagged":
        return Grammar.literal(f"{CALL_OPEN}\n") + call + Grammar.literal(f"\n{CALL_CLOSE}")
    if fmt.kind == "mistral":
        return Grammar.literal(f"{MISTRAL_CALLS}[") + call + Grammar.literal("]")
    return call
