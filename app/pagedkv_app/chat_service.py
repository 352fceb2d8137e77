"""Conversations in the tab: UI messages in, engine requests out, streamed tokens and memory snapshots back.

No `js` here: the service gets a `post(type, **payload)` callable, so it runs
(and is tested) under CPython with the CPU backend exactly as in the worker.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field, replace

from pagedkv.chat import ChatTemplate, Conversation
from pagedkv.engine import LLMEngine
from pagedkv.sampling import SamplingParams

from .dashboard import TokenRate, memory_snapshot
from .remote import FallbackSettings, RemoteReply
from .remote_replies import RemoteReplies

STATS_INTERVAL_S = 0.5


@dataclass
class Chat:
    """One conversation: its token history, messages for the UI, and the request generating now."""

    chat_id: str
    title: str
    conversation: Conversation
    request_id: str | None = None
    request: object = None  # the engine's Request while generating
    before_reply: tuple | None = None  # history just before the last reply (for Regenerate)
    partial_ids: list[int] = field(default_factory=list)
    partial_text: list[str] = field(default_factory=list)
    alternatives: "Alternatives | None" = None  # other replies sampled for the last user message
    remote: RemoteReply | None = None  # set while the fallback server is answering instead of the engine


@dataclass
class Alternatives:
    """n replies to the last user message sampled in parallel (one request, its samples forking the prompt's
    blocks); the current reply stays until the user keeps one of them."""

    request_id: str
    ids: list[list[int]]  # generated ids per sample index
    done: list[bool]
    contents: list[str] | None = None  # the reply text of each, once all finished


def sampling_from(settings: dict, stop_ids: tuple[int, ...]) -> SamplingParams:
    """UI settings (strings or numbers) -> validated SamplingParams; ValueError names the bad field."""
    try:
        temperature = float(settings.get("temperature", 0.7))
        top_p = float(settings.get("top_p", 0.95))
        max_tokens = int(settings.get("max_tokens", 256))
        seed = settings.get("seed")
        seed = None if seed in (None, "") else int(seed)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad generation setting: {exc}") from None
    return SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
                          stop_token_ids=stop_ids)


class ChatService:
    """Owns the chats and drives the engine loop; every UI message goes through `handle`; replies from the
    fallback server go through the RemoteReplies it holds."""

    def __init__(self, engine: LLMEngine, template: ChatTemplate, post, *, model_name: str,
                 ledger_snapshot=None, open_stream=None, webgpu: bool = True) -> None:
        """`open_stream` is the HTTP transport for the fallback server (bridge.open_stream in the tab);
        `webgpu` False means the engine runs on the slow CPU fallback, so "auto" fallback answers remotely."""
        self.engine = engine
        self.template = template
        self.post = post
        self.model_name = model_name
        self.ledger_snapshot = ledger_snapshot
        self.chats: dict[str, Chat] = {}
        self._ids = itertools.count(1)
        self._loop_task: asyncio.Task | None = None
        self._last_stats = 0.0
        self._rate = TokenRate()
        self.stop_ids = tuple(sorted(engine.default_stop_ids))
        self.lost: str | None = None  # why the GPU device went away, until the engine is rebuilt
        self._disk_task: asyncio.Future | None = None  # the last deletion of a chat's block files
        self.remote = RemoteReplies(open_stream, post, webgpu=webgpu, context_length=engine.context_length,
                                    saved=self.post_saved, ended=self._end_turn)
        # The page's messages to the chat service (docs/architecture.md, "The page <-> worker protocol").
        self.messages = {
            "new-chat": lambda msg: self.new_chat(msg.get("title") or None),
            "send": lambda msg: self.send(msg["chat"], msg["text"], msg.get("settings") or {}),
            "regenerate": lambda msg: self.regenerate(msg["chat"], msg.get("settings") or {}),
            "alternatives": lambda msg: self.alternatives(msg["chat"], msg.get("settings") or {},
                                                          int(msg.get("n", 3))),
            "keep-alternative": lambda msg: self.keep_alternative(msg["chat"], int(msg["index"])),
            "stop": lambda msg: self.stop(msg["chat"]),
            "delete-chat": lambda msg: self.delete(msg["chat"]),
            "rename-chat": lambda msg: self.rename(msg["chat"], msg["title"]),
            "restore": lambda msg: self.restore(msg.get("chats") or [], reserved=msg.get("reserved") or ()),
        }

    # ---------------------------------------------------------------- UI messages

    def handle(self, msg: dict) -> None:
        """Dispatch one message from the UI thread through `messages`; errors go back as `chat-error`, never
        swallowed."""
        kind = msg.get("type")
        try:
            if kind not in self.messages:
                raise ValueError(f"unknown message type {kind!r}")
            self.messages[kind](msg)
        except (KeyError, ValueError) as exc:
            self.post("chat-error", chat=msg.get("chat"), message=f"{type(exc).__name__}: {exc}")

    def new_chat(self, title: str | None = None) -> Chat:
        n = next(self._ids)
        chat = Chat(f"chat-{n}", title or f"Chat {n}", Conversation(self.engine.tokenizer, self.template))
        self.chats[chat.chat_id] = chat
        self.post_chats()
        self.post_saved(chat)
        return chat

    def rename(self, chat_id: str, title) -> None:
        """Give the chat a new title (at most 80 characters)."""
        chat = self.chats[chat_id]
        chat.title = str(title)[:80]
        self.post_chats()
        self.post_saved(chat)

    def restore(self, saved: list[dict], reserved=()) -> None:
        """Recreate chats saved by the page (IndexedDB) with their exact token history.

        A reply that was cut off by a reload comes back as `partial_ids` (with `streaming` set): it is kept
        as the assistant's message, and the page marks it interrupted. With nothing
        saved, a fresh chat is opened. `reserved` are ids of saved chats not restored here (records the
        page could not read, chats of another model): no new chat takes them, so none is written over.
        """
        for record in saved:
            chat_id = str(record["id"])
            conv = Conversation(self.engine.tokenizer, self.template)
            conv.rollback(tuple(record["checkpoint"]))
            partial = [int(t) for t in record.get("partial_ids") or []]
            # A reply cut off before its first token is an empty reply, as the page shows it (and as Stop
            # leaves it): without it the next message would follow the user's with no reply between.
            cut = partial or (record.get("streaming") and conv.messages and conv.messages[-1]["role"] == "user")
            if cut:
                conv.add_generated(partial)
            self.chats[chat_id] = Chat(chat_id, str(record.get("title") or chat_id), conv)
            self.engine.refer_history(chat_id, conv.ids)
            if record.get("before_reply"):
                self.chats[chat_id].before_reply = tuple(record["before_reply"])
            if cut:
                self.post_saved(self.chats[chat_id])
        highest = 0
        for chat_id in [*self.chats, *map(str, reserved)]:
            number = chat_id.rsplit("-", 1)[-1]
            highest = max(highest, int(number) if number.isdigit() else 0)
        self._ids = itertools.count(highest + 1)
        if not self.chats:
            self.new_chat()
        else:
            self.post_chats()
        self.post_stats(force=True)

    def send(self, chat_id: str, text: str, settings: dict) -> str:
        """Add the user's message and queue the reply; the conversation in view gets priority."""
        chat = self._idle_chat(chat_id)
        if not text.strip():
            raise ValueError("the message is empty")
        system = (settings.get("system") or "").strip()

        def add_turn(conv: Conversation) -> None:
            if system and not conv.messages:
                conv.add_message("system", system)
            conv.add_user(text)

        return self._start_reply(chat, settings, add_turn, regenerate=False)

    def regenerate(self, chat_id: str, settings: dict) -> str:
        """Answer the last user message again: the reply is dropped and sampled anew from the same prompt,
        whose blocks are shared with the previous reply's through the prefix cache."""
        chat = self._idle_chat(chat_id)
        if chat.before_reply is None:
            raise ValueError("there is no reply to regenerate in this chat")
        before = chat.before_reply
        return self._start_reply(chat, settings, lambda conv: conv.rollback(before), regenerate=True)

    def alternatives(self, chat_id: str, settings: dict, n: int = 3) -> str:
        """Sample `n` other replies to the last user message at once: one request of n parallel samples,
        the prompt prefilled once (or served by the prefix cache) and its blocks shared by the samples."""
        chat = self._idle_chat(chat_id)
        if chat.before_reply is None:
            raise ValueError("there is no reply to show alternatives for in this chat")
        if not 2 <= n <= 8:
            raise ValueError(f"ask for 2 to 8 alternatives, not {n}")
        params = replace(sampling_from(settings, self.stop_ids), n=n)
        if params.seed is not None:  # the reply drew with seed s: s + 1 .. s + n, so none repeats it
            params = replace(params, seed=params.seed + 1)
        conv = chat.conversation
        now = conv.checkpoint()
        conv.rollback(chat.before_reply)
        try:
            prompt = conv.prompt_ids()
        finally:
            conv.rollback(now)
        rid = self.engine.add_request(prompt, params, priority=int(settings.get("priority", 0)),
                                      session=chat.chat_id)
        chat.request_id, chat.request = rid, self.engine.request(rid)
        chat.alternatives = Alternatives(rid, [[] for _ in range(n)], [False] * n)
        self.post("alt-start", chat=chat.chat_id, request=rid, n=n)
        self._ensure_loop()
        return rid

    def keep_alternative(self, chat_id: str, index: int) -> str:
        """Make alternative `index` the reply: the token history now ends with exactly its ids."""
        chat = self._idle_chat(chat_id)
        alt = chat.alternatives
        if alt is None or alt.contents is None:
            raise ValueError("there are no finished alternatives to keep in this chat")
        if not 0 <= index < len(alt.ids):
            raise ValueError(f"alternative {index} does not exist (there are {len(alt.ids)})")
        chat.conversation.rollback(chat.before_reply)
        content = chat.conversation.add_generated(alt.ids[index])
        chat.alternatives = None
        self.post("alt-kept", chat=chat.chat_id, index=index, content=content,
                  history_tokens=chat.conversation.num_tokens)
        self.post_saved(chat)
        return content

    def _on_alternative(self, chat: Chat, out) -> None:
        alt = chat.alternatives
        alt.ids[out.index].extend(out.token_ids)
        if out.token_ids:
            self.post("alt-token", chat=chat.chat_id, index=out.index, text=out.text)
        if out.finished:
            alt.done[out.index] = True
            if all(alt.done):
                self._end_alternatives(chat, "done")

    def _end_alternatives(self, chat: Chat, reason: str) -> None:
        conv, alt = chat.conversation, chat.alternatives
        now = conv.checkpoint()
        alt.contents = []
        for ids in alt.ids:  # each as the history would hold it (stop token dropped, lossy UTF-8)
            conv.rollback(chat.before_reply)
            alt.contents.append(conv.add_generated(ids))
        conv.rollback(now)
        chat.request_id = chat.request = None
        self.post("alt-end", chat=chat.chat_id, reason=reason, alternatives=alt.contents,
                  tokens=[len(ids) for ids in alt.ids])

    def _idle_chat(self, chat_id: str) -> Chat:
        chat = self.chats[chat_id]
        if chat.request_id is not None:
            raise ValueError("this chat is still answering; stop it or wait")
        return chat

    def _start_reply(self, chat: Chat, settings: dict, change_history, *, regenerate: bool) -> str:
        params = sampling_from(settings, self.stop_ids)
        fallback = FallbackSettings.from_settings(settings)
        self.remote.check(fallback)
        conv = chat.conversation
        before = conv.checkpoint()
        prompt: list[int] = []
        try:
            change_history(conv)
            prompt = conv.prompt_ids()
            remote_reason = self.remote.reason_for(fallback)
            if remote_reason is None:
                rid = self.engine.add_request(prompt, params, priority=int(settings.get("priority", 0)),
                                              session=chat.chat_id)
        except ValueError as exc:
            if fallback is not None and self.remote.cannot_fit(exc, prompt):
                return self.remote.start(chat, fallback, params, str(exc), regenerate)
            conv.rollback(before)  # a refused turn leaves the history exactly as it was
            if self.remote.cannot_fit(exc, prompt):
                raise ValueError(f"{exc}. Or set a fallback server in the generation settings to answer "
                                 f"requests this tab cannot hold") from None
            raise
        if remote_reason is not None:
            return self.remote.start(chat, fallback, params, remote_reason, regenerate)
        chat.request_id = rid
        chat.request = self.engine.request(rid)
        chat.alternatives = None  # a new reply supersedes alternatives not kept
        chat.before_reply = conv.checkpoint()
        chat.partial_ids, chat.partial_text = [], []
        cached = self.engine.cached_prefix_tokens(prompt[:-1])
        self.post("turn-start", chat=chat.chat_id, request=rid, prompt_tokens=len(prompt), cached_tokens=cached,
                  regenerate=regenerate, engine={"kind": "local", "backend": self.engine.backend.name})
        self.post_saved(chat)  # with the user's message, so a reload mid-reply keeps both
        self._ensure_loop()
        return rid

    def stop(self, chat_id: str) -> None:
        """Abort the chat's reply; what was generated is kept as the assistant's message."""
        chat = self.chats[chat_id]
        if chat.request_id is None:
            return
        if chat.remote is not None:
            self.remote.stop(chat)
            return
        if not self.engine.is_unfinished(chat.request_id):
            return  # finished in a step that has not returned yet (it awaits the disk): its output ends the turn
        self.engine.abort(chat.request_id)
        if chat.alternatives is not None:
            self._end_alternatives(chat, "abort")
        else:
            self._finish(chat, "abort")

    def delete(self, chat_id: str) -> None:
        """Remove a chat: its reply stops and its cached history (with that reply) leaves the prefix cache, except the
        leading blocks another chat's history starts with (a shared system prompt stays cached)."""
        chat = self.chats.pop(chat_id)
        try:
            if chat.remote is not None:
                self.remote.cancel(chat)
            elif chat.request_id is not None and self.engine.is_unfinished(chat.request_id):
                self.engine.abort(chat.request_id)  # else it finished in a step not returned yet: nothing runs
            histories = [chat.conversation.ids]
            if chat.request is not None:  # the reply it was answering (each sample's), cached as it went
                histories += [list(r.seq.token_ids) for r in chat.request.samples or [chat.request]]
            # Longest first: eviction finds blocks along their prefix chain, which a shorter history would cut.
            for ids in sorted(histories, key=len, reverse=True):
                shared = max((_common_prefix(ids, c.conversation.ids) for c in self.chats.values()), default=0)
                self.engine.forget_history(ids, keep_tokens=shared)
            if self.engine.disk_enabled:  # its block files go too, but for those another chat's history holds
                self._disk_task = asyncio.ensure_future(self._forget_on_disk(chat_id))
        finally:  # the chat is gone from the service whatever failed: the page lists it gone
            self.post_chats()
            self.post_stats(force=True)

    # ---------------------------------------------------------------- the loop

    def _ensure_loop(self) -> None:
        if self.lost is None and (self._loop_task is None or self._loop_task.done()):
            self._loop_task = asyncio.ensure_future(self.run())

    def device_lost(self, reason: str) -> None:
        """The GPU device is gone: stop stepping (a step in flight may never resolve); chats, their token
        history and the partial replies stay. New messages queue until `resume_on` brings a new backend."""
        self.lost = reason
        if self._loop_task is not None and not self._loop_task.done():
            self._loop_task.cancel()

    def resume_on(self, backend, ledger_snapshot=None) -> list[str]:
        """Carry on with a rebuilt backend: replies in progress re-prefill prompt + what they had generated
        and keep streaming into the same message. Returns the request ids that resumed."""
        requeued = self.engine.rebuild(backend)
        self.ledger_snapshot = ledger_snapshot
        self.lost = None
        for chat in list(self.chats.values()):
            if chat.request is not None and chat.request_id not in requeued:
                self._finish(chat, chat.request.finish_reason or "error")  # too long for the new pool
        self._ensure_loop()
        self.post_stats(force=True)
        return requeued

    async def run(self) -> None:
        """Step the engine while anything is unfinished, streaming tokens; yields to the UI between steps."""
        try:
            while self.engine.has_unfinished and self.lost is None:
                outputs = await self.engine.step()
                self.on_outputs(outputs)
                await asyncio.sleep(0)
        except Exception as exc:
            if self.lost is not None:
                return  # the step died with the device; resume_on re-runs it on the new one
            self.post("engine-error", message=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.post_stats(force=True)

    def on_outputs(self, outputs) -> None:
        by_request = {c.request_id: c for c in self.chats.values() if c.request_id is not None}
        now = time.perf_counter()
        for out in outputs:
            chat = by_request.get(out.request_id)
            if chat is not None and chat.alternatives is not None:
                self._rate.add(now, len(out.token_ids))
                self._on_alternative(chat, out)
                continue
            if chat is None or not out.token_ids:
                continue
            self._rate.add(now, len(out.token_ids))
            chat.partial_ids.extend(out.token_ids)
            if out.text or out.token_ids:
                chat.partial_text.append(out.text)
                self.post("token", chat=chat.chat_id, text=out.text, ids=out.token_ids)
            if out.finished:
                self._finish(chat, out.finish_reason)
        self.post_stats()

    def _finish(self, chat: Chat, reason: str | None) -> None:
        content = chat.conversation.add_generated(chat.partial_ids)
        self._end_turn(chat, reason=reason, content=content, tokens=len(chat.partial_ids),
                       cached_tokens=chat.request.num_cached_prompt_tokens)

    def _end_turn(self, chat: Chat, **turn) -> None:
        """Tell the page the reply is over (its content is in the history now) and make the chat idle."""
        self.post("turn-end", chat=chat.chat_id, history_tokens=chat.conversation.num_tokens, **turn)
        chat.request_id = chat.request = chat.remote = None
        chat.partial_ids, chat.partial_text = [], []
        self.post_saved(chat)

    # ---------------------------------------------------------------- dashboard

    def post_saved(self, chat: Chat) -> None:
        """What the page stores to bring the chat back after a reload: title + exact token history."""
        messages, ids, text = chat.conversation.checkpoint()
        self.engine.refer_history(chat.chat_id, chat.conversation.ids)
        before = chat.before_reply
        self.post("chat-saved", chat=chat.chat_id, title=chat.title,
                  checkpoint=[list(messages), list(ids), text],
                  before_reply=None if before is None else [list(before[0]), list(before[1]), before[2]])

    async def _forget_on_disk(self, chat_id: str) -> None:
        try:
            await self.engine.forget_owner(chat_id)
        except Exception as exc:
            self.post("chat-error", chat=chat_id, message=f"deleting the chat's KV on disk failed: "
                                                            f"{type(exc).__name__}: {exc}")
            raise
        self.post_stats(force=True)

    def post_chats(self) -> None:
        self.post("chats", chats=[{"id": c.chat_id, "title": c.title, "busy": c.request_id is not None,
                                   "tokens": c.conversation.num_tokens} for c in self.chats.values()])

    def memory_snapshot(self) -> dict:
        """Block map + metrics for the dashboard (dashboard.py)."""
        return memory_snapshot(self.engine, self.model_name, self._rate.per_second(time.perf_counter()),
                               self.ledger_snapshot() if self.ledger_snapshot else None)

    def post_stats(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_stats < STATS_INTERVAL_S:
            return
        self._last_stats = now
        self.post("memory", **self.memory_snapshot())


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
