"""The engine as a library under CPython: OpenAI Chat Completions, and legacy Completions, over one LLMEngine.

    from pagedkv.api import Engine
    engine = Engine(models=["smollm2-135m-instruct"], budget_mib=1024)
    reply = engine.chat.completions.create(model="smollm2-135m-instruct",
                                           messages=[{"role": "user", "content": "Hi"}], max_tokens=32)
    for piece in engine.chat.completions.create(..., stream=True): ...
    await engine.chat.completions.acreate({...})   # the same on a running event loop
    engine.completions.create(model=..., prompt="Once upon a time", max_tokens=16)   # a base model: no template

A legacy completion (`engine.completions`, /v1/completions) is the same request with another input: its prompt is
tokenized as it is (BOS / EOS as the model's file says, no chat template), or given as token ids, and its objects
are `text_completion`s.

One step loop serves every request (concurrent requests batch in one forward); each request's outputs are routed
to it. Stop strings, n, usage, errors as OpenAI's (completions.py). `pagedkv: {"session": id}` continues a
conversation on its exact token ids (the prefix cache then holds all of it); `forget(id)` drops it. Without a
session a request is stateless and still reuses KV through the prefix cache. A request's blocks are freed when it ends,
when its stream is closed early or when `signal` (an asyncio.Event) is set. The CPU backend (numpy) holds the
weights; `budget_mib` bounds weights + KV pool.

Several models: `Engine(models=["a", "b"], budget_mib=...)` loads them into one LLMEngine whose KV pool is one
buffer of equal pages (shared_cpu.py: the widest model gets 16-token blocks, the others the largest block that
fits a page); every model's weights take their bytes out of the same pages, the rest is KV that
either model's requests use. `engine.load(model)` adds one at run time (413 with the numbers when its
weights' pages are not free), `engine.unload(model)` stops its requests and gives its pages back.
"""
from __future__ import annotations

import asyncio
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import AsyncIterator, Iterator, Sequence

from .chat import ChatTemplate, Conversation
from .completions import (LEGACY_MAX_TOKENS, ApiError, CompletionRequest, StopStrings, chunk, completion, now,
                          parse_request, parse_request_slices, tool_call_deltas, usage)
from .engine import EngineConfig, LLMEngine, NeverFits
from .grammar import Grammar, SchemaError
from .logprobs import chat_logprobs, join_logprobs, legacy_logprobs
from .model.weights import ModelWeights
from .request_limits import check_body_size
from .sampling import MIN_TEMPERATURE, SamplingParams
from .sessions import Session, Sessions
from .shared_cpu import BudgetTooSmall, CpuModel, add_model, shared_engine
from .slices import Slices, await_slices, run_slices
from .tokenizer import Tokenizer
from .tool_calls import ToolCallParser
from .tools import ToolChoice, call_grammar_slices

__all__ = ["ApiError", "ChatCompletions", "CompletionService", "CompletionServices", "Completions", "Engine",
           "PromptTooLong"]

MIB = 1 << 20
MODELS_DIR = Path(__file__).resolve().parents[2] / "dist" / "models"


class PromptTooLong(ApiError):
    """400: the prompt leaves no room in the model's context (a fallback server with a longer one may answer)."""


class _Creates:
    """create / acreate over an async `stream(body, signal)` returning the chunks; `legacy`: they are legacy
    Completions' (text_completion)."""

    legacy = False

    async def acreate(self, body: dict | None = None, *, signal: asyncio.Event | None = None, **fields):
        """A `chat.completion`, or with `stream: true` an async iterator of `chat.completion.chunk`s (legacy: a
        `text_completion`, or its streamed pieces)."""
        body = dict(body or {}, **fields)
        chunks = await self.stream(body, signal)
        if body.get("stream"):
            return chunks
        return await _collect(chunks, self.legacy)

    def create(self, body: dict | None = None, **fields) -> dict | Iterator[dict]:
        """As acreate, driven on a private event loop: in this thread, or where this thread runs a loop already
        (a notebook, a Playwright test) in a helper thread of its own."""
        body = dict(body or {}, **fields)
        loop, run = _private_loop()
        try:
            result = run(self.acreate(body))
        except BaseException:
            loop.close()
            raise
        if not body.get("stream"):
            loop.close()
            return result
        return _drain(loop, run, result)


class CompletionService(_Creates):
    """OpenAI Chat Completions for one model of an LLMEngine that someone else steps: `kick()` makes sure a step
    loop runs (api.Engine's own; the page worker's ChatService.run) and that loop hands every step's outputs
    to `deliver`, which routes this service's and returns the rest. model: the engine's name for the model
    (None: its first); ids: request numbers shared with the other models' services."""

    def __init__(self, llm: LLMEngine, template: ChatTemplate, model_id: str, context_length: int, kick, *,
                 model: str | None = None, ids=None, sessions: Sessions | None = None) -> None:
        """sessions: the engine's sessions (sessions.Sessions), shared by its models' services; None: its own."""
        self.llm, self.template, self.model_id, self.model = llm, template, model_id, model
        self.tokenizer = llm.lane(model).tokenizer
        self.context_length = int(context_length)
        self.kick = kick
        self._routes: dict[str, asyncio.Queue] = {}
        self.sessions = sessions if sessions is not None else Sessions(llm)
        self._ids = ids if ids is not None else itertools.count(1)
        self.closed = False

    def list_models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": 0,
                                            "owned_by": "pagedkv"}]}

    def deliver(self, outputs) -> list:
        """Route the outputs of this service's requests; returns the others (the chat app's)."""
        rest = []
        for out in outputs:
            route = self._routes.get(out.request_id)
            if route is None:
                rest.append(out)
            else:
                route.put_nowait(out)
        return rest

    def fail(self, exc: Exception, request_ids=None) -> None:
        """The step loop died: every waiting request hears of it (request_ids: those only)."""
        for rid, route in self._routes.items():
            if request_ids is None or rid in request_ids:
                route.put_nowait(exc)

    def abort(self, request_id: str) -> None:
        """Stop a request now (its stream ends at once; its blocks are freed)."""
        route = self._routes.get(request_id)
        if route is not None:
            route.put_nowait(None)
        if self.llm.is_unfinished(request_id):
            self.llm.abort(request_id)

    def forget(self, session: str) -> bool:
        """Drop a session (`pagedkv: {session}`) of this model: its request stops, its token history goes and
        its blocks leave the prefix cache, but for those another session's history begins with
        (Sessions.forget; its block files on disk: Sessions.forget_on_disk). False when there was none."""
        held = self.sessions.get(session)
        if held is None or held.model != self.model:
            return False
        self.sessions.forget(session)
        return True

    def keep(self, session: str, index: int) -> str:
        """Alternative `index` (of a request with `pagedkv: {session, regenerate: true}` and n >= 2) becomes the
        session's last reply, its exact ids; returns its text. ApiError 400 when there is none such."""
        try:
            return self.sessions.keep(session, index)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    def close(self, error: ApiError | None = None, request_ids=None) -> None:
        """Stop every request; later requests get 503. error: what each running request's caller gets (its
        stream raises it where it stands; None: the streams just end); request_ids: the requests that get it
        (None: all; the others just end, as a chat's turn keeps its reply as far as it got)."""
        self.closed = True
        for rid, route in list(self._routes.items()):
            if error is not None and (request_ids is None or rid in request_ids):
                route.put_nowait(error)
            self.abort(rid)

    # ---------------------------------------------------------------- one request

    def _session(self, req: CompletionRequest) -> Session | None:
        """The request's session (`pagedkv.session`), idle: opened empty or from `pagedkv.restore` when the
        engine holds none (a reload), replaced by `restore` when it holds an idle one. ApiError 400 when it is
        another model's or answers another request now."""
        name = req.options.get("session")
        if name is None:
            return None
        session = self.sessions.get(name)
        if session is not None and session.request_id is not None:
            raise ApiError(400, f"pagedkv.session {name!r} is answering another request; wait for it or abort it",
                           "pagedkv.session")
        if session is not None and session.model != self.model:
            raise ApiError(400, f"pagedkv.session {name!r} is a conversation with another model", "pagedkv.session")
        if req.n != 1 and not req.options.get("regenerate"):
            raise ApiError(400, f"a pagedkv.session continues one conversation: n must be 1 (or, with "
                                f"pagedkv.regenerate, n alternatives to its last reply), got {req.n}", "n")
        if session is None or "restore" in req.options:
            try:
                session = self.sessions.open(name, self.model, self.template, req.options.get("restore"))
            except ValueError as exc:  # token ids outside the vocabulary
                raise ApiError(400, f"pagedkv.restore: {exc}", "pagedkv.restore") from None
        return session

    def _conversation(self, req: CompletionRequest, session: Session | None = None) -> Slices[Conversation]:
        """The request's conversation: with `regenerate`, the session's history before its last reply (the
        request's messages must be that history's); with a session whose messages the request's start with,
        that session's exact token ids plus the new messages (a copy: the session takes it when the engine
        accepts the request); else the messages rendered afresh. In slices (slices.py)."""
        held = session.conversation.messages if session is not None else None
        if req.options.get("regenerate"):
            if session.before_reply is None:
                raise ApiError(400, "there is no reply to regenerate in this session", "pagedkv.regenerate")
            if req.messages != [dict(m) for m in session.before_reply[0]]:
                raise ApiError(400, "with pagedkv.regenerate the messages must be the session's history up to its "
                                    "last reply", "messages")
            conv = Conversation(self.tokenizer, self.template, tools=req.shown_tools)
            conv.rollback(session.before_reply)
            return conv
        conv = Conversation(self.tokenizer, self.template, tools=req.shown_tools)
        if held is None or req.messages[:len(held)] != held or len(req.messages) == len(held) \
                or (held and session.conversation.tools != req.shown_tools):
            yield from conv.add_messages_slices(req.messages)
            return conv
        conv.rollback(session.conversation.checkpoint())
        try:
            yield from conv.add_messages_slices(req.messages[len(held):])
        except ValueError:  # the template writes the session's last turn otherwise now (a run of tool results)
            conv = Conversation(self.tokenizer, self.template, tools=req.shown_tools)
            yield from conv.add_messages_slices(req.messages)
        return conv

    def prompt_ids(self, req: CompletionRequest) -> list[int]:
        """A legacy request's prompt ids: its text tokenized as it is, with BOS (and EOS) where the model's file
        says to add them (llama.cpp's add_special) and no chat template; or its token ids as given."""
        return run_slices(self._prompt_ids(req))

    def _prompt_ids(self, req: CompletionRequest) -> Slices[list[int]]:
        """prompt_ids in slices (slices.py)."""
        if isinstance(req.prompt, str):
            ids = yield from self.tokenizer.encode_slices(req.prompt, add_special=True)
        else:
            vocab = self.tokenizer.vocab_size
            bad = next((t for t in req.prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise ApiError(400, f"prompt holds token id {bad}; {self.model_id}'s ids are 0..{vocab - 1}",
                               "prompt")
            ids = list(req.prompt)
        if not ids:
            raise ApiError(400, f"the prompt is empty and {self.model_id} adds no BOS token: give at least one "
                                "token to continue", "prompt")
        return ids

    def _prepare(self, body: dict, request_id: str | None, legacy: bool) -> Slices[tuple[CompletionRequest, str, int]]:
        """Check `body` (parse_request), then _start it, in slices (slices.py)."""
        req = yield from parse_request_slices(body, [self.model_id], legacy=legacy)
        rid, prompt_tokens = yield from self._start(req, request_id)
        return req, rid, prompt_tokens

    def _start(self, req: CompletionRequest, request_id: str | None) -> Slices[tuple[str, int]]:
        """Render and tokenize the request (in slices: slices.py), then queue it; its id and prompt length."""
        session = self._session(req)
        mark = _turn_mark(session)
        try:
            conv = None if req.legacy else (yield from self._conversation(req, session))
            prompt = (yield from self._prompt_ids(req)) if conv is None else (yield from conv.prompt_ids_slices())
        except ValueError as exc:  # the chat template failed on these messages (raise_exception, a bound): its
            raise ApiError(400, str(exc), getattr(exc, "param", "messages")) from None  # the caller's to act on
        grammar = yield from self._grammar(req)
        # What may have changed while other tasks ran between the slices:
        if self.closed:
            raise ApiError(503, "the engine is closed")
        if session is not None and (self.sessions.get(session.session_id) is not session
                                    or _turn_mark(session) != mark):
            raise ApiError(400, f"pagedkv.session {session.session_id!r} took another request while this one was "
                                "prepared; send it again on the history the session has now", "pagedkv.session")
        room = self.context_length - len(prompt)
        if room < 1:
            raise PromptTooLong(400, f"the prompt has {len(prompt)} tokens; {self.model_id}'s context is "
                                     f"{self.context_length}", req.input_field)
        if req.max_tokens is not None and req.max_tokens > room and not req.options.get("up_to_context"):
            raise ApiError(400, f"max_tokens {req.max_tokens} + the prompt's {len(prompt)} tokens pass "
                                f"{self.model_id}'s context of {self.context_length}", "max_tokens")
        greedy = req.temperature < MIN_TEMPERATURE or req.top_p == 0.0  # the nucleus of p=0: the top token
        limit = min(req.max_tokens, room) if req.max_tokens else min(LEGACY_MAX_TOKENS, room) if req.legacy else room
        vocab = self.tokenizer.vocab_size
        if req.logit_bias and req.logit_bias[-1][0] >= vocab:
            raise ApiError(400, f"logit_bias names token id {req.logit_bias[-1][0]}; {self.model_id}'s ids are "
                                f"0..{vocab - 1}", "logit_bias")
        params = SamplingParams(temperature=0.0 if greedy else req.temperature, top_p=1.0 if greedy else req.top_p,
                                seed=req.seed, max_tokens=limit, n=req.n, top_k=req.top_k, min_p=req.min_p,
                                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                                logit_bias=req.logit_bias, logprobs=req.logprobs, grammar=grammar)
        rid = request_id or f"{'cmpl' if req.legacy else 'chatcmpl'}-{next(self._ids)}"
        if rid in self._routes:
            raise ApiError(400, f"a request with id {rid!r} is running")
        try:
            # The session names the request's blocks in the memory panel (kv_snapshot's owners).
            self.llm.add_request(prompt, params, request_id=rid, model=self.model,
                                 priority=req.options.get("priority", 0), session=req.options.get("session", "default"))
        except NeverFits as exc:
            raise ApiError(413, str(exc), req.input_field) from None
        if session is not None:
            self.sessions.started(session, conv, rid, alternatives=req.n > 1)
        self._routes[rid] = asyncio.Queue()
        self.kick()
        return rid, len(prompt)

    def _grammar(self, req: CompletionRequest) -> Slices[Grammar | None]:
        """The grammar the reply is decoded under: a forced tool call's (tools.call_grammar); under "auto" with a
        response_format, a reply in that format or a call of any tool; response_format's alone; or None where
        the model answers freely. In slices (slices.py): the tools' schemas compile in slices."""
        if not req.shown_tools or (req.grammar is None and not req.tool_choice.forced):
            return req.grammar
        try:
            choice = req.tool_choice if req.tool_choice.forced else ToolChoice("required")
            calls = yield from call_grammar_slices(self.template.tool_format, req.tools, choice)
        except SchemaError as exc:
            raise ApiError(400, f"{exc.param}: {exc.message}", exc.param) from None
        return calls if req.tool_choice.forced else Grammar.any_of([req.grammar, calls])

    async def stream(self, body: dict, signal: asyncio.Event | None = None, request_id: str | None = None, *,
                     legacy: bool = False, at_once: bool = False) -> AsyncIterator[dict]:
        """The `chat.completion.chunk`s of one request (legacy: a legacy Completions body, its streamed
        `text_completion`s); ApiError before the first one for a request refused. Its body is checked, its messages
        rendered and tokenized in slices with the event loop running between them (the engine's steps: slices.py),
        unless `at_once` (then it never awaits before it returns: a chat turn of the page, which answers the page's
        message synchronously; docs/architecture.md says what that costs)."""
        if self.closed:
            raise ApiError(503, "the engine is closed")
        check_body_size(body)  # before anything costs more than a pass over it
        prepare = self._prepare(body, request_id, legacy)
        req, rid, prompt_tokens = run_slices(prepare) if at_once else await await_slices(prepare)
        # Taken now: the step loop may finish the request before the caller reads its first chunk (its outputs
        # wait in its route); num_cached_prompt_tokens is set when the scheduler first admits it.
        root = self.llm.request(rid)
        return self._chunks(req, rid, root, prompt_tokens, signal)

    async def _chunks(self, req: CompletionRequest, rid: str, root, prompt_tokens: int,
                      signal) -> AsyncIterator[dict]:
        created, route, legacy = now(), self._routes[rid], req.legacy
        stops = [StopStrings(req.stop) for _ in range(req.n)]
        names = frozenset(t["function"]["name"] for t in req.shown_tools)
        parsers = [ToolCallParser(self.template.tool_format, names) if names else None for _ in range(req.n)]
        done, tokens = [False] * req.n, [0] * req.n
        ids, texts, calls = [[] for _ in range(req.n)], [[] for _ in range(req.n)], [[] for _ in range(req.n)]
        offsets = [0] * req.n  # a legacy choice's characters of token text so far (its text_offset)
        try:
            for i in range(req.n if not legacy else 0):  # a legacy stream has no role chunk
                yield chunk(rid, req.model, created, i, role=True)
            while not all(done):
                if signal is not None and signal.is_set():
                    break
                out = await route.get()
                if out is None:  # aborted (abort(), close())
                    break
                if isinstance(out, ApiError):  # close(error): the model was unloaded under it
                    raise out
                if isinstance(out, Exception):
                    raise ApiError(500, f"the engine failed: {type(out).__name__}: {out}") from out
                i = out.index
                if done[i]:
                    continue
                tokens[i] += len(out.token_ids)
                ids[i] += out.token_ids
                text, stopped = stops[i].push(out.text)
                if out.finished and not stopped:
                    text += stops[i].flush()
                reason = "stop" if stopped else out.finish_reason if out.finished else None
                logprobs = None
                if out.logprobs:
                    if legacy:
                        logprobs = legacy_logprobs(out.logprobs, self.tokenizer, offsets[i])
                        offsets[i] += sum(map(len, logprobs["tokens"]))
                    else:
                        logprobs = chat_logprobs(out.logprobs, self.tokenizer)
                events = [text] if parsers[i] is None else parsers[i].push(text) + (
                    parsers[i].finish() if reason is not None else [])
                wants_ids = bool(out.token_ids and req.options.get("token_ids"))
                for event in events:
                    if isinstance(event, str):
                        texts[i].append(event)
                        if event:
                            yield _with_ids(chunk(rid, req.model, created, i, text=event, legacy=legacy,
                                                  logprobs=logprobs), out.token_ids if wants_ids else (),
                                            req.options.get("token_ids"))
                            logprobs, wants_ids = None, False
                    else:
                        call = {"id": self.template.tool_format.call_id(), "type": "function",
                                "function": {"name": event.name, "arguments": event.arguments}}
                        for delta in tool_call_deltas(len(calls[i]), call["id"], event.name, event.arguments):
                            yield chunk(rid, req.model, created, i, tool_call=delta)
                        calls[i].append(call)
                        if not req.parallel_tool_calls:  # the reply ends at its first call: decoding stops
                            reason = reason or "tool_calls"  # (its finish_reason is the call's, below)
                            break
                # a token held back (a stop string or a call may begin) still has its logprob, and its ids when asked
                if logprobs is not None or wants_ids:
                    yield _with_ids(chunk(rid, req.model, created, i, legacy=legacy, logprobs=logprobs),
                                    out.token_ids, req.options.get("token_ids"))
                if reason in ("stop", "tool_calls") and calls[i]:  # OpenAI: "stop" when the call was asked for by
                    reason = "stop" if req.tool_choice.mode == "function" else "tool_calls"  # name; "length" stays
                if reason is not None:
                    done[i] = True
                    yield chunk(rid, req.model, created, i, finish_reason=reason, legacy=legacy)
                if all(done[j] or stops[j].stopped for j in range(req.n)) and self.llm.is_unfinished(rid):
                    self.llm.abort(rid)  # a stop string or a first call ended the last sample still running
            session = self._end_session(req, rid, ids, texts, stops, calls)
            if all(done) and (req.include_usage or not req.stream):  # a completion object always carries usage
                yield chunk(rid, req.model, created,
                            use=usage(prompt_tokens, sum(tokens), root.num_cached_prompt_tokens), legacy=legacy)
            if session is not None and req.options.get("save"):  # what the app stores to restore it
                yield {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                       "choices": [], "pagedkv": {"session": session.session_id, **session.record()}}
        finally:  # ended, closed early by the caller, or aborted: nothing of it stays in the pool
            if self.llm.is_unfinished(rid):
                self.llm.abort(rid)
            self._routes.pop(rid, None)
            self._end_session(req, rid, ids, texts, stops, calls)  # a stream closed early: its reply so far

    def _end_session(self, req: CompletionRequest, rid: str, ids, texts, stops, calls) -> Session | None:
        """The session's reply ended, finished or not (an aborted one as far as it got, as the chat page's
        Stop keeps it): it joins the history (Sessions.ended); None without a session or once recorded."""
        name = req.options.get("session")
        if name is None:
            return None
        stopped = "".join(texts[0]) if req.n == 1 and stops[0].stopped else None  # the text the caller saw
        called = {"role": "assistant", "content": "".join(texts[0]) or None, "tool_calls": calls[0]} \
            if req.n == 1 and calls[0] else None  # a call joins as the message returned, as the caller sends it back
        return self.sessions.ended(name, rid, ids, stopped, alternatives=req.n > 1, message=called)


class CompletionServices(dict):
    """The completion services of an engine's models, by model id (api.Engine's; the page worker's
    ApiRequests'): a request body to its model's service, each step's outputs to their requests. `sessions`:
    the engine's sessions, which every service here shares."""

    def __init__(self, sessions: Sessions) -> None:
        super().__init__()
        self.sessions = sessions

    def route(self, body, legacy: bool = False) -> CompletionService:
        """The service of the model `body` names; ApiError as OpenAI's (404 unknown, 400 malformed). legacy: a
        legacy Completions body."""
        check_body_size(body)
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and model in self:
            return self[model]
        parse_request(body, list(self), legacy=legacy)  # names what is wrong with the body
        raise ApiError(404, f"the model {model!r} does not exist here", "model")

    def deliver(self, outputs) -> list:
        """Route the outputs of every service's requests; returns the others (the chat app's)."""
        for service in self.values():
            outputs = service.deliver(outputs)
        return outputs

    def fail(self, exc: Exception) -> None:
        """The step loop died: every waiting request hears of it."""
        for service in self.values():
            service.fail(exc)

    def close(self, error: ApiError | None = None) -> None:
        """Stop every request (each raises `error` where it stands; None: they just end); later requests get
        503."""
        for service in self.values():
            service.close(error)

    def forget(self, session: str) -> bool:
        """Drop a session (`pagedkv: {session}`) of whichever model holds it; False when none did."""
        return any([s.forget(session) for s in self.values()])


class _EngineCreates(_Creates):
    """create / acreate of an Engine: each request to the service of the model it names."""

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine

    async def stream(self, body: dict, signal: asyncio.Event | None = None,
                     request_id: str | None = None) -> AsyncIterator[dict]:
        return await self._engine.service(body, self.legacy).stream(body, signal, request_id, legacy=self.legacy)


class ChatCompletions(_EngineCreates):
    """engine.chat.completions of an Engine: OpenAI Chat Completions."""


class Completions(_EngineCreates):
    """engine.completions of an Engine: OpenAI's legacy Completions (a prompt continued with no chat template),
    the same requests on the same services as a chat's."""

    legacy = True


class Engine:
    """OpenAI Chat Completions (`engine.chat.completions`) and legacy Completions (`engine.completions`) over one
    LLMEngine on the CPU backend, stepped by its own loop. `models`: model
    ids under `models_dir` (dist/models, what build.py writes) or model directories; the id is the directory's
    name. All of them and their KV share `budget_mib` (module docstring)."""

    def __init__(self, models: Sequence[str | Path], *, budget_mib: int = 1024, block_size: int = 16,
                 models_dir: Path = MODELS_DIR) -> None:
        if not models:
            raise ValueError("an Engine needs at least one model")
        self.models_dir = Path(models_dir)
        found = [self._weights(m) for m in models]
        ids = [model_id for model_id, _ in found]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a model is named twice: {ids}")
        self.budget_bytes = _budget_bytes(budget_mib)
        try:
            self.llm, self.shared = shared_engine([self._model(i, w) for i, w in found], self.budget_bytes, block_size)
        except BudgetTooSmall as exc:
            raise ApiError(413, str(exc), "budget_mib") from None
        self._ids = itertools.count(1)
        self.services = CompletionServices(Sessions(self.llm))
        for model_id, weights in found:
            self._serve(model_id, weights)
        self._driver: asyncio.Task | None = None
        self.closed = False
        self.chat = SimpleNamespace(completions=ChatCompletions(self))
        self.completions = Completions(self)  # the legacy API, where the openai client has it
        self.models = SimpleNamespace(list=self.list_models)

    # ---------------------------------------------------------------- models

    def _weights(self, model: str | Path) -> tuple[str, ModelWeights]:
        model_dir = Path(model) if Path(model).is_dir() else self.models_dir / str(model)
        if not (model_dir / "model.json").is_file():
            raise ApiError(404, f"no model {model!r}: {model_dir} holds no model.json (python3 build.py builds "
                                "it)", "model")
        return model_dir.name, ModelWeights.load(model_dir)

    @staticmethod
    def _model(model_id: str, weights: ModelWeights) -> CpuModel:
        return CpuModel(model_id, weights, Tokenizer.from_manifest(weights.manifest))

    def _serve(self, model_id: str, weights: ModelWeights) -> None:
        tokenizer = self.llm.lane(model_id).tokenizer
        self.services[model_id] = CompletionService(
            self.llm, ChatTemplate.from_manifest(weights.manifest, tokenizer), model_id,
            weights.manifest["config"]["context_length"], self._kick, model=model_id, ids=self._ids,
            sessions=self.services.sessions)

    def load(self, model: str | Path) -> str:
        """Load another model at run time into the same pages; returns its id. ApiError 413 with the numbers
        when its weights' pages are not free now (requests hold them) or it is wider than the pages."""
        self._open()
        model_id, weights = self._weights(model)
        if model_id in self.services:
            raise ApiError(400, f"{model_id} is loaded already", "model")
        try:
            add_model(self.llm, self.shared, self._model(model_id, weights))
        except (NeverFits, ValueError) as exc:
            raise ApiError(413, str(exc), "model") from None
        self._serve(model_id, weights)
        return model_id

    def unload(self, model: str) -> None:
        """Stop `model`'s requests (each raises unloaded_error where it stands) and give its weights' and KV
        pages back."""
        self._open()
        service = self.services.get(model)
        if service is None:
            raise ApiError(404, f"the model {model!r} is not loaded; loaded: {', '.join(self.services)}", "model")
        if len(self.services) == 1:
            raise ApiError(400, f"{model} is the engine's only model; close the engine instead", "model")
        service.close(unloaded_error(model))
        self.llm.remove_model(model)
        del self.services[model]

    def list_models(self) -> dict:
        self._open()
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "pagedkv"}
                                           for m in self.services]}

    def service(self, body: dict, legacy: bool = False) -> CompletionService:
        """The service of the model `body` names; ApiError as OpenAI's (503 closed, 404 unknown, 400 malformed).
        legacy: a legacy Completions body."""
        self._open()
        return self.services.route(body, legacy)

    def _open(self) -> None:
        if self.closed:
            raise ApiError(503, "the engine is closed")

    # ---------------------------------------------------------------- the engine

    @property
    def model_id(self) -> str:
        """The first model's id."""
        return next(iter(self.services))

    @property
    def context_length(self) -> int:
        return self.services[self.model_id].context_length

    def forget(self, session: str) -> bool:
        """Drop a session (`pagedkv: {session}`) of whichever model holds it; False when none did."""
        self._open()
        return self.services.forget(session)

    def close(self) -> None:
        """Stop every request; later calls of any method raise ApiError 503."""
        self.closed = True
        self.services.close(ApiError(503, "the engine was closed while this request ran"))

    def stats(self) -> dict:
        """Each model's counters and KV (LLMEngine.stats) and, under "pool", the shared pages: total, free,
        cached, held by each model's weights and requests, and their bytes."""
        self._open()
        out = {m: self.llm.stats(m) for m in self.services}
        out["pool"] = dict(self.llm.pool_stats(), page_bytes=self.shared.page_bytes, budget_bytes=self.budget_bytes)
        return out

    def _kick(self) -> None:
        """Start the step loop on the running event loop unless it runs there already (create() runs each call
        on a fresh private loop: a loop task left pending on a closed one never runs again)."""
        loop = asyncio.get_running_loop()
        if self._driver is None or self._driver.done() or self._driver.get_loop() is not loop:
            self._driver = loop.create_task(self._drive())

    async def _drive(self) -> None:
        """The step loop: steps while anything is unfinished, each output to its request."""
        try:
            while self.llm.has_unfinished:
                self.services.deliver(await self.llm.step())
                await asyncio.sleep(0)
        except Exception as exc:
            self.services.fail(exc)
            raise


def _budget_bytes(budget_mib) -> int:
    """budget_mib in bytes; ApiError 400 naming it for anything but a whole number of MiB this machine's memory
    holds (checked before the pool is allocated: 10**9 MiB would ask numpy for 954 TiB). One too small for the
    models is shared_engine's 413, with the numbers."""
    if isinstance(budget_mib, bool) or not isinstance(budget_mib, int) or budget_mib < 0:
        raise ApiError(400, f"budget_mib must be a whole number of MiB, got {budget_mib!r:.40}", "budget_mib")
    memory = _machine_memory()
    if memory is not None and budget_mib * MIB > memory:
        raise ApiError(400, f"budget_mib is {budget_mib:,} MiB, more than this machine's memory "
                            f"({memory // MIB:,} MiB)", "budget_mib")
    return budget_mib * MIB


def _machine_memory() -> int | None:
    """The machine's physical memory in bytes; None where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _turn_mark(session: Session | None) -> tuple | None:
    """What a request on `session` changes (its history, its reply's rollback point, its alternatives, whether it
    answers): a request prepared in slices is refused when another one changed it meanwhile."""
    if session is None:
        return None
    conv = session.conversation
    return (conv, conv.num_tokens, session.before_reply, session.alternatives, session.request_id)


def unloaded_error(model: str) -> ApiError:
    """What a request of `model` raises when the model is unloaded under it (503: the model is gone; a
    request sent again after loading it is answered)."""
    return ApiError(503, f"the model {model} was unloaded while this request ran", "model")


def _with_ids(piece: dict, token_ids, wanted: bool) -> dict:
    """`pagedkv.token_ids`: the chunk's choice carries the ids it streams (the chat page saves a reply in
    progress as exact ids)."""
    if wanted:
        piece["choices"][0]["pagedkv"] = {"token_ids": list(token_ids)}
    return piece


def _private_loop():
    """A new event loop and a function running a coroutine on it to completion. Where this thread runs a loop
    already, the new one runs in one helper thread (always the same one, so its tasks stay on it)."""
    loop = asyncio.new_event_loop()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return loop, loop.run_until_complete
    helper = ThreadPoolExecutor(1, thread_name_prefix="pagedkv-api")
    return loop, lambda coro: helper.submit(loop.run_until_complete, coro).result()


def _drain(loop: asyncio.AbstractEventLoop, run, chunks: AsyncIterator[dict]) -> Iterator[dict]:
    try:
        while True:
            try:
                yield run(chunks.__anext__())
            except StopAsyncIteration:
                return
    finally:
        run(chunks.aclose())  # a caller that stops early aborts the request
        loop.close()


async def _collect(chunks: AsyncIterator[dict], legacy: bool) -> dict:
    texts: dict[int, list[str]] = {}
    calls: dict[int, list[dict]] = {}
    logprobs: dict[int, list[dict]] = {}  # each choice's chunks' logprobs
    reasons: dict[int, str] = {}
    cid = model = created = use = saved = None  # no usage: the request was aborted
    async for piece in chunks:
        cid, model, created = piece["id"], piece["model"], piece["created"]
        saved = piece.get("pagedkv", saved)
        for choice in piece["choices"]:
            texts.setdefault(choice["index"], []).append(choice["text"] if legacy else
                                                         choice["delta"].get("content") or "")
            for delta in [] if legacy else choice["delta"].get("tool_calls", ()):
                made = calls.setdefault(choice["index"], [])
                if "id" in delta:  # a call's first delta: id, type, name
                    made.append({"id": delta["id"], "type": delta["type"], "function": dict(delta["function"])})
                else:
                    made[delta["index"]]["function"]["arguments"] += delta["function"]["arguments"]
            if choice["logprobs"] is not None:
                logprobs.setdefault(choice["index"], []).append(choice["logprobs"])
            if choice["finish_reason"]:
                reasons[choice["index"]] = choice["finish_reason"]
        if "usage" in piece:
            use = piece["usage"]
    choices = [{"index": i, "text": "".join(texts[i]), "finish_reason": reasons.get(i), "tool_calls": calls.get(i),
                "logprobs": join_logprobs(logprobs[i], legacy) if i in logprobs else None} for i in sorted(texts)]
    out = completion(cid, model, created, choices, use, legacy=legacy)
    if saved is not None:  # pagedkv.save: the session's record
        out["pagedkv"] = saved
    return out
