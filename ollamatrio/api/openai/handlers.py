"""Handlers of the OpenAI-compatible ``/v1`` routes that answer in one piece, and the
OpenAI error shape of every ``/v1`` route.

A dialect over the typed core, as Ollama's ``middleware/openai.go`` is over its native API:
each OpenAI body becomes one of the core's requests (:mod:`.wire`), goes through the
same model checks, option merging, lease and engine stream as every dialect
(:mod:`.pipeline`; generations in :mod:`.routes`), and the core's answers are rendered as
OpenAI objects or server-sent events.
"""

from __future__ import annotations

from typing import Any

from quart import Response, request

from ...wire import SSE, SSE_DONE
from .. import pipeline, rerank_wire
from ..answers import v1_json_response
from ..bodies import read_json
from ..models import ApiContext
from ..plan import Plan, plan_generation
from ..table import Views, views_of
from . import wire
from .stream import ChatEvents, CompletionEvents


class OpenAiApi:
    """The ``/v1`` routes, bound to one :class:`ApiContext`."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def views(self) -> Views:
        return views_of(
            ("POST", "/v1/embeddings", self.embeddings),
            ("POST", "/v1/rerank", self.rerank),
            ("GET", "/v1/models", self.list_models),
            ("GET", "/v1/models/<path:model>", self.retrieve_model),
        )

    # -- embeddings -------------------------------------------------------------------

    async def embeddings(self) -> Response:
        req = wire.embedding_request(await read_json(request.body))
        done = await pipeline.embed(self.ctx, req.core)
        return v1_json_response(
            wire.embedding_list(
                req.core.model, done.vectors, done.prompt_eval_count, req.encoding_format
            )
        )

    async def rerank(self) -> Response:
        req = rerank_wire.rerank_request(await read_json(request.body))
        done = await pipeline.rerank(self.ctx, req)
        return v1_json_response(rerank_wire.v1_answer(req, done))

    # -- models -----------------------------------------------------------------------

    async def list_models(self) -> Response:
        models = await self.ctx.list_models()
        data = [wire.model_object(m.short_name, m.modified_at, m.name.namespace) for m in models]
        return v1_json_response({"object": "list", "data": data})

    async def retrieve_model(self, model: str) -> Response:
        found = await self.ctx.resolve(model)
        return v1_json_response(wire.model_object(model, found.modified_at, found.name.namespace))


# -- the streamed routes (api/routes.py writes their plans) ---------------------------


def _v1_answer(obj: dict[str, Any], stream: bool) -> Response:
    """A ``/v1`` object answered at once: JSON, or one event and ``[DONE]`` to a stream."""
    if stream:
        return Response(wire.sse_event(obj) + SSE_DONE, content_type=SSE)
    return v1_json_response(obj)


async def completions(ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
    call = wire.completion_request(body)
    model = call.core.model
    return await plan_generation(
        ctx, call.core, started, native=False,
        encoder=CompletionEvents(model, call.include_usage),
        render=lambda answer: wire.text_completion(model, answer),
        unloaded=lambda: _v1_answer(wire.unloaded_completion(model), call.core.stream),
    )  # fmt: skip


async def chat_completions(ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
    call = wire.chat_request(body)
    model = call.core.model
    return await plan_generation(
        ctx, call.core, started, native=False,
        encoder=ChatEvents(model, call.include_usage),
        render=lambda answer: wire.chat_completion(model, answer),
    )  # fmt: skip
