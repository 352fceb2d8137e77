"""The chat page's adapter to the completions API: UI messages in, Chat Completions requests out, streamed tokens
and memory snapshots back.

A chat is owned by the page (its IndexedDB record: title, messages, exact token ids, settings); the page
makes, names, lists and deletes chats. Each turn is a request to pagedkv.api.CompletionService, the one that
serves pagedkv.js's `engine.fetch`: a Chat Completions body whose `pagedkv` object names the chat as its
session (its exact token history, owned by pagedkv.sessions.Sessions), asks for the streamed token ids, the
reply to regenerate or alternatives to sample. The service runs it on this worker's step loop (`run`); this
adapter reads its chunks and posts `turn-start`, `token`, `turn-end` (or `alt-*`), `session-saved` (the
session's record, so the page's record stays the one truth) and the memory panel's snapshots. A reply the
fallback server gives instead (remote_replies.py) is the one turn not run here.

No `js` here: the service gets a `post(type, **payload)` callable, so it runs
(and is tested) under CPython with the CPU backend exactly as in the worker.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from pagedkv.api import ApiError
from pagedkv.chat import ChatTemplate
from pagedkv.engine import LLMEngine, run_sync
from pagedkv.sessions import Session

from .api_requests import ApiRequests
from .chat_alternatives import AlternativeReplies, Alternatives
from .dashboard import TokenRate, memory_snapshot
from .remote import FallbackSettings, RemoteReply
from .remote_replies import RemoteReplies

STATS_INTERVAL_S = 0.5
# How long a reply's end waits for its blocks to reach the disk tier when the engine is idle after it (the writer
# starts as its last step ends): a reload the moment the page shows the end then restores them. A busy machine (a
# CPU hog beside the browser) made the OPFS writes outlast an immediate reload; the wait is bounded so that a
# stalled store never holds a turn's end.
DISK_SETTLE_S = 1.0


@dataclass
class Chat:
    """What the page's view of one chat needs beyond its session (pagedkv.sessions.Session: its token history,
    owned by the API's Sessions): the reply streaming now and what came of it so far, the alternatives being
    sampled, a fallback server's reply."""

    session: Session
    request_id: str | None = None
    request: object = None  # the engine's Request while generating (the session's)
    partial_ids: list[int] = field(default_factory=list)
    partial_text: list[str] = field(default_factory=list)
    alternatives: Alternatives | None = None  # other replies sampled for the last user message
    remote: RemoteReply | None = None  # set while the fallback server is answering instead of the engine
    reader: asyncio.Future | None = None  # the task reading the reply's chunks
    end_reason: str | None = None  # why the reply ends when the service's stream is cut (no finish_reason)
    # the task checking, rendering and tokenizing a turn too long to prepare at once (ChatService.send), in slices
    # with the engine's steps between them; the chat is busy meanwhile
    preparing: asyncio.Future | None = None

    @property
    def busy(self) -> bool:
        """A reply streams, or a turn is being prepared."""
        return self.request_id is not None or self.preparing is not None

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def model(self) -> str | None:
        """The engine's model it talks to (None: the first, the page's own)."""
        return self.session.model

    @property
    def conversation(self):
        return self.session.conversation

    @property
    def before_reply(self) -> tuple | None:
        """The history just before the last reply (for Regenerate)."""
        return self.session.before_reply


def sampling_from(settings: dict) -> dict:
    """UI settings (strings or numbers) -> the request body's sampling fields; ValueError names the bad field
    (the API checks their ranges)."""
    try:
        fields = {"temperature": float(settings.get("temperature", 0.7)),
                  "top_p": float(settings.get("top_p", 0.95)),
                  "max_tokens": int(settings.get("max_tokens", 256))}
        seed = settings.get("seed")
        if seed not in (None, ""):
            fields["seed"] = int(seed)
        int(settings.get("priority", 0))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad generation setting: {exc}") from None
    return fields


class ChatService:
    """Holds the chats and drives the engine loop; every UI message goes through `handle`, every turn through
    the completions API (`api`); replies from the fallback server go through the RemoteReplies it holds."""

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
        self.sessions: dict[str, Chat] = {}
        self._loop_task: asyncio.Task | None = None
        self._last_stats = 0.0
        self._rate = TokenRate()
        self.lost: str | None = None  # why the GPU device went away, until the engine is rebuilt
        self._disk_task: asyncio.Future | None = None  # the last deletion of a chat's block files
        self._flush_task: asyncio.Future | None = None  # the last flush of the disk tier (flush-disk)
        # OpenAI (Chat) Completions: pagedkv.js's requests (api-request) and the chats' turns, on this loop.
        self.api = ApiRequests(engine, template, model_name, self._ensure_loop, post, loader)
        self.store = self.api.services.sessions  # the sessions' one owner
        self.alts = AlternativeReplies(post)
        self.remote = RemoteReplies(open_stream, post, self.store, webgpu=webgpu, saved=self.post_saved,
                                    ended=self._end_turn)
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
            # One route for a chat's delete and an API session's forget: neither evicts what another shares.
            "api-forget": lambda msg: self.post("api-forgot", id=str(msg["id"]),
                                                forgotten=self.forget_session(str(msg.get("session")))),
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

    def open_session(self, session_id: str, record: dict | None = None) -> Chat:
        """The chat `session_id`, its session opened from the page's `record` of it (Sessions.open: its
        `checkpoint`, `before_reply`, a reply cut off by a reload) or, without one, empty (a new chat). An idle
        chat is reopened from the record given; a busy one is not. A cut-off reply is kept as the assistant's
        message (the page marks it interrupted) and posted back."""
        chat = self.sessions.get(session_id)
        if chat is not None and (record is None or chat.busy):
            return chat
        held = self.store.get(session_id)
        if held is not None and not record:  # a session pagedkv.js opened (`pagedkv.session`): go on with it
            chat = self.sessions[session_id] = Chat(held)
            return chat
        record = record or {}
        model = self._lane_of(record.get("model"))
        session = self.store.open(session_id, model, self.api.template_of(model), record)
        chat = self.sessions[session_id] = Chat(session)
        if len(session.conversation.messages) > len((record.get("checkpoint") or [()])[0]):
            # the reply's text as the history holds it (a character cut mid-way is U+FFFD, not nothing)
            self.post_saved(chat, reply=session.conversation.messages[-1]["content"])
        return chat

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

    def send(self, chat_id: str, text: str, settings: dict, model: str | None = None) -> str | None:
        """Add the user's message and queue the reply; the conversation in view gets priority. model: a new
        chat's model (when the engine holds several; default the page's).

        A message longer than one slice of its tokenizer (Tokenizer.slice_chars: 32k characters, 4k for
        SentencePiece) is checked, rendered and tokenized in slices with the engine's steps between them, so
        that a long paste never holds the other chats' streams (issue 49): the chat is busy meanwhile
        (`Chat.preparing`; a second Send is refused, Stop cancels it), and `turn-start` or `chat-error` follows
        once it is done; returns None then. A shorter one costs at most a slice and is prepared at once: its
        request id, or ValueError for a refusal, before the page's next message."""
        chat = self._idle_chat(chat_id, model)
        if not text.strip():
            raise ValueError("the message is empty")
        system = (settings.get("system") or "").strip()
        messages = chat.conversation.messages
        if system and not messages:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": text})
        sliced = len(text) + len(system) > self.api.service_of(chat.model).tokenizer.slice_chars
        return self._start_reply(chat, settings, messages, regenerate=False, sliced=sliced)

    def regenerate(self, chat_id: str, settings: dict) -> str:
        """Answer the last user message again: the reply is dropped and sampled anew from the same prompt,
        whose blocks are shared with the previous reply's through the prefix cache."""
        chat = self._idle_chat(chat_id)
        if chat.before_reply is None:
            raise ValueError("there is no reply to regenerate in this chat")
        return self._start_reply(chat, settings, [dict(m) for m in chat.before_reply[0]], regenerate=True)

    def alternatives(self, chat_id: str, settings: dict, n: int = 3) -> str:
        """Sample `n` other replies to the last user message at once: one request with n samples
        (chat_alternatives.py); the reply stays until one is kept."""
        chat = self._idle_chat(chat_id)
        self.alts.check(chat, n)
        fields = sampling_from(settings)
        if "seed" in fields:  # the reply drew with seed s: s + 1 .. s + n, so none repeats it
            fields["seed"] += 1
        body = self.request_body(chat, settings, [dict(m) for m in chat.before_reply[0]], fields, regenerate=True)
        try:
            rid = self._request(chat, dict(body, n=n))
        except ApiError as exc:
            raise ValueError(exc.message) from None
        self.alts.started(chat, rid, n)
        return rid

    def keep_alternative(self, chat_id: str, index: int) -> str:
        """Make alternative `index` the reply: the token history now ends with exactly its ids."""
        chat = self._idle_chat(chat_id)
        content = self.store.keep(chat_id, index)
        self.alts.kept(chat, index, content)
        self.post_saved(chat)
        return content

    def _idle_chat(self, chat_id: str, model: str | None = None) -> Chat:
        """The chat, opened empty (of `model`) if the page has not sent its record (a new chat); it must be
        idle."""
        chat = self.open_session(str(chat_id), None if model is None or str(chat_id) in self.sessions
                                 else {"model": model})
        if chat.busy:
            raise ValueError("this chat is still answering; stop it or wait")
        return chat

    def request_body(self, chat: Chat, settings: dict, messages: list[dict], fields: dict, *,
                     regenerate: bool) -> dict:
        """The Chat Completions body of a turn: the chat's messages and settings, its session continued on its
        exact ids, the reply's token ids streamed (the page saves a reply in progress as ids), max_tokens a
        bound (a long chat gets the room its context has left) and the chat in view first. fields: the
        sampling fields (sampling_from)."""
        extension = {"session": chat.session_id, "token_ids": True, "up_to_context": True,
                     "priority": int(settings.get("priority", 0))}
        if regenerate:
            extension["regenerate"] = True
        return {"model": self.api.service_of(chat.model).model_id, "messages": messages, "stream": True,
                **fields, "pagedkv": extension}

    def _request(self, chat: Chat, body: dict) -> str:
        """Start a turn's request on the completions API and read its chunks in a task; returns its id.
        ApiError when the API refuses it (the session is as it was)."""
        service = self.api.service_of(chat.model)
        chunks = run_sync(service.stream(body, at_once=True))  # checks and queues it before its first await
        return self._reading(chat, chunks)

    def _reading(self, chat: Chat, chunks) -> str:
        """The chat's request is queued: read its chunks in a task; its id."""
        chat.request_id, chat.request = chat.session.request_id, chat.session.request
        chat.partial_ids, chat.partial_text, chat.end_reason = [], [], None
        chat.reader = asyncio.ensure_future(self._read(chat, chat.request_id, chunks))
        return chat.request_id

    def _start_reply(self, chat: Chat, settings: dict, messages: list[dict], *, regenerate: bool,
                     sliced: bool = False) -> str | None:
        """Queue the turn's reply (or hand it to the fallback server); its request id. With `sliced`, its
        request is prepared in a task (`_prepare_reply`) and None is returned."""
        fields = sampling_from(settings)
        fallback = FallbackSettings.from_settings(settings)
        self.remote.check(fallback)
        body = self.request_body(chat, settings, messages, fields, regenerate=regenerate)
        remote_reason = self.remote.reason_for(fallback)
        if remote_reason is None and sliced:
            chat.preparing = asyncio.ensure_future(
                self._prepare_reply(chat, body, messages, fields, fallback, regenerate))
            return None
        if remote_reason is None:
            try:
                rid = self._request(chat, body)
            except ApiError as exc:
                remote_reason = self._refused(exc, fallback)
            else:
                self._turn_started(chat, regenerate)
                return rid
        return self._remote_reply(chat, messages, fields, fallback, remote_reason, regenerate)

    def _refused(self, exc: ApiError, fallback: FallbackSettings | None) -> str:
        """The API refused a turn: why the fallback server answers it instead, or ValueError with the reason
        (the session is as it was)."""
        if not self.remote.cannot_fit(exc):
            raise ValueError(exc.message) from None
        if fallback is None:
            raise ValueError(f"{exc.message}. Or set a fallback server in the generation settings to "
                             f"answer requests this tab cannot hold") from None
        return exc.message

    async def _prepare_reply(self, chat: Chat, body: dict, messages: list[dict], fields: dict,
                             fallback: FallbackSettings | None, regenerate: bool) -> None:
        """A long turn's request, checked, rendered and tokenized in slices (CompletionService.stream without
        at_once) while the engine steps the other chats; then `turn-start`, or `chat-error` with the reason of
        a refusal (the page puts the text back in the box). Cancelled by Stop or Delete: nothing was queued."""
        try:
            try:
                chunks = await self.api.service_of(chat.model).stream(body)
            except ApiError as exc:
                remote_reason = self._refused(exc, fallback)
            else:
                chat.preparing = None
                self._reading(chat, chunks)
                self._turn_started(chat, regenerate)
                return
            chat.preparing = None
            self._remote_reply(chat, messages, fields, fallback, remote_reason, regenerate)
        except Exception as exc:  # as handle reports a refusal at once; anything else too, so the page never waits
            self.post("chat-error", chat=chat.session_id, message=f"{type(exc).__name__}: {exc}")
        finally:
            chat.preparing = None

    def _turn_started(self, chat: Chat, regenerate: bool) -> None:
        chat.alternatives = None  # a new reply supersedes alternatives not kept
        num_prompt = chat.request.num_prompt_tokens
        cached = self.engine.cached_prefix_tokens(chat.request.seq.token_ids[:num_prompt - 1], chat.model)
        self.post("turn-start", chat=chat.session_id, request=chat.request_id, prompt_tokens=num_prompt,
                  cached_tokens=cached, regenerate=regenerate,
                  engine={"kind": "local", "backend": self.engine.backend.name})
        self.post_saved(chat)  # with the user's message, so a reload mid-reply keeps both

    def _remote_reply(self, chat: Chat, messages: list[dict], fields: dict, fallback: FallbackSettings,
                      reason: str, regenerate: bool) -> str:
        """The fallback server answers the turn: the history takes the user's message as the engine's turn
        would (Sessions.turn_elsewhere), and the server's text when it ends (remote_replies.py)."""
        self.store.turn_elsewhere(chat.session_id, messages, regenerate=regenerate)
        chat.alternatives = None
        return self.remote.start(chat, fallback, fields, reason, regenerate)

    def stop(self, chat_id: str) -> None:
        """Abort the chat's reply; what was generated is kept as the assistant's message (its turn-end comes
        when its stream has ended)."""
        chat = self.sessions.get(chat_id)
        if chat is not None and chat.preparing is not None:  # its request is not queued yet: nothing to keep
            self._cancel_preparing(chat)
            self.post("chat-error", chat=chat_id, message="stopped before its reply began")
            return
        if chat is None or chat.request_id is None:
            return
        if chat.remote is not None:
            self.remote.stop(chat)
            return
        if not self.engine.is_unfinished(chat.request_id):
            return  # finished in a step that has not returned yet (it awaits the disk): its output ends the turn
        self.api.abort(chat.request_id)

    @staticmethod
    def _cancel_preparing(chat: Chat) -> None:
        """Cancel a turn still being prepared (`_prepare_reply`): its request was never queued, so the session
        is as it was."""
        chat.preparing.cancel()
        chat.preparing = None

    def unload(self, request_id: str, model: str) -> None:
        """pagedkv.js unloads a model (api-unload): its API streams end, and so do the replies its chats were
        generating (kept as far as they got, as Stop keeps them); a later message to such a chat is refused."""
        if self.api.unload(request_id, model):
            self.post_stats(force=True)

    def forget_session(self, chat_id: str) -> bool:
        """The page deleted a chat, or pagedkv.js forgot a session: its reply stops and its cached history (with
        that reply) leaves the prefix cache, except the leading blocks another session's history starts with (a
        shared system prompt stays cached); its block files go too, but for those another session holds.
        Whether the engine held it."""
        chat = self.sessions.pop(chat_id, None)
        try:
            if chat is not None and chat.preparing is not None:
                self._cancel_preparing(chat)
            if chat is not None and chat.remote is not None:
                self.remote.cancel(chat)
            elif chat is not None and chat.request_id is not None:
                self.api.abort(chat.request_id)  # its stream ends; its reader posts nothing for a chat gone
            held = self.store.forget(chat_id) is not None
            if self.engine.disk_enabled:  # also for a chat never opened here: only its files may remain
                self._disk_task = asyncio.ensure_future(self._forget_on_disk(chat_id))
            return held
        finally:  # the session is gone whatever failed
            self.post_stats(force=True)

    def flush_disk(self) -> asyncio.Future | None:
        """The page is hidden or left (`flush-disk`): every full block of the sessions' histories and of the
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
                chat.end_reason = chat.request.finish_reason or "error"  # too long for the new pool
                self.api.abort(chat.request_id)
        self.api.keep_only(requeued)
        self._ensure_loop()
        self.post_stats(force=True)
        return requeued

    async def run(self) -> None:
        """Step the engine while anything is unfinished, each step's outputs to their requests' streams; yields
        to the UI (and to the streams' readers) between steps."""
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
        """One step's outputs: every request is the completions API's (the chats' turns too)."""
        # What no stream takes is a request that ended while its last step awaited the disk (stopped or
        # deleted): its stream has ended already.
        self.api.deliver(outputs)
        self.post_stats()

    async def settled(self) -> None:
        """Wait until every chat's reply stream has been read to its end (its turn-end posted)."""
        while True:
            readers = [c.reader for c in self.sessions.values() if c.reader is not None and not c.reader.done()]
            if not readers:
                return
            await asyncio.wait(readers)

    async def _read(self, chat: Chat, rid: str, chunks) -> None:
        """Post a turn's chunks as the page's events: its tokens (`token`, or `alt-token` for alternatives),
        then its end, with what the session's history now holds."""
        finished: dict[int, str] = {}
        async for piece in chunks:  # a step that fails leaves it waiting (ApiRequests.fail): it resumes on
            for choice in piece["choices"]:  # a rebuilt device (resume_on)
                ids = (choice.get("pagedkv") or {}).get("token_ids", [])
                text = choice["delta"].get("content") or ""
                if ids or text:
                    self._on_piece(chat, rid, choice["index"], text, ids)
                if choice["finish_reason"] is not None:
                    finished[choice["index"]] = choice["finish_reason"]
        if self.engine.disk_writing and not self.engine.has_unfinished:
            try:
                await asyncio.wait_for(asyncio.shield(self.engine.settle_disk()), DISK_SETTLE_S)
            except asyncio.TimeoutError:
                pass  # still writing: the end is told now, the blocks land a moment later
        if self.sessions.get(chat.session_id) is not chat or chat.request_id != rid:
            return  # deleted meanwhile: nothing more of it goes to the page
        if chat.alternatives is not None:
            chat.request_id = chat.request = None
            self.alts.end(chat, "done" if len(finished) == len(chat.alternatives.ids) else "abort")
            return
        self._end_turn(chat, reason=finished.get(0) or chat.end_reason or "abort",
                       content=chat.conversation.messages[-1]["content"], tokens=len(chat.partial_ids),
                       cached_tokens=chat.request.num_cached_prompt_tokens)

    def _on_piece(self, chat: Chat, rid: str, index: int, text: str, ids: list[int]) -> None:
        if self.sessions.get(chat.session_id) is not chat or chat.request_id != rid:
            return
        self._rate.add(time.perf_counter(), len(ids))
        if chat.alternatives is not None:
            self.alts.on_piece(chat, index, text, ids)
            return
        chat.partial_ids.extend(ids)
        chat.partial_text.append(text)
        self.post("token", chat=chat.session_id, text=text, ids=ids)

    def _end_turn(self, chat: Chat, **turn) -> None:
        """Tell the page the reply is over (its content is in the history now) and make the chat idle. The
        turn-end carries the session's record (checkpoint, before_reply: what session-saved carries), so the
        page writes the ended reply and its token history in one write as the end lands: a reload or a close
        right after it keeps the whole reply (a session-saved a message later could come after the page was
        gone)."""
        self.post("turn-end", chat=chat.session_id, history_tokens=chat.conversation.num_tokens, **turn,
                  **chat.session.record())
        chat.request_id = chat.request = chat.remote = None
        chat.partial_ids, chat.partial_text = [], []

    # ---------------------------------------------------------------- dashboard

    def post_saved(self, chat: Chat, **extra) -> None:
        """The session's exact token history as it stands now (Session.record), for the page to store in the
        chat's record (`reply`: the text of a cut-off reply the session was opened with)."""
        self.post("session-saved", chat=chat.session_id, **chat.session.record(), **extra)

    async def _forget_on_disk(self, chat_id: str) -> None:
        try:
            await self.store.forget_on_disk(chat_id)
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
