"""Conversations the engine continues on their exact token ids: `pagedkv: {session}` (docs/api.md), which is also
how the chat page's chats run (app/pagedkv_app/chat_service.py is their adapter).

A Session holds one conversation of one model: its token history (chat.Conversation), the history before its
last reply (to regenerate it or sample alternatives to it), the request answering it now and the last
alternatives' ids. `Sessions` is their one owner, shared by the completion services of an engine's models: it
opens a session (empty, or from the record the page or an app saved), names each history to the disk tier so
its block files stay and a flush writes them, records a reply as it ends, and forgets a session: its cached
blocks leave the prefix cache and the disk except those another session's history begins with (a shared system
prompt stays cached).
"""
from __future__ import annotations

from dataclasses import dataclass

from .chat import ChatTemplate, Conversation
from .engine import LLMEngine


@dataclass
class Session:
    """One conversation (session_id: the chat id or the app's `pagedkv.session`) of the engine's model `model`
    (None: its first)."""

    session_id: str
    model: str | None
    conversation: Conversation
    before_reply: tuple | None = None  # the history just before the last reply (regenerate, alternatives)
    request_id: str | None = None  # the request answering it now
    request: object = None  # that request's engine Request (sample 0 with n > 1), kept after it finishes
    alternatives: list[list[int]] | None = None  # the ids of the last alternatives sampled, until one is kept

    def record(self) -> dict:
        """What an app or the page stores to reopen this session after a reload (`pagedkv.restore`)."""
        messages, ids, text = self.conversation.checkpoint()
        before = self.before_reply
        return {"checkpoint": [list(messages), list(ids), text],
                "before_reply": None if before is None else [list(before[0]), list(before[1]), before[2]]}

    def prompt_before_reply(self) -> list[int]:
        """The prompt its last reply answered (history before it + the assistant opener)."""
        scratch = Conversation(self.conversation.tokenizer, self.conversation.template)
        scratch.rollback(self.before_reply)
        return scratch.prompt_ids()

    def reply_text(self, ids) -> str:
        """The text `ids` would have as the reply to the last user message, as the history would hold it (stop
        token dropped, a character cut mid-way as U+FFFD)."""
        scratch = Conversation(self.conversation.tokenizer, self.conversation.template)
        scratch.rollback(self.before_reply)
        return scratch.add_generated(ids)


class Sessions:
    """Every session of an engine, by id (module docstring)."""

    def __init__(self, llm: LLMEngine) -> None:
        self.llm = llm
        self._by_id: dict[str, Session] = {}

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._by_id

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def open(self, session_id: str, model: str | None, template: ChatTemplate, record: dict | None = None) -> Session:
        """A new session of `model` (replacing an idle one of that id), empty or opened from `record` (Session.record,
        or the page's chat record: its `checkpoint`, `before_reply`, and a reply cut off by a reload as
        `partial_ids` with `streaming` set, which becomes the assistant's message). ValueError while the
        session of that id is answering."""
        old = self._by_id.get(session_id)
        if old is not None and old.request_id is not None:
            raise ValueError(f"session {session_id!r} is answering a request; stop it first")
        tokenizer = self.llm.lane(model).tokenizer
        conv = Conversation(tokenizer, template)
        record = record or {}
        if record.get("checkpoint"):
            for token in record["checkpoint"][1]:  # a record from elsewhere (an app's): ids of this vocabulary
                tokenizer.check_id(token)
            conv.rollback(tuple(record["checkpoint"]))
        partial = [int(t) for t in record.get("partial_ids") or []]
        # A reply cut off before its first token is an empty reply, as the page shows it (and as Stop leaves
        # it): without it the next message would follow the user's with no reply between.
        if partial or (record.get("streaming") and conv.messages and conv.messages[-1]["role"] == "user"):
            conv.add_generated(partial)
        session = self._by_id[session_id] = Session(session_id, model, conv)
        if record.get("before_reply"):
            session.before_reply = tuple(record["before_reply"])
        self.refer(session)
        return session

    def refer(self, session: Session) -> None:
        """Name the session's history to the disk tier (its block files stay; flush_disk writes them); nothing
        once its model is unloaded."""
        if session.model is None or session.model in self.llm.models:
            self.llm.refer_history(session.session_id, session.conversation.ids, session.model)

    def started(self, session: Session, conv: Conversation, request_id: str, *, alternatives: bool) -> None:
        """A request now answers `session`: with its prompt's history `conv` (its last message the user's), or
        alternatives to the last reply, which leave the history as it is."""
        if not alternatives:
            session.conversation, session.before_reply = conv, conv.checkpoint()
        session.alternatives = None  # a new reply, or new alternatives, supersede alternatives not kept
        session.request_id, session.request = request_id, self.llm.request(request_id)
        self.refer(session)

    def ended(self, session_id: str, request_id: str, ids: list[list[int]], stop_text: str | None = None,
              *, alternatives: bool, message: dict | None = None) -> Session | None:
        """The request `request_id` of the session ended (finished, stopped, or its stream closed): the reply
        joins the history as the ids generated (`stop_text`: cut at a stop string, as the text the caller saw),
        or the alternatives' ids are kept for `keep`; `message`: a reply with tool calls, joining as that message.
        Nothing when the session was forgotten or answers another
        request meanwhile."""
        session = self._by_id.get(session_id)
        if session is None or session.request_id != request_id:
            return None
        if alternatives:
            session.alternatives = [list(x) for x in ids]
        elif message is not None:
            session.conversation.add_messages([message])
        elif stop_text is not None:
            session.conversation.add_message("assistant", stop_text)
        else:
            session.conversation.add_generated(ids[0])
        session.request_id = None
        self.refer(session)
        return session

    def turn_elsewhere(self, session_id: str, messages: list[dict], *, regenerate: bool) -> Session:
        """A turn another server answers (the chat page's fallback): the history takes the request's new
        messages as a turn here would (with `regenerate`, back to before its last reply first); its reply comes
        with `reply_from_elsewhere`. ValueError (a message the template refuses) leaves it as it was."""
        session = self._by_id[session_id]
        conv = Conversation(session.conversation.tokenizer, session.conversation.template)
        conv.rollback(session.before_reply if regenerate else session.conversation.checkpoint())
        for message in messages[len(conv.messages):]:
            conv.add_message(message["role"], message["content"])
        session.conversation, session.before_reply, session.alternatives = conv, conv.checkpoint(), None
        self.refer(session)
        return session

    def reply_from_elsewhere(self, session_id: str, text: str) -> None:
        """The other server's reply joins the history as its text (this tokenizer encodes it)."""
        session = self._by_id.get(session_id)
        if session is not None:
            session.conversation.add_message("assistant", text)
            self.refer(session)

    def keep(self, session_id: str, index: int) -> str:
        """Alternative `index` becomes the session's last reply: its history now ends with exactly its ids.
        Returns its text; ValueError when there is none such."""
        session = self._by_id.get(session_id)
        alts = session.alternatives if session is not None and session.request_id is None else None
        if alts is None:
            raise ValueError("there are no finished alternatives to keep in this chat")
        if not 0 <= index < len(alts):
            raise ValueError(f"alternative {index} does not exist (there are {len(alts)})")
        session.conversation.rollback(session.before_reply)
        content = session.conversation.add_generated(alts[index])
        session.alternatives = None
        self.refer(session)
        return content

    def forget(self, session_id: str) -> Session | None:
        """Drop a session: its request stops, and its history and the reply in progress (each sample's) leave
        the prefix cache and the CPU tier, but for the leading blocks another session of its model begins
        with. Its block files on disk go with `forget_on_disk`. Returns it (None: there was none)."""
        session = self._by_id.pop(session_id, None)
        if session is None:
            return None
        if session.request_id is not None and self.llm.is_unfinished(session.request_id):
            self.llm.abort(session.request_id)  # else it finished in a step not returned yet: nothing runs
        histories = [session.conversation.ids]
        if session.request is not None:  # the reply it answered last (each sample's), cached as it went
            histories += [list(r.seq.token_ids) for r in session.request.samples or [session.request]]
        others = [s.conversation.ids for s in self._by_id.values() if s.model == session.model]
        others += [list(r.seq.token_ids) for s in self._by_id.values() if s.model == session.model
                   and s.request_id is not None for r in s.request.samples or [s.request]]
        # Longest first: eviction finds blocks along their prefix chain, which a shorter history would cut.
        for ids in sorted(histories, key=len, reverse=True):
            shared = max((_common_prefix(ids, other) for other in others), default=0)
            self.llm.forget_history(ids, keep_tokens=shared, model=session.model)
        return session

    async def forget_on_disk(self, session_id: str) -> int:
        """Delete the block files only the session's history referenced (after `forget`); how many. 0 without
        a disk tier."""
        return await self.llm.forget_owner(session_id)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
