"""Replies the fallback server gives instead of the engine: when to send one there, and streaming it into a chat.

A mixin of ChatService (it uses the service's chats, `post`, `engine` and
`_end_turn`), kept apart so the service's file stays about the engine loop.
"""
from __future__ import annotations

import asyncio

from pagedkv.kv.manager import NeverFits
from pagedkv.sampling import SamplingParams

from .remote import FallbackSettings, RemoteError, RemoteReply


class RemoteTurns:
    """The fallback-server half of ChatService."""

    def _remote_reason(self, fallback: FallbackSettings | None) -> str | None:
        """Why this reply goes to the fallback server before the engine is even asked (None: run it here)."""
        if fallback is None:
            return None
        if fallback.mode == "always":
            return "the settings send every reply to the fallback server"
        if not self.webgpu:
            return "this browser has no WebGPU"
        return None

    def _cannot_fit(self, exc: ValueError, prompt: list[int]) -> bool:
        """The engine refused for lack of room (pool or context), not for a bad request."""
        return isinstance(exc, NeverFits) or len(prompt) >= self.engine.context_length

    def _start_remote(self, chat, fallback: FallbackSettings, params: SamplingParams, reason: str,
                      regenerate: bool) -> str:
        conv = chat.conversation
        reply = RemoteReply(fallback, conv.messages, params, self.open_stream, conv.tokenizer)
        chat.remote, chat.request_id, chat.request = reply, f"remote-{chat.chat_id}-{len(conv.messages)}", None
        chat.before_reply = conv.checkpoint()
        chat.partial_ids, chat.partial_text = [], []
        self.post("turn-start", chat=chat.chat_id, request=chat.request_id, prompt_tokens=len(conv.prompt_ids()),
                  cached_tokens=0, regenerate=regenerate,
                  engine={"kind": "remote", "model": fallback.model, "origin": fallback.origin, "reason": reason})
        self.post_saved(chat)
        asyncio.ensure_future(self._run_remote(chat, reply))
        return chat.request_id

    async def _run_remote(self, chat, reply: RemoteReply) -> None:
        def on_text(text: str, ids: list[int]) -> None:
            # The ids (the tab tokenizer's) go with the token, as the engine's do: the page saves them as the
            # partial reply, so a reload restores it into the history (marked interrupted).
            if chat.remote is reply:
                chat.partial_text.append(text)
                chat.partial_ids.extend(ids)
                self.post("token", chat=chat.chat_id, text=text, ids=ids)

        try:
            reason = await reply.run(on_text)
        except RemoteError as exc:
            if chat.remote is reply:
                self._finish_remote(chat, "error")
                self.post("chat-error", chat=chat.chat_id, message=str(exc))
            return
        if chat.remote is reply:  # not stopped or deleted meanwhile
            self._finish_remote(chat, reason or "stop")

    def _finish_remote(self, chat, reason: str) -> None:
        """Record the server's text as the assistant's message (the tab's tokenizer encodes it for later turns).

        `tokens` counts the streamed deltas: one per token with llama.cpp's server."""
        content = "".join(chat.partial_text)
        chat.conversation.add_message("assistant", content)
        server = chat.remote.settings
        self._end_turn(chat, reason=reason, content=content, tokens=len(chat.partial_text), cached_tokens=0,
                       engine={"kind": "remote", "model": server.model, "origin": server.origin})
