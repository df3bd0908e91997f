"""Handlers of the OpenAI-compatible ``/v1`` routes.

A translation layer, as Ollama's ``middleware/openai.go`` is: each OpenAI body becomes a
native request record (:mod:`.openai_wire`, then the native parsers), goes through the same
model checks, option merging, lease and engine stream as ``/api/chat`` and
``/api/generate`` (:mod:`.ollama_api`), and the native objects that come out are rewritten
as OpenAI objects or server-sent events.  Errors on these routes have OpenAI's shape.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import trio
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

from ..errors import OllamatrioError
from ..scheduler import ModelRequest
from ..store import Model
from . import openai_wire as wire
from .errors import error_headers, message_for, status_for
from .models import ApiContext
from .ollama_api import (
    OllamaApi,
    chat_completion,
    chat_line,
    completion_events,
    generate_completion,
    generate_line,
    json_response,
)
from .requests import ChatRequest, GenerateRequest, get_model, read_json
from .wire import ChatAggregate, GenerateAggregate, json_bytes, prime

log = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[Response]]


def openai_error_response(exc: BaseException) -> Response:
    """The OpenAI-shaped error response for ``exc`` (statuses as on the native routes)."""
    status = status_for(exc)
    if status >= 500 and not isinstance(exc, OllamatrioError | HTTPException):
        log.error("unexpected error while handling a request", exc_info=exc)
    elif status >= 500:
        log.warning("request failed: %s", exc)
    return Response(
        json_bytes(wire.error_object(message_for(exc), status)),
        status=status,
        content_type="application/json",
        headers=error_headers(status),
    )


def openai_errors(handler: Handler) -> Handler:
    """Answer any error raised by ``handler`` (before its body streams) in OpenAI's shape."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Response:
        try:
            return await handler(*args, **kwargs)
        except Exception as exc:  # trio.Cancelled is a BaseException: it passes
            return openai_error_response(exc)

    return wrapper


async def fold(
    events: AsyncIterator[dict[str, Any]], aggregate: ChatAggregate | GenerateAggregate
) -> dict[str, Any]:
    """Run a native event stream to its end and return the one folded object."""
    async with aclosing(events):  # type: ignore[type-var]
        async for obj in events:
            aggregate.add(obj)
    return aggregate.result()


async def stream(
    events: AsyncIterator[dict[str, Any]], translate: Callable[[dict[str, Any]], list[Any]]
) -> Response:
    """SSE response; errors before the first native object keep their own status."""
    primed = await prime(events)
    if primed is None:
        return Response(wire.SSE_DONE, content_type=wire.SSE)
    return Response(
        wire.sse_body(primed, translate),
        content_type=wire.SSE,
        headers={"Cache-Control": "no-cache"},
    )


class OpenAiApi:
    """The ``/v1`` routes, bound to one :class:`ApiContext`."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self._native = OllamaApi(ctx)

    def register(self, app: Quart) -> None:
        routes: list[tuple[str, Handler, list[str]]] = [
            ("/v1/chat/completions", self.chat_completions, ["POST"]),
            ("/v1/completions", self.completions, ["POST"]),
            ("/v1/embeddings", self.embeddings, ["POST"]),
            ("/v1/models", self.list_models, ["GET"]),
            # Names hold ":" and "/" (namespace/model:tag): the path converter takes both.
            ("/v1/models/<path:model>", self.retrieve_model, ["GET"]),
        ]
        for path, handler, methods in routes:
            app.add_url_rule(
                path, f"openai_{handler.__name__}", openai_errors(handler), methods=methods
            )

    # -- generation -------------------------------------------------------------------

    async def _prepare(
        self, req: ChatRequest | GenerateRequest, label: str
    ) -> tuple[ModelRequest, Model]:
        """The native checks: model, capabilities (vision, thinking, tools), options."""
        prepared = await self._native.prepare(req, label)
        # Only an unload request (keep_alive 0, which /v1 cannot send) answers at once.
        assert not isinstance(prepared, Response)
        model_request, model, _caps = prepared
        return model_request, model

    async def chat_completions(self) -> Response:
        body = await read_json(request.body)
        req = ChatRequest.parse(wire.chat_body(body))
        usage = wire.include_usage(body)
        model_request, model = await self._prepare(req, "chat")
        completion = chat_completion(req, model, model_request.options)
        events = completion_events(
            self.ctx,
            model_request,
            completion,
            functools.partial(chat_line, req.model),
            inline_errors=req.stream,
        )
        if req.stream:
            return await stream(events, wire.ChatChunks(req.model, usage))
        result = await fold(events, ChatAggregate())
        return json_response(wire.chat_completion(req.model, result))

    async def completions(self) -> Response:
        body = await read_json(request.body)
        req = GenerateRequest.parse(wire.completion_body(body))
        usage = wire.include_usage(body)
        model_request, model = await self._prepare(req, "generate")
        completion = generate_completion(req, model, model_request.options)
        events = completion_events(
            self.ctx,
            model_request,
            completion,
            functools.partial(generate_line, req.model),
            inline_errors=req.stream,
        )
        if req.stream:
            return await stream(events, wire.CompletionChunks(req.model, usage))
        result = await fold(events, GenerateAggregate())
        return json_response(wire.text_completion(req.model, result))

    # -- embeddings -------------------------------------------------------------------

    async def embeddings(self) -> Response:
        body = await read_json(request.body)
        name = get_model(body)
        inputs = wire.embedding_inputs(body)
        fmt = wire.encoding_format(body)
        vectors, count, _load, _total = await self._native.embed_inputs(
            name, inputs, {}, None, dimensions=wire.dimensions(body)
        )
        return json_response(wire.embedding_list(name, vectors, count, fmt))

    # -- models -----------------------------------------------------------------------

    async def list_models(self) -> Response:
        models = await self.ctx.list_models()
        data = [wire.model_object(m.short_name, m.modified_at, m.name.namespace) for m in models]
        return json_response({"object": "list", "data": data})

    async def retrieve_model(self, model: str) -> Response:
        found = await trio.to_thread.run_sync(self.ctx.store.resolve, model)
        return json_response(wire.model_object(model, found.modified_at, found.name.namespace))
