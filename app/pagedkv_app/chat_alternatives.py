"""Other replies to a chat's last user message, sampled at once: Alternatives in the chat page.

One request of n parallel samples through the completions API (`n` with `pagedkv: {session, regenerate}`): the
prompt is prefilled once (or served by the prefix cache) and its blocks are shared by the samples; the session's
reply stays until the user keeps one of them (Sessions.keep). The chat service checks and starts the request and
hands this helper its streamed pieces; it answers `alt-start`, `alt-token`..., `alt-end`, `alt-kept`.
"""
from __future__ import annotations

from dataclasses import dataclass

MIN_ALTERNATIVES, MAX_ALTERNATIVES = 2, 8


@dataclass
class Alternatives:
    """n replies to the last user message sampled in parallel; the current reply stays until one is kept."""

    request_id: str
    ids: list[list[int]]  # generated ids per sample index
    contents: list[str] | None = None  # the reply text of each, once all ended


class AlternativeReplies:
    """Streams, ends and keeps a chat's alternatives (chat: chat_service.Chat) as the page's events."""

    def __init__(self, post) -> None:
        self.post = post

    @staticmethod
    def check(chat, n: int) -> None:
        """ValueError unless the chat has a reply to sample alternatives to and n is 2..8."""
        if chat.before_reply is None:
            raise ValueError("there is no reply to show alternatives for in this chat")
        if not MIN_ALTERNATIVES <= n <= MAX_ALTERNATIVES:
            raise ValueError(f"ask for {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} alternatives, not {n}")

    def started(self, chat, request_id: str, n: int) -> None:
        chat.alternatives = Alternatives(request_id, [[] for _ in range(n)])
        self.post("alt-start", chat=chat.session_id, request=request_id, n=n)

    def on_piece(self, chat, index: int, text: str, ids: list[int]) -> None:
        """One streamed piece of sample `index`."""
        chat.alternatives.ids[index].extend(ids)
        if ids:
            self.post("alt-token", chat=chat.session_id, index=index, text=text)

    def end(self, chat, reason: str) -> None:
        """Every sample ended (or the user stopped them): each one's text as the history would hold it."""
        alt = chat.alternatives
        alt.contents = [chat.session.reply_text(ids) for ids in alt.ids]
        self.post("alt-end", chat=chat.session_id, reason=reason, alternatives=alt.contents,
                  tokens=[len(ids) for ids in alt.ids])

    def kept(self, chat, index: int, content: str) -> None:
        """Alternative `index` became the reply (Sessions.keep)."""
        chat.alternatives = None
        self.post("alt-kept", chat=chat.session_id, index=index, content=content,
                  history_tokens=chat.conversation.num_tokens)
