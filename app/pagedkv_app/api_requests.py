"""pagedkv.js's requests in the worker: OpenAI Chat Completions (pagedkv.api.CompletionService) on the chat
service's engine and step loop. The chat service routes `api-request` / `api-abort` here and hands every step's
outputs to `deliver` first; each request answers with `api-chunk`s and `api-end`, or one `api-error` (status,
OpenAI's error JSON). docs/api.md, and the protocol table in docs/architecture.md."""
from __future__ import annotations

import asyncio

from pagedkv.api import ApiError, CompletionService
from pagedkv.chat import ChatTemplate
from pagedkv.engine import LLMEngine


class ApiRequests:
    """The requests pagedkv.js sent, each a task streaming its chunks to the page through `post`."""

    def __init__(self, engine: LLMEngine, template: ChatTemplate, model_name: str, kick, post) -> None:
        self.service = CompletionService(engine, template, model_name, engine.context_length, kick)
        self.post = post
        self._tasks: dict[str, asyncio.Future] = {}

    def request(self, request_id: str, body) -> asyncio.Future:
        """Start one request; its task ends when its stream does (also when it is refused or aborted)."""
        task = asyncio.ensure_future(self._stream(request_id, body))
        self._tasks[request_id] = task
        return task

    async def _stream(self, request_id: str, body) -> None:
        try:
            async for piece in await self.service.stream(body, request_id=request_id):
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
        self.service.abort(request_id)

    def deliver(self, outputs) -> list:
        """Route this step's outputs of API requests to their streams; returns the rest (the chats')."""
        return self.service.deliver(outputs)

    def fail(self, exc: Exception) -> None:
        """The step loop died: every API request ends with an api-error."""
        self.service.fail(exc)

    def keep_only(self, request_ids) -> None:
        """After a rebuild of the backend (a lost GPU device): abort the requests the new pool did not take back."""
        for request_id in list(self._tasks):
            if request_id not in request_ids:
                self.service.abort(request_id)
