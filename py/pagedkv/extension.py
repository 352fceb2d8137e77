"""The `pagedkv` object of a Chat Completions body: what this engine adds to OpenAI's request (docs/api.md,
"The pagedkv extension"), checked field by field. completions.parse_request calls `parse_extension`; the
sessions (sessions.py) and the completion service (api.py) read the dict it returns.

    "pagedkv": {"session": "chat-7",        # a conversation continued on its exact token ids
                "regenerate": true,         # the session's last reply answered again (with n >= 2: alternatives)
                "priority": 1,              # the scheduler's rank: higher runs first
                "token_ids": true,          # each chunk's choice carries the ids it streams
                "up_to_context": true,      # max_tokens is a bound: a longer prompt gets the room left
                "save": true,               # the stream's last chunk carries the session's record
                "restore": {...}}           # a saved record: reopen the session after a reload
"""
from __future__ import annotations

from . import completions  # its ApiError; completions imports this module in turn

FIELDS = ("session", "regenerate", "priority", "token_ids", "up_to_context", "save", "restore")
RESTORE_FIELDS = ("checkpoint", "before_reply", "partial_ids", "streaming")
NEEDS_SESSION = ("regenerate", "save", "restore")


def parse_extension(extension: object) -> dict:
    """The checked `pagedkv` object (absent: {}); ApiError 400 naming the field that is wrong."""
    if extension is None:
        return {}
    if not isinstance(extension, dict) or set(extension) - set(FIELDS):
        raise _refused(f"pagedkv may hold only {', '.join(FIELDS)}, got {extension!r}", "pagedkv")
    out = dict(extension)
    if "session" in out and not (isinstance(out["session"], str) and out["session"]):
        raise _refused("pagedkv.session must be a non-empty string", "pagedkv.session")
    for name in ("regenerate", "token_ids", "up_to_context", "save"):
        if name in out and not isinstance(out[name], bool):
            raise _refused(f"pagedkv.{name} must be true or false, got {out[name]!r}", f"pagedkv.{name}")
    if "priority" in out and (isinstance(out["priority"], bool) or not isinstance(out["priority"], int)):
        raise _refused(f"pagedkv.priority must be an integer, got {out['priority']!r}", "pagedkv.priority")
    for name in NEEDS_SESSION:
        if out.get(name) and "session" not in out:
            raise _refused(f"pagedkv.{name} needs a pagedkv.session", f"pagedkv.{name}")
    if "restore" in out:
        out["restore"] = _record(out["restore"])
    return out


def _refused(message: str, param: str) -> Exception:
    return completions.ApiError(400, message, param)


def _record(record: object) -> dict:
    """A session's saved record (what `save` handed out, or the chat page's): its `checkpoint` [messages, token
    ids, text], `before_reply` (the same, before the last reply, or null) and a reply cut off by a reload."""
    field = "pagedkv.restore"
    if not isinstance(record, dict) or set(record) - set(RESTORE_FIELDS) or "checkpoint" not in record:
        raise _refused(f"{field} must be a saved record {{checkpoint, before_reply}}, got {record!r}", field)
    for name in ("checkpoint", "before_reply"):
        value = record.get(name)
        if value is None and name == "before_reply":
            continue
        if not (isinstance(value, (list, tuple)) and len(value) == 3 and isinstance(value[0], (list, tuple))
                and isinstance(value[1], (list, tuple)) and isinstance(value[2], str)
                and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value[1])):
            raise _refused(f"{field}.{name} must be [messages, token ids, text] as `save` gave it",
                           f"{field}.{name}")
    ids = record.get("partial_ids") or []
    if not (isinstance(ids, (list, tuple)) and all(isinstance(t, int) and t >= 0 for t in ids)):
        raise _refused(f"{field}.partial_ids must be a list of token ids", f"{field}.partial_ids")
    return dict(record)
