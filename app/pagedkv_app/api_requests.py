"""pagedkv.js's requests in the worker: OpenAI Chat Completions and legacy Completions (an `api-request` with
`legacy: true`) through pagedkv.api.CompletionService, one per model the engine holds, on the chat service's engine
and step loop. The chat service routes `api-request` /
`api-abort` / `api-stats` / `api-load` / `api-unload` here and hands every step's outputs to `deliver` first; each request
answers with `api-chunk`s and `api-end`, or one `api-error` (status, OpenAI's error JSON). docs/api.md, and the
protocol table in docs/architecture.md."""
from __future__ import annotations

import asyncio
import itertools

from pagedkv.api import ApiError, CompletionService, CompletionServices, unloaded_error
from pagedkv.chat import ChatTemplate
from pagedkv.engine import LLMEngine, NeverFits
from pagedkv.sessions import Sessions


class ApiRequests:
    """The requests pagedkv.js sent, each a task streaming its chunks to the page through `post`. model_name:
    the engine's first model (its lane: None, whatever the lane is called); add_model serves the others."""

    def __init__(self, engine: LLMEngine, template: ChatTemplate, model_name: str, kick, post, loader=None) -> None:
        """loader: `await loader(engine, model) -> ChatTemplate` loads a model into the engine at run time
        (cpu_models.load_into in the tab); None: api-load is refused."""
        self.engine, self.kick, self.post, self.loader = engine, kick, post, loader
        self._ids = itertools.count(1)
        self.services = CompletionServices(Sessions(engine))  # the API's sessions and the chat page's chats
        self._serve(model_name, template, None)
        self._tasks: dict[str, asyncio.Future] = {}

    def _serve(self, model_name: str, template: ChatTemplate, lane: str | None) -> None:
        self.services[model_name] = CompletionService(
            self.engine, template, model_name, self.engine.lane(lane).context_length, self.kick, model=lane,
            ids=self._ids, sessions=self.services.sessions)

    def add_model(self, model_name: str, template: ChatTemplate) -> None:
        """Serve another model of the engine (its lane is called `model_name`)."""
        self._serve(model_name, template, model_name)

    def template_of(self, lane: str | None) -> ChatTemplate:
        """The chat template of the engine's model `lane` (None: the first)."""
        return self.service_of(lane).template

    def service_of(self, lane: str | None) -> CompletionService:
        """The service of the engine's model `lane` (None: the first); ValueError when it is not served."""
        if lane is None:
            return self.service
        found = next((s for s in self.services.values() if s.model == lane), None)
        if found is None:
            raise ValueError(f"the model {lane} is not loaded here (loaded: {', '.join(self.services)})")
        return found

    @property
    def service(self) -> CompletionService:
        """The first model's service."""
        return next(iter(self.services.values()))

    def request(self, request_id: str, body, legacy: bool = False) -> asyncio.Future:
        """Start one request (legacy: a legacy Completions body, /v1/completions); its task ends when its stream
        does (also when it is refused or aborted)."""
        task = asyncio.ensure_future(self._stream(request_id, body, legacy))
        self._tasks[request_id] = task
        return task

    async def _stream(self, request_id: str, body, legacy: bool) -> None:
        try:
            service = self.services.route(body, legacy)
            async for piece in await service.stream(body, request_id=request_id, legacy=legacy):
                self.post("api-chunk", id=request_id, chunk=piece)
            self.post("api-end", id=request_id)
        except ApiError as exc:
            self.post("api-error", id=request_id, status=exc.status, error=exc.body())
        except Exception as exc:  # noqa: BLE001  (the caller's promise must settle whatever failed)
            self.post("api-error", id=request_id, status=500,
                      error=ApiError(500, f"{type(exc).__name__}: {exc}").body())
        finally:
            self._tasks.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        for service in self.services.values():
            service.abort(request_id)

    def unload(self, request_id: str, model: str) -> bool:
        """Stop `model`'s requests and give its pages back (api-unloaded), or api-error; whether it was
        unloaded. pagedkv.js's requests of it end with an api-error naming the unload; a chat's reply ends
        as Stop ends it (kept as far as it got)."""
        try:
            if model not in self.services:
                raise ApiError(404, f"the model {model!r} is not loaded; loaded: {', '.join(self.services)}",
                               "model")
            if len(self.services) == 1 or model == next(iter(self.services)):
                raise ApiError(400, f"{model} is the model the chat page runs on; it stays loaded", "model")
            self.services.pop(model).close(unloaded_error(model), set(self._tasks))
            self.engine.remove_model(model)
            self.post("api-unloaded", id=request_id, model=model)
            return True
        except ApiError as exc:
            self.post("api-error", id=request_id, status=exc.status, error=exc.body())
            return False

    def load(self, request_id: str, model: str) -> asyncio.Future:
        """Load `model` into the engine's pages at run time and serve it (api-loaded), or api-error: 400 not a
        several-model engine or loaded already, 404 no such model, 413 its weights' pages are not free now or
        it does not fit the pages (the numbers in the message)."""
        task = asyncio.ensure_future(self._load(request_id, model))
        self._tasks[request_id] = task
        return task

    async def _load(self, request_id: str, model: str) -> None:
        try:
            if self.loader is None:
                raise ApiError(400, "this engine does not load models at run time", "model")
            try:
                template = await self.loader(self.engine, model)
            except LookupError as exc:
                raise ApiError(400, str(exc), "model") from None
            except FileNotFoundError as exc:
                raise ApiError(404, str(exc), "model") from None
            except (NeverFits, ValueError) as exc:
                raise ApiError(413, str(exc), "model") from None
            self.add_model(model, template)
            self.post("api-loaded", id=request_id, model=model)
        except ApiError as exc:
            self.post("api-error", id=request_id, status=exc.status, error=exc.body())
        finally:
            self._tasks.pop(request_id, None)

    def stats(self) -> dict:
        """Each model's LLMEngine.stats and, with several, the shared pool's pages."""
        out = {name: self.engine.stats(service.model) for name, service in self.services.items()}
        pool = self.engine.pool_stats()
        if pool is not None:
            out["pool"] = pool
        return out

    def deliver(self, outputs) -> list:
        """Route this step's outputs of API requests to their streams; returns the rest (the chats')."""
        return self.services.deliver(outputs)

    def fail(self, exc: Exception) -> None:
        """The step loop died: every request pagedkv.js sent ends with an api-error. The chats' turns wait: a
        step dies with a lost GPU device before its `lost` event comes, and they resume on the rebuilt one."""
        for service in self.services.values():
            service.fail(exc, self._tasks)

    def keep_only(self, request_ids) -> None:
        """After a rebuild of the backend (a lost GPU device): abort the requests the new pool did not take back."""
        for request_id in list(self._tasks):
            if request_id not in request_ids:
                self.abort(request_id)
