"""The engine's side of the chats: UI messages in, engine requests out, streamed tokens and memory snapshots back.

A chat is owned by the page (its IndexedDB record: title, messages, exact token ids, settings); the page
makes, names, lists and deletes chats. The worker keeps only what the engine needs to go on with one: a
`Session` per chat id (its token history for exact continuation, the reply it is generating, its KV
references on disk), opened from the record the page sends and posted back (`session-saved`) as it
changes, so the record stays the one truth.

No `js` here: the service gets a `post(type, **payload)` callable, so it runs
(and is tested) under CPython with the CPU backend exactly as in the worker.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from pagedkv.chat import ChatTemplate, Conversation
from pagedkv.engine import LLMEngine
from pagedkv.sampling import SamplingParams

from .api_requests import ApiRequests
from .chat_alternatives import AlternativeReplies, Alternatives
from .dashboard import TokenRate, memory_snapshot
from .remote import FallbackSettings, RemoteReply
from .remote_replies import RemoteReplies

STATS_INTERVAL_S = 0.5


@dataclass
class Session:
    """The engine's state for one chat (keyed by the chat's id): its token history, the request generating
    now and what it has generated so far. Title, UI messages and settings stay with the page's record."""

    session_id: str
    conversation: Conversation
    model: str | None = None  # the engine's model it talks to (None: the first, the page's own)
    request_id: str | None = None
    request: object = None  # the engine's Request while generating
    before_reply: tuple | None = None  # history just before the last reply (for Regenerate)
    partial_ids: list[int] = field(default_factory=list)
    partial_text: list[str] = field(default_factory=list)
    alternatives: Alternatives | None = None  # other replies sampled for the last user message
    remote: RemoteReply | None = None  # set while the fallback server is answering instead of the engine


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
    """Holds the chats' sessions and drives the engine loop; every UI message goes through `handle`; replies
    from the fallback server go through the RemoteReplies it holds."""

    def __init__(self, engine: LLMEngine, template: ChatTemplate, post, *, model_name: str,
                 ledger_snapshot=None, open_stream=None, webgpu: bool = True, loader=None) -> None:
        """`open_stream` is the HTTP transport for the fallback server (bridge.open_stream in the tab);
        `webgpu` False means the engine runs on the slow CPU fallback, so "auto" fallback answers remotely;
        `loader` loads a model into a several-model engine at run time (api_requests.ApiRequests)."""
        self.engine = engine
        self.template = template
        self.post = post
        self.model_name = model_name
        self.ledger_snapshot = ledger_snapshot
        self.sessions: dict[str, Session] = {}
        self._loop_task: asyncio.Task | None = None
        self._last_stats = 0.0
        self._rate = TokenRate()
        self.stop_ids = tuple(sorted(engine.default_stop_ids))
        self.lost: str | None = None  # why the GPU device went away, until the engine is rebuilt
        self._disk_task: asyncio.Future | None = None  # the last deletion of a chat's block files
        self._flush_task: asyncio.Future | None = None  # the last flush of the disk tier (flush-disk)
        # OpenAI (Chat) Completions for pages that import pagedkv.js (api-request): its requests ride this loop.
        self.api = ApiRequests(engine, template, model_name, self._ensure_loop, post, loader)
        self.alts = AlternativeReplies(engine, post, self._ensure_loop)
        self.remote = RemoteReplies(open_stream, post, webgpu=webgpu, context_length=engine.context_length,
                                    saved=self.post_saved, ended=self._end_turn)
        # The page's messages to the chat service (docs/architecture.md, "The page <-> worker protocol").
        self.messages = {
            "open-sessions": lambda msg: self.open_sessions(msg.get("sessions") or []),
            "send": lambda msg: self.send(msg["chat"], msg["text"], msg.get("settings") or {}, msg.get("model")),
            "regenerate": lambda msg: self.regenerate(msg["chat"], msg.get("settings") or {}),
            "alternatives": lambda msg: self.alternatives(msg["chat"], msg.get("settings") or {},
                                                          int(msg.get("n", 3))),
            "keep-alternative": lambda msg: self.keep_alternative(msg["chat"], int(msg["index"])),
            "stop": lambda msg: self.stop(msg["chat"]),
            "forget-session": lambda msg: self.forget_session(msg["chat"]),
            "flush-disk": lambda msg: self.flush_disk(),
            "api-request": lambda msg: self.api.request(str(msg["id"]), msg.get("body"), msg.get("legacy") is True),
            "api-abort": lambda msg: self.api.abort(str(msg["id"])),
            "api-stats": lambda msg: self.post("api-stats", id=str(msg["id"]), stats=self.api.stats()),
            "api-load": lambda msg: self.api.load(str(msg["id"]), str(msg.get("model"))),
            "api-unload": lambda msg: self.unload(str(msg["id"]), str(msg.get("model"))),
            "api-forget": lambda msg: self.post("api-forgot", id=str(msg["id"]),
                                                forgotten=self.api.services.forget(str(msg.get("session")))),
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

    def open_session(self, session_id: str, record: dict | None = None) -> Session:
        """The session of chat `session_id`, opened from the page's `record` of it (its `checkpoint`: the exact
        token history; `before_reply`; a reply cut off by a reload as `partial_ids` with `streaming` set) or,
        without one, empty (a new chat). An idle session is replaced by the record given; a busy one is not.

        A cut-off reply is kept as the assistant's message (the page marks it interrupted) and posted back.
        """
        session = self.sessions.get(session_id)
        if session is not None and (record is None or session.request_id is not None):
            return session
        model = self._lane_of((record or {}).get("model"))
        conv = Conversation(self.engine.lane(model).tokenizer, self.api.template_of(model))
        checkpoint = (record or {}).get("checkpoint")
        if checkpoint:
            conv.rollback(tuple(checkpoint))
        partial = [int(t) for t in (record or {}).get("partial_ids") or []]
        # A reply cut off before its first token is an empty reply, as the page shows it (and as Stop
        # leaves it): without it the next message would follow the user's with no reply between.
        cut = partial or ((record or {}).get("streaming") and conv.messages and conv.messages[-1]["role"] == "user")
        reply = conv.add_generated(partial) if cut else None
        session = self.sessions[session_id] = Session(session_id, conv, model)
        if (record or {}).get("before_reply"):
            session.before_reply = tuple(record["before_reply"])
        self.engine.refer_history(session_id, conv.ids, model)
        if cut:  # the reply's text as the history holds it (a character cut mid-way is U+FFFD, not nothing)
            self.post_saved(session, reply=reply)
        return session

    def open_sessions(self, records: list[dict]) -> None:
        """Open the sessions of the chats the page holds for this model (as it loads), so their disk-tier
        blocks are referenced and each goes on from its exact token history."""
        for record in records:
            self.open_session(str(record["id"]), record)
        self.post_stats(force=True)

    def _lane_of(self, model: str | None) -> str | None:
        """The engine's name for a chat's model: None for the page's own (the first); ValueError when that
        model is not loaded."""
        if model in (None, "", self.model_name):
            return None
        if model not in self.engine.models:
            raise ValueError(f"the chat's model {model} is not loaded here (loaded: {', '.join(self.engine.models)})")
        return model

    def _stop_ids(self, chat: Session) -> tuple[int, ...]:
        return self.stop_ids if chat.model is None else tuple(sorted(self.engine.lane(chat.model).default_stop_ids))

    def send(self, chat_id: str, text: str, settings: dict, model: str | None = None) -> str:
        """Add the user's message and queue the reply; the conversation in view gets priority. model: a new
        chat's model (when the engine holds several; default the page's)."""
        chat = self._idle_chat(chat_id, model)
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
        """Sample `n` other replies to the last user message at once (chat_alternatives.AlternativeReplies)."""
        chat = self._idle_chat(chat_id)
        params = sampling_from(settings, self._stop_ids(chat))
        return self.alts.start(chat, params, n, priority=int(settings.get("priority", 0)))

    def keep_alternative(self, chat_id: str, index: int) -> str:
        """Make alternative `index` the reply: the token history now ends with exactly its ids."""
        content = self.alts.keep(self._idle_chat(chat_id), index)
        self.post_saved(self.sessions[chat_id])
        return content

    def _idle_chat(self, chat_id: str, model: str | None = None) -> Session:
        """The chat's session, opened empty (of `model`) if the page has not sent its record (a new chat); it
        must be idle."""
        chat = self.open_session(str(chat_id), None if model is None or str(chat_id) in self.sessions
                                 else {"model": model})
        if chat.request_id is not None:
            raise ValueError("this chat is still answering; stop it or wait")
        return chat

    def _start_reply(self, chat: Session, settings: dict, change_history, *, regenerate: bool) -> str:
        params = sampling_from(settings, self._stop_ids(chat))
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
                                              session=chat.session_id, model=chat.model)
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
        cached = self.engine.cached_prefix_tokens(prompt[:-1], chat.model)
        self.post("turn-start", chat=chat.session_id, request=rid, prompt_tokens=len(prompt), cached_tokens=cached,
                  regenerate=regenerate, engine={"kind": "local", "backend": self.engine.backend.name})
        self.post_saved(chat)  # with the user's message, so a reload mid-reply keeps both
        self._ensure_loop()
        return rid

    def stop(self, chat_id: str) -> None:
        """Abort the chat's reply; what was generated is kept as the assistant's message."""
        chat = self.sessions.get(chat_id)
        if chat is None:
            return
        if chat.request_id is None:
            return
        if chat.remote is not None:
            self.remote.stop(chat)
            return
        if not self.engine.is_unfinished(chat.request_id):
            return  # finished in a step that has not returned yet (it awaits the disk): its output ends the turn
        self.engine.abort(chat.request_id)
        if chat.alternatives is not None:
            self.alts.end(chat, "abort")
        else:
            self._finish(chat, "abort")

    def unload(self, request_id: str, model: str) -> None:
        """pagedkv.js unloads a model (api-unload): its API streams end, and so do the replies its chats were
        generating (kept as far as they got, as Stop keeps them); a later message to such a chat is refused."""
        if not self.api.unload(request_id, model):
            return
        for chat in self.sessions.values():
            if chat.model == model and chat.request_id is not None and chat.remote is None:
                if chat.alternatives is not None:
                    self.alts.end(chat, "abort")
                else:
                    self._finish(chat, "abort")
        self.post_stats(force=True)

    def forget_session(self, chat_id: str) -> None:
        """The page deleted a chat: its session goes, its reply stops and its cached history (with that reply)
        leaves the prefix cache, except the leading blocks another chat's history starts with (a shared system
        prompt stays cached)."""
        chat = self.sessions.pop(chat_id, None)
        if chat is None:  # never used in this worker (or forgotten already): only its files on disk may remain
            if self.engine.disk_enabled:
                self._disk_task = asyncio.ensure_future(self._forget_on_disk(chat_id))
            return
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
                shared = max((_common_prefix(ids, c.conversation.ids) for c in self.sessions.values()
                              if c.model == chat.model), default=0)
                self.engine.forget_history(ids, keep_tokens=shared, model=chat.model)
            if self.engine.disk_enabled:  # its block files go too, but for those another chat's history holds
                self._disk_task = asyncio.ensure_future(self._forget_on_disk(chat_id))
        finally:  # the session is gone whatever failed
            self.post_stats(force=True)

    def flush_disk(self) -> asyncio.Future | None:
        """The page is hidden or left (`flush-disk`): every full block of the chats' histories and of the
        replies in progress that the disk tier lacks is written now (LLMEngine.flush_disk, after a step in
        flight); answers `disk-flushed` with the blocks written and the time it took. None without a disk
        tier."""
        if not self.engine.disk_enabled:
            return None
        self._flush_task = asyncio.ensure_future(self._flush_disk())
        return self._flush_task

    async def _flush_disk(self) -> int:
        t0 = time.perf_counter()
        try:
            written = await self.engine.flush_disk()
        except Exception as exc:
            self.post("chat-error", chat=None, message=f"writing the KV cache to disk failed: "
                                                       f"{type(exc).__name__}: {exc}")
            raise
        self.post("disk-flushed", written=written, ms=round((time.perf_counter() - t0) * 1e3, 1))
        self.post_stats(force=True)
        return written

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
        for chat in list(self.sessions.values()):
            if chat.request is not None and chat.request_id not in requeued:
                self._finish(chat, chat.request.finish_reason or "error")  # too long for the new pool
        self.api.keep_only(requeued)
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
            self.api.fail(exc)
            self.post("engine-error", message=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.post_stats(force=True)
            asyncio.ensure_future(self._stats_when_written())  # the panel again once the disk's writes land

    async def _stats_when_written(self) -> None:
        await self.engine.settle_disk()
        self.post_stats(force=True)

    def on_outputs(self, outputs) -> None:
        outputs = self.api.deliver(outputs)  # pagedkv.js's requests' outputs go to their streams
        by_request = {c.request_id: c for c in self.sessions.values() if c.request_id is not None}
        now = time.perf_counter()
        for out in outputs:
            chat = by_request.get(out.request_id)
            if chat is not None and chat.alternatives is not None:
                self._rate.add(now, len(out.token_ids))
                self.alts.on_output(chat, out)
                continue
            if chat is None or not out.token_ids:
                continue
            self._rate.add(now, len(out.token_ids))
            chat.partial_ids.extend(out.token_ids)
            if out.text or out.token_ids:
                chat.partial_text.append(out.text)
                self.post("token", chat=chat.session_id, text=out.text, ids=out.token_ids)
            if out.finished:
                self._finish(chat, out.finish_reason)
        self.post_stats()

    def _finish(self, chat: Session, reason: str | None) -> None:
        content = chat.conversation.add_generated(chat.partial_ids)
        self._end_turn(chat, reason=reason, content=content, tokens=len(chat.partial_ids),
                       cached_tokens=chat.request.num_cached_prompt_tokens)

    def _end_turn(self, chat: Session, **turn) -> None:
        """Tell the page the reply is over (its content is in the history now) and make the chat idle."""
        self.post("turn-end", chat=chat.session_id, history_tokens=chat.conversation.num_tokens, **turn)
        chat.request_id = chat.request = chat.remote = None
        chat.partial_ids, chat.partial_text = [], []
        self.post_saved(chat)

    # ---------------------------------------------------------------- dashboard

    def post_saved(self, chat: Session, **extra) -> None:
        """The session's exact token history as it stands now, for the page to store in the chat's record
        (`reply`: the text of a cut-off reply the session was opened with)."""
        messages, ids, text = chat.conversation.checkpoint()
        self.engine.refer_history(chat.session_id, chat.conversation.ids, chat.model)
        before = chat.before_reply
        self.post("session-saved", chat=chat.session_id, checkpoint=[list(messages), list(ids), text],
                  before_reply=None if before is None else [list(before[0]), list(before[1]), before[2]], **extra)

    async def _forget_on_disk(self, chat_id: str) -> None:
        try:
            await self.engine.forget_owner(chat_id)
        except Exception as exc:
            self.post("chat-error", chat=chat_id, message=f"deleting the chat's KV on disk failed: "
                                                            f"{type(exc).__name__}: {exc}")
            raise
        self.post_stats(force=True)

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
