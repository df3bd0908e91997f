"""Handlers of the OpenAI-compatible ``/v1`` routes that answer in one piece, and the
OpenAI error shape of every ``/v1`` route.

A dialect over the typed core, as Ollama's ``middleware/openai.go`` is over its native API:
each OpenAI body becomes one of the core's requests (:mod:`.openai_wire`), goes through the
same model checks, option merging, lease and engine stream as every dialect
(:mod:`.pipeline`; generations in :mod:`.routes`), and the core's answers are rendered as
OpenAI objects or server-sent events.
"""

from __future__ import annotations

from quart import Quart, Response, request

from .. import pipeline
from ..answers import v1_json_response
from ..models import ApiContext
from ..requests import read_json
from . import wire
from .errors import Handler, openai_errors


class OpenAiApi:
    """The ``/v1`` routes, bound to one :class:`ApiContext`."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def register(self, app: Quart) -> None:
        routes: list[tuple[str, Handler, list[str]]] = [
            ("/v1/embeddings", self.embeddings, ["POST"]),
            ("/v1/models", self.list_models, ["GET"]),
            # Names hold ":" and "/" (namespace/model:tag): the path converter takes both.
            ("/v1/models/<path:model>", self.retrieve_model, ["GET"]),
        ]
        for path, handler, methods in routes:
            app.add_url_rule(
                path, f"openai_{handler.__name__}", openai_errors(handler), methods=methods
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

    # -- models -----------------------------------------------------------------------

    async def list_models(self) -> Response:
        models = await self.ctx.list_models()
        data = [wire.model_object(m.short_name, m.modified_at, m.name.namespace) for m in models]
        return v1_json_response({"object": "list", "data": data})

    async def retrieve_model(self, model: str) -> Response:
        found = await self.ctx.resolve(model)
        return v1_json_response(wire.model_object(model, found.modified_at, found.name.namespace))
