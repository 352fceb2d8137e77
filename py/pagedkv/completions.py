"""OpenAI Chat Completions and legacy Completions as plain data: a request body checked field by field (ApiError
names the field and carries the HTTP status an OpenAI server answers with), stop strings matched across streamed
pieces (text that may begin one is held back until decided), and the `chat.completion` / `chat.completion.chunk`
objects, or for a legacy request (`/v1/completions`: a `prompt` continued as it is, no chat template) the
`text_completion` ones.

Nothing here runs a model: api.Engine feeds it (docs/api.md). Pure Python, so the page's worker and CPython
share it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .chat import MessageError, validate_messages_slices
from .extension import parse_extension
from .grammar import Grammar, SchemaError, compile_response_format_slices
from .sampling import LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS, MAX_LOGPROBS, PENALTY_RANGE
from .slices import Slices, run_slices
from .tools import ToolChoice, ToolError, check_tool_choice, check_tools

__all__ = ["ApiError", "CompletionRequest", "StopStrings", "parse_request", "parse_request_slices", "completion",
           "chunk", "tool_call_deltas", "usage"]

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_N = 16
# Known OpenAI fields this engine does not implement: refused by name (400), never ignored.
UNSUPPORTED = ("functions", "function_call", "audio", "prediction", "reasoning_effort", "web_search_options")
# Why, where the name alone does not say it.
UNSUPPORTED_WHY = {
    "functions": "OpenAI's deprecated form of tools; send tools",
    "function_call": "OpenAI's deprecated form of tool_choice; send tool_choice",
    "reasoning_effort": "it budgets a reasoning model's thinking, and no model here thinks under a budget",
    "audio": "the models here read and write text only",
}
IGNORED = ("user",)  # an end-user id for the provider's abuse tracking: nothing to do in a tab
# Sampling controls both endpoints take (top_k and min_p are vLLM's extensions); logprobs differs between them.
SAMPLING = ("presence_penalty", "frequency_penalty", "logit_bias", "top_k", "min_p", "logprobs")
SUPPORTED = ("model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
             "top_p", "seed", "stop", "n", "pagedkv", "top_logprobs", "response_format", "tools", "tool_choice",
             "parallel_tool_calls", "metadata", "store", "service_tier", "modalities") + SAMPLING
MAX_METADATA = 16  # OpenAI's limits: pairs, key and value characters
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
# The legacy endpoint's own: echo, suffix and best_of pass only with their do-nothing values (_legacy_fields).
LEGACY_SUPPORTED = ("model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed",
                    "stop", "n", "echo", "suffix", "best_of") + SAMPLING
LEGACY_MAX_LOGPROBS = 5  # a legacy body's logprobs: OpenAI's limit
LEGACY_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for a legacy completion; a chat runs up to the context
# A field of the other endpoint: refused with where it belongs, as a caller who posted to the wrong route needs.
OTHER_ENDPOINT = {
    "prompt": "prompt is a legacy Completions field (/v1/completions, engine.completions); a chat request has "
              "messages",
    "messages": "messages is a Chat Completions field (/v1/chat/completions, engine.chat.completions); a legacy "
                "completion has a prompt",
    "max_completion_tokens": "max_completion_tokens is a Chat Completions field; a legacy completion has max_tokens",
    "pagedkv": "pagedkv (sessions) continues a chat; a legacy completion has no session",
    "response_format": "response_format (structured output) is a Chat Completions field (/v1/chat/completions); "
                       "OpenAI's legacy completions take none",
    "tools": "tools is a Chat Completions field (/v1/chat/completions); a legacy completion calls no tools",
    "tool_choice": "tool_choice is a Chat Completions field (/v1/chat/completions); a legacy completion calls no "
                   "tools",
}


class ApiError(Exception):
    """A request the engine refuses: `status` (400 malformed, 404 unknown model, 413 never fits, 503 closed),
    the OpenAI error object's `message`, `param` (the field) and `type`."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error",
                             503: "service_unavailable"}.get(status, "server_error")

    def body(self) -> dict:
        """The OpenAI error JSON."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass(frozen=True)
class CompletionRequest:
    """A checked request body: a chat's messages, or a legacy completion's prompt (text, or token ids as given)."""

    model: str
    messages: list[dict[str, str]]  # empty for a legacy completion
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage and no choices
    max_tokens: int | None = None  # None: up to the context
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    options: dict = field(default_factory=dict)  # the `pagedkv` extension object
    prompt: str | tuple[int, ...] | None = None  # a legacy completion's; None for a chat
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids ascending (not checked against a vocab)
    top_k: int = 0  # 0: off (the body's -1 too)
    min_p: float = 0.0
    logprobs: int | None = None  # None: no log-probs; N: each token's and its N best alternatives'
    grammar: Grammar | None = None  # response_format's (json_object, json_schema); None: free text
    tools: tuple[dict, ...] = ()  # OpenAI's function tools, checked (tools.check_tools)
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True  # False: a reply's first call only

    @property
    def shown_tools(self) -> tuple[dict, ...]:
        """The tools the model is told of: none under tool_choice "none" (it answers in text)."""
        return self.tools if self.tool_choice.mode != "none" else ()

    @property
    def legacy(self) -> bool:
        """A legacy Completions request (/v1/completions): its prompt is continued with no chat template."""
        return self.prompt is not None

    @property
    def input_field(self) -> str:
        """The field that holds what the model reads: an error about its length names it."""
        return "prompt" if self.legacy else "messages"


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    # an int is finite however large (10**400: float() of it overflows, so it is compared as it is)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float)
                                                                          and not math.isfinite(value)):
        raise ApiError(400, f"{name} must be a number, got {value!r:.40}", name)
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low:g} and {high:g}, got {value!r:.40}", name)
    return float(value)


def _integer(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {value!r}", name)
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ApiError(400, f"{name} must be {bound}, got {value}", name)
    return value


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """A body's logit_bias: {token id (a JSON key, so a string of digits): bias}; ids ascending."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ApiError(400, f"logit_bias must be an object mapping token ids to biases, got {value!r:.80}",
                       "logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise ApiError(400, f"logit_bias holds at most {MAX_LOGIT_BIAS} token ids, got {len(value)}", "logit_bias")
    low, high = LOGIT_BIAS_RANGE
    pairs = {}
    for key, bias in value.items():
        token = key if type(key) is int else int(key) if isinstance(key, str) and key.isascii() and key.isdecimal() else None
        if token is None or token < 0:
            raise ApiError(400, f"logit_bias keys must be token ids (non-negative integers), got {key!r}",
                           "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not low <= bias <= high:
            raise ApiError(400, f"logit_bias values must be numbers between {low:g} and {high:g}, got {bias!r} for "
                                f"token {token}", "logit_bias")
        if token in pairs:
            raise ApiError(400, f"logit_bias names token {token} twice", "logit_bias")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


def _logprobs(body: dict, legacy: bool) -> int | None:
    """How many alternatives each token's log-prob lists, or None for none: a chat's logprobs (true / false) and
    top_logprobs (0..20, only with logprobs: true), a legacy body's logprobs (0..5)."""
    if legacy:
        return _integer(body, "logprobs", 0, LEGACY_MAX_LOGPROBS)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise ApiError(400, f"logprobs must be true or false, got {wanted!r}", "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise ApiError(400, "top_logprobs is only allowed with logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _top_k(body: dict) -> int:
    """A body's top_k: a positive integer keeps that many ids; 0 or -1 (vLLM's) keep all."""
    top_k = _integer(body, "top_k", -1)
    return 0 if top_k is None or top_k == -1 else top_k


def _prompt(body: dict) -> str | tuple[int, ...]:
    """A legacy body's prompt: a string or token ids, or a list holding one of either (OpenAI's batch of one)."""
    value = body.get("prompt")
    if value is None:
        raise ApiError(400, "prompt is required: the text to continue, or its token ids", "prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, (str, list)) for v in value):
        raise ApiError(400, f"prompt holds {len(value)} prompts; this engine answers one a request (send each "
                            "its own request: they batch in the engine all the same)", "prompt")
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise ApiError(400, f"prompt must be a string or a non-empty list of token ids, got {shown}", "prompt")


def _legacy_fields(body: dict) -> None:
    """echo, suffix and best_of: accepted with the values that change nothing, else refused by name."""
    echo, suffix, best_of = body.get("echo"), body.get("suffix"), body.get("best_of")
    if echo is not None and echo is not False:
        raise ApiError(400, f"echo is not supported by this engine (only false), got {echo!r}", "echo")
    if suffix is not None and suffix != "":
        raise ApiError(400, "suffix is not supported by this engine (inserting text needs a fill-in-the-middle "
                            "model); send the text before it as the prompt", "suffix")
    if best_of is not None and (type(best_of) is not int or best_of != 1):
        raise ApiError(400, f"best_of is not supported by this engine (only 1; n gives several choices), got "
                            f"{best_of!r}", "best_of")


def _neutral_fields(body: dict) -> None:
    """Fields that mean something at OpenAI and nothing in a tab: accepted at the values that ask for nothing
    (metadata tags a stored completion: checked as OpenAI does, then dropped), refused otherwise with why."""
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA or not all(
                isinstance(k, str) and len(k) <= MAX_METADATA_KEY and isinstance(v, str)
                and len(v) <= MAX_METADATA_VALUE for k, v in metadata.items()):
            raise ApiError(400, f"metadata must be an object of at most {MAX_METADATA} string values (keys up to "
                                f"{MAX_METADATA_KEY} characters, values up to {MAX_METADATA_VALUE}), got "
                                f"{metadata!r:.80}", "metadata")
    store = body.get("store")
    if store is not None and store is not False:
        raise ApiError(400, f"store must be false here, got {store!r}: it keeps completions on OpenAI's servers for "
                            "evals and distillation, and the engine keeps nothing past a request (pagedkv.session "
                            "continues a chat)", "store")
    tier = body.get("service_tier")
    if tier is not None and tier not in ("auto", "default"):
        raise ApiError(400, f"service_tier must be 'auto' or 'default' here, got {tier!r}: a tab has one tier, "
                            "its own", "service_tier")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise ApiError(400, f"modalities must be ['text'] here, got {modalities!r:.80}: the models here write text "
                            "only", "modalities")


def parse_request(body: object, models: list[str], *, legacy: bool = False) -> CompletionRequest:
    """Check an OpenAI Chat Completions body, or with `legacy` a legacy Completions one; ApiError names the first
    offending field. `models`: the ids served (an unknown one is a 404)."""
    return run_slices(parse_request_slices(body, models, legacy=legacy))


def parse_request_slices(body: object, models: list[str], *, legacy: bool = False) -> Slices[CompletionRequest]:
    """parse_request in slices (slices.py): checking the messages and compiling response_format's schema pause."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    supported = LEGACY_SUPPORTED if legacy else SUPPORTED
    for name in body:
        if name in UNSUPPORTED:
            why = f": {UNSUPPORTED_WHY[name]}" if name in UNSUPPORTED_WHY else ""
            raise ApiError(400, f"{name} is not supported by this engine{why}", name)
        if name in OTHER_ENDPOINT and name not in supported:
            raise ApiError(400, OTHER_ENDPOINT[name], name)
        if name not in supported and name not in IGNORED:
            raise ApiError(400, f"unknown field {name!r}", name)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required: the id of a loaded model", "model")
    if model not in models:
        raise ApiError(404, f"the model {model!r} does not exist here; loaded: {', '.join(models) or 'none'}", "model")
    prompt, messages, tools, choice = None, [], (), ToolChoice()
    if legacy:
        prompt = _prompt(body)
        _legacy_fields(body)
    else:
        try:
            messages = yield from validate_messages_slices(body.get("messages"))
            tools = check_tools(body["tools"]) if body.get("tools") is not None else ()
            choice = check_tool_choice(body.get("tool_choice"), tools)
        except (MessageError, ToolError) as exc:
            raise ApiError(400, str(exc), exc.param) from None
        _neutral_fields(body)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(400, f"parallel_tool_calls must be true or false, got {parallel!r}", "parallel_tool_calls")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise ApiError(400, f"stream_options may hold only include_usage, got {options!r}", "stream_options")
    if options and not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    older = _integer(body, "max_tokens", 1)
    if max_tokens is not None and older is not None and max_tokens != older:
        raise ApiError(400, "max_tokens and max_completion_tokens differ; give one", "max_tokens")
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else stop if stop is not None else ()
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"stop must be a non-empty string or a list of them, got {stop!r}", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"stop holds at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
    extension = parse_extension(body.get("pagedkv"))
    grammar = None
    if body.get("response_format") is not None:
        try:
            grammar = yield from compile_response_format_slices(body["response_format"])
        except SchemaError as exc:
            raise ApiError(400, f"{exc.param}: {exc.message}", "response_format") from None
    return CompletionRequest(model=model, messages=messages, prompt=prompt, stream=stream, grammar=grammar,
                             include_usage=bool(options.get("include_usage", False)),
                             max_tokens=max_tokens if max_tokens is not None else older,
                             temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                             top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
                             seed=_integer(body, "seed", 0), stop=tuple(stops), n=_integer(body, "n", 1, MAX_N) or 1,
                             options=extension,
                             presence_penalty=_number(body, "presence_penalty", 0.0, *PENALTY_RANGE),
                             frequency_penalty=_number(body, "frequency_penalty", 0.0, *PENALTY_RANGE),
                             logit_bias=_logit_bias(body), top_k=_top_k(body),
                             min_p=_number(body, "min_p", 0.0, 0.0, 1.0), logprobs=_logprobs(body, legacy),
                             tools=tools, tool_choice=choice, parallel_tool_calls=parallel)


class StopStrings:
    """Stop strings over a stream of text pieces. `push(piece)` returns (text safe to show, stopped): a tail that
    may be the start of a stop string is held back until the next piece decides it; at a stop string the text
    before it is returned and `stopped` is True (the stop string itself never shows). `flush()` gives what is
    held back when the reply ends otherwise."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(stops)
        self._held = ""
        self.stopped = False

    def push(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        text = self._held + piece
        if not self.stops:
            self._held = ""
            return text, False
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held, self.stopped = "", True
            return text[:cut], True
        keep = 0  # the longest tail of `text` that is a proper prefix of a stop string
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), keep, -1):
                if text.endswith(stop[:size]):
                    keep = size
                    break
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion(cid: str, model: str, created: int, choices: list[dict], use: dict, *, legacy: bool = False) -> dict:
    """A `chat.completion` object, or with `legacy` a `text_completion`; `choices`: {"index", "text",
    "finish_reason", "logprobs" (optional: logprobs.py's shape, or None)} each, and a chat's "tool_calls" where
    the reply called (its content then null when the reply is only calls)."""
    if legacy:
        shaped = [{"text": c["text"], "index": c["index"], "logprobs": c.get("logprobs"),
                   "finish_reason": c["finish_reason"]} for c in choices]
    else:
        shaped = [{"index": c["index"], "message": _message(c), "logprobs": c.get("logprobs"),
                   "finish_reason": c["finish_reason"]} for c in choices]
    return {"id": cid, "object": "text_completion" if legacy else "chat.completion", "created": created,
            "model": model, "choices": shaped, "usage": use, "system_fingerprint": None}


def _message(choice: dict) -> dict:
    if not choice.get("tool_calls"):
        return {"role": "assistant", "content": choice["text"]}
    return {"role": "assistant", "content": choice["text"] or None, "tool_calls": choice["tool_calls"]}


def tool_call_deltas(index: int, call_id: str, name: str, arguments: str) -> list[dict]:
    """A call's `delta.tool_calls` entries as OpenAI streams them: the first names it (id, type, name, empty
    arguments), the next carries the arguments' text."""
    return [{"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}},
            {"index": index, "function": {"arguments": arguments}}]


def chunk(cid: str, model: str, created: int, index: int | None = None, *, role: bool = False, text: str | None = None,
          tool_call: dict | None = None, finish_reason: str | None = None, use: dict | None = None,
          legacy: bool = False, logprobs: dict | None = None) -> dict:
    """A `chat.completion.chunk`: one choice's delta (its role first, then text or a `tool_call` delta entry,
    then its finish_reason), or with `use` and no index the usage chunk that ends a stream whose stream_options
    ask for it. With `legacy` a streamed `text_completion`: the choice's `text` is the new piece (a legacy stream
    has no role chunk). `logprobs`: those of the tokens of this piece (logprobs.py's shape)."""
    choices = []
    if index is not None and legacy:
        choices = [{"text": text or "", "index": index, "logprobs": logprobs, "finish_reason": finish_reason}]
    elif index is not None:
        delta = ({"role": "assistant", "content": ""} if role else {}) | ({"content": text} if text else {}) \
            | ({"tool_calls": [tool_call]} if tool_call else {})
        choices = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]
    out = {"id": cid, "object": "text_completion" if legacy else "chat.completion.chunk", "created": created,
           "model": model, "choices": choices, "system_fingerprint": None}
    if use is not None:
        out["usage"] = use
    return out


def now() -> int:
    return int(time.time())
