"""The bounds of one request body, checked before any heavy work (rendering, tokenizing): a body past them is a
413 naming the limit. Rendering and tokenizing are linear in a body's size, so these bound each request's cost;
a conversation with more messages or text than this holds more than any model's context takes anyway (the
longest context served here, 32,768 tokens, is ~130,000 characters of text)."""
from __future__ import annotations

from .completions import ApiError

MAX_MESSAGES = 4096  # messages in one chat body
MAX_BODY_CHARS = 4 << 20  # characters of text in one body (its messages' contents, a legacy prompt)
MAX_BODY_BYTES = 8 << 20  # bytes of a JSON body as sent (engine.fetch; web/pagedkv.js checks the same)
MAX_PROMPT_IDS = 1 << 20  # token ids of a legacy prompt given as ids


def check_body_size(body) -> None:
    """ApiError 413 naming the limit when `body` (a parsed request, checked or not) holds more messages or
    text than one request may. Cost: one pass over its messages, no copies."""
    if not isinstance(body, dict):
        return  # parse_request names what is wrong with it
    messages = body.get("messages")
    if isinstance(messages, list):
        if len(messages) > MAX_MESSAGES:
            raise ApiError(413, f"the body holds {len(messages):,} messages; one request takes at most "
                                f"{MAX_MESSAGES:,}", "messages")
        chars = sum(_text_chars(m.get("content")) for m in messages if isinstance(m, dict))
        _check_chars(chars, "messages")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        _check_chars(len(prompt), "prompt")
    elif isinstance(prompt, list) and len(prompt) > MAX_PROMPT_IDS:
        raise ApiError(413, f"the prompt holds {len(prompt):,} token ids; one request takes at most "
                            f"{MAX_PROMPT_IDS:,}", "prompt")


def _text_chars(content) -> int:
    """Characters of a message's content: a string, or a list of parts whose text counts."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def _check_chars(chars: int, field: str) -> None:
    if chars > MAX_BODY_CHARS:
        raise ApiError(413, f"the body holds {chars:,} characters of text; one request takes at most "
                            f"{MAX_BODY_CHARS:,}", field)
