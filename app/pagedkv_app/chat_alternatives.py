"""Other replies to a chat's last user message, sampled at once: Alternatives in the chat page.

One request of n parallel samples (LLMEngine's SampleGroups): the prompt is prefilled once (or served by the
prefix cache) and its blocks are shared by the samples; the current reply stays until the user keeps one of
them. The chat service holds an AlternativeReplies and routes `alternatives` / `keep-alternative` and the
outputs of a chat sampling alternatives to it; it answers `alt-start`, `alt-token`..., `alt-end`, `alt-kept`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pagedkv.engine import LLMEngine
from pagedkv.sampling import SamplingParams


@dataclass
class Alternatives:
    """n replies to the last user message sampled in parallel; the current reply stays until one is kept."""

    request_id: str
    ids: list[list[int]]  # generated ids per sample index
    done: list[bool]
    contents: list[str] | None = None  # the reply text of each, once all finished


class AlternativeReplies:
    """Starts, streams, ends and keeps a chat's alternatives (chat: chat_service.Session)."""

    def __init__(self, engine: LLMEngine, post, kick) -> None:
        self.engine, self.post, self.kick = engine, post, kick

    def start(self, chat, params: SamplingParams, n: int, priority: int = 0) -> str:
        """Sample `n` other replies to the last user message with `params` (the chat's settings)."""
        if chat.before_reply is None:
            raise ValueError("there is no reply to show alternatives for in this chat")
        if not 2 <= n <= 8:
            raise ValueError(f"ask for 2 to 8 alternatives, not {n}")
        params = replace(params, n=n)
        if params.seed is not None:  # the reply drew with seed s: s + 1 .. s + n, so none repeats it
            params = replace(params, seed=params.seed + 1)
        conv = chat.conversation
        now = conv.checkpoint()
        conv.rollback(chat.before_reply)
        try:
            prompt = conv.prompt_ids()
        finally:
            conv.rollback(now)
        rid = self.engine.add_request(prompt, params, priority=priority, session=chat.session_id, model=chat.model)
        chat.request_id, chat.request = rid, self.engine.request(rid)
        chat.alternatives = Alternatives(rid, [[] for _ in range(n)], [False] * n)
        self.post("alt-start", chat=chat.session_id, request=rid, n=n)
        self.kick()
        return rid

    def keep(self, chat, index: int) -> str:
        """Alternative `index` becomes the reply: the token history now ends with exactly its ids."""
        alt = chat.alternatives
        if alt is None or alt.contents is None:
            raise ValueError("there are no finished alternatives to keep in this chat")
        if not 0 <= index < len(alt.ids):
            raise ValueError(f"alternative {index} does not exist (there are {len(alt.ids)})")
        chat.conversation.rollback(chat.before_reply)
        content = chat.conversation.add_generated(alt.ids[index])
        chat.alternatives = None
        self.post("alt-kept", chat=chat.session_id, index=index, content=content,
                  history_tokens=chat.conversation.num_tokens)
        return content

    def on_output(self, chat, out) -> None:
        """One step's output of one sample."""
        alt = chat.alternatives
        alt.ids[out.index].extend(out.token_ids)
        if out.token_ids:
            self.post("alt-token", chat=chat.session_id, index=out.index, text=out.text)
        if out.finished:
            alt.done[out.index] = True
            if all(alt.done):
                self.end(chat, "done")

    def end(self, chat, reason: str) -> None:
        """Every sample finished (or the user stopped them): each one's text as the history would hold it."""
        conv, alt = chat.conversation, chat.alternatives
        now = conv.checkpoint()
        alt.contents = []
        for ids in alt.ids:  # each as the history would hold it (stop token dropped, lossy UTF-8)
            conv.rollback(chat.before_reply)
            alt.contents.append(conv.add_generated(ids))
        conv.rollback(now)
        chat.request_id = chat.request = None
        self.post("alt-end", chat=chat.session_id, reason=reason, alternatives=alt.contents,
                  tokens=[len(ids) for ids in alt.ids])
