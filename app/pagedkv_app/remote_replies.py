"""Replies the fallback server gives instead of the engine: when a reply goes there, and streaming one into its chat.

The chat service holds one RemoteReplies. It asks `reason_for` / `cannot_fit` whether a reply goes to the
server, `start`s it, and `stop`s or `cancel`s it; the remote replies tell the service back only through the
two callables it gave them: `saved(chat)` (the page should store the chat now) and `ended(chat, **turn)` (the
reply is over: post turn-end and make the chat idle).
"""
from __future__ import annotations

import asyncio

from pagedkv.api import ApiError, PromptTooLong
from pagedkv.sampling import SamplingParams

from .remote import FallbackSettings, RemoteError, RemoteReply


class RemoteReplies:
    """The fallback server's replies in the service's chats (a chat's `remote` is set while one streams)."""

    def __init__(self, open_stream, post, sessions, *, webgpu: bool, saved, ended) -> None:
        """`open_stream` is the HTTP transport (bridge.open_stream in the tab, None: no fallback possible);
        `sessions`: the chats' histories' owner (pagedkv.sessions.Sessions), which records the server's replies;
        `webgpu` False means the engine runs on the slow CPU fallback, so "auto" fallback answers remotely."""
        self.open_stream = open_stream
        self.post = post
        self.sessions = sessions
        self.webgpu = webgpu
        self.saved = saved
        self.ended = ended

    def check(self, fallback: FallbackSettings | None) -> None:
        """ValueError when the settings name a fallback server but this app has no transport to reach it."""
        if fallback is not None and self.open_stream is None:
            raise ValueError("this app was started without a network transport for the fallback server")

    def reason_for(self, fallback: FallbackSettings | None) -> str | None:
        """Why this reply goes to the fallback server before the engine is even asked (None: run it here)."""
        if fallback is None:
            return None
        if fallback.mode == "always":
            return "the settings send every reply to the fallback server"
        if not self.webgpu:
            return "this browser has no WebGPU"
        return None

    def cannot_fit(self, exc: ApiError) -> bool:
        """The completions API refused for lack of room (413: the pool; the prompt passes the context), not for
        a bad request."""
        return exc.status == 413 or isinstance(exc, PromptTooLong)

    def start(self, chat, fallback: FallbackSettings, fields: dict, reason: str, regenerate: bool) -> str:
        """Stream the reply to the chat's history (Sessions.turn_elsewhere: its last message is the user's) from
        the server; `fields`: the turn's sampling fields (chat_service.sampling_from). Returns the request id
        the page sees."""
        conv = chat.conversation
        params = SamplingParams(temperature=fields["temperature"], top_p=fields["top_p"],
                                max_tokens=fields["max_tokens"], seed=fields.get("seed"))
        reply = RemoteReply(fallback, conv.messages, params, self.open_stream, conv.tokenizer)
        chat.remote, chat.request_id, chat.request = reply, f"remote-{chat.session_id}-{len(conv.messages)}", None
        chat.partial_ids, chat.partial_text = [], []
        self.post("turn-start", chat=chat.session_id, request=chat.request_id, prompt_tokens=len(conv.prompt_ids()),
                  cached_tokens=0, regenerate=regenerate,
                  engine={"kind": "remote", "model": fallback.model, "origin": fallback.origin, "reason": reason})
        self.saved(chat)
        asyncio.ensure_future(self._run(chat, reply))
        return chat.request_id

    def stop(self, chat) -> None:
        """Stop: the stream ends and what came so far is the assistant's message."""
        chat.remote.abort()
        self._finish(chat, "abort")

    def cancel(self, chat) -> None:
        """The chat is going away: the stream ends and nothing is recorded."""
        chat.remote.abort()
        chat.remote = None

    async def _run(self, chat, reply: RemoteReply) -> None:
        def on_text(text: str, ids: list[int]) -> None:
            # The ids (the tab tokenizer's) go with the token, as the engine's do: the page saves them as the
            # partial reply, so a reload restores it into the history (marked interrupted).
            if chat.remote is reply:
                chat.partial_text.append(text)
                chat.partial_ids.extend(ids)
                self.post("token", chat=chat.session_id, text=text, ids=ids)

        try:
            reason = await reply.run(on_text)
        except RemoteError as exc:
            if chat.remote is reply:
                self._finish(chat, "error")
                self.post("chat-error", chat=chat.session_id, message=str(exc))
            return
        if chat.remote is reply:  # not stopped or deleted meanwhile
            self._finish(chat, reason or "stop")

    def _finish(self, chat, reason: str) -> None:
        """Record the server's text as the assistant's message (the tab's tokenizer encodes it for later turns).

        `tokens` counts the streamed deltas: one per token with llama.cpp's server."""
        content = "".join(chat.partial_text)
        self.sessions.reply_from_elsewhere(chat.session_id, content)
        server = chat.remote.settings
        self.ended(chat, reason=reason, content=content, tokens=len(chat.partial_text), cached_tokens=0,
                   engine={"kind": "remote", "model": server.model, "origin": server.origin})
