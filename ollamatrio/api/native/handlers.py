"""Handlers of Ollama's native ``/api`` routes that answer in one piece.

A body is translated (:mod:`.wire`), its model resolved and checked (:mod:`.pipeline`,
:mod:`.models`), then answered.  The streams (generation, pull and create progress) are
served as plain ASGI in api/routes.py, each owning its source for exactly as long as it
writes, and so is a blob upload (``POST /api/blobs/<digest>``, api/blob_upload.py), whose
body goes to disk as fast as the disk takes it.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from quart import Response, request

from ...errors import InvalidRequestError, ModelNotFoundError
from ...slot_cache import SlotCache
from ...store import parse_digest
from ...wire import rfc3339, rfc3339_from_timestamp
from .. import pipeline, rerank_wire
from ..answers import empty_response, json_response
from ..bodies import get_bool, get_model, get_str, read_json
from ..errors import error_response
from ..models import ApiContext, show
from ..plan import Plan, plan_generation
from ..table import Views, views_of
from . import wire
from . import wire as native_wire
from .stream import ChatLines, GenerateLines

log = logging.getLogger(__name__)


# -- handlers --------------------------------------------------------------------------


class OllamaApi:
    """The native routes, bound to one :class:`ApiContext`."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def views(self) -> Views:
        return views_of(
            ("POST", "/api/embed", self.embed),
            ("POST", "/api/embeddings", self.embeddings),
            ("POST", "/api/rerank", self.rerank),
            ("GET HEAD", "/api/tags", self.tags),
            ("POST", "/api/show", self.show),
            ("GET", "/api/ps", self.ps),
            ("POST", "/api/copy", self.copy),
            ("DELETE", "/api/delete", self.delete),
            ("HEAD", "/api/blobs/<digest>", self.blob_head),
        )

    # -- embeddings -------------------------------------------------------------------

    async def embed(self) -> Response:
        req = native_wire.embed_request(await read_json(request.body))
        done = await pipeline.embed(self.ctx, req)
        return json_response(native_wire.embed_answer(req.model, done))

    async def embeddings(self) -> Response:
        req = native_wire.embeddings_request(await read_json(request.body))
        done = await pipeline.embed(self.ctx, req)
        return json_response(native_wire.embeddings_answer(done))

    async def rerank(self) -> Response:
        req = rerank_wire.rerank_request(await read_json(request.body))
        done = await pipeline.rerank(self.ctx, req)
        return json_response(rerank_wire.native_answer(req, done))

    # -- the store --------------------------------------------------------------------

    async def tags(self) -> Response:
        models = await self.ctx.list_models()
        return json_response(
            {
                "models": [
                    {
                        "name": m.short_name,
                        "model": m.short_name,
                        "modified_at": rfc3339(m.modified_at),
                        "size": m.size,
                        "digest": m.digest,
                        "details": m.details.to_json(),
                    }
                    for m in models
                ]
            }
        )

    async def show(self) -> Response:
        body = await read_json(request.body)
        name = get_model(body)
        try:
            model = await self.ctx.resolve(name)
        except ModelNotFoundError:
            raise ModelNotFoundError(f"model '{name}' not found") from None
        return json_response(await show(self.ctx, model, get_bool(body, "verbose", False)))

    async def ps(self) -> Response:
        return json_response(
            {
                "models": [
                    {
                        "name": info.name,
                        "model": info.name,
                        # As Ollama: a model with every layer on GPUs reports its VRAM as
                        # its size ("100% GPU"); host-side buffers are not counted then.
                        "size": info.size_vram if info.offloaded_fully else info.size,
                        "digest": info.digest,
                        "details": dict(info.details),
                        "expires_at": rfc3339_from_timestamp(info.expires_at),
                        "size_vram": info.size_vram,
                        "context_length": info.context_length,
                        # Ours, not Ollama's (its clients ignore them): docs/scheduling.md.
                        "state": info.state,
                        "queued": info.queued,
                        "active": info.active,
                        "slots": info.num_parallel,
                        "pinned": info.pinned,
                        # CPU threads it may use now: the cores divided among the
                        # runners that generate (docs/scheduling.md).
                        "threads": info.threads,
                        # Host RAM the runner's prompt cache holds now, beside ``size``
                        # (bytes; docs/api.md).
                        "prompt_cache": info.prompt_cache,
                    }
                    for info in self.ctx.scheduler.ps()
                ],
                # Ours (docs/fleet.md): what a new load could use per device, for a fleet's
                # gateway; Ollama's clients ignore keys they do not know.
                "free_memory": [
                    {"device": device, "free": free}
                    for device, free in await self.ctx.scheduler.free_memory()
                ],
                # Ours: each device's size and what placement keeps back on it, for the
                # console's device bars (docs/console.md).
                "devices": [
                    {"device": device, "name": name, "total": total, "reserve": reserve}
                    for device, name, total, reserve in await self.ctx.scheduler.device_totals()
                ],
            }
        )

    async def copy(self) -> Response:
        body = await read_json(request.body)
        source, destination = get_str(body, "source"), get_str(body, "destination")
        # Ollama's words (CopyHandler): an empty name is an invalid one.
        if not source:
            raise InvalidRequestError('source "" is invalid')
        if not destination:
            raise InvalidRequestError('destination "" is invalid')
        await trio.to_thread.run_sync(self.ctx.store.copy, source, destination)
        return empty_response()

    async def delete(self) -> Response:
        name = get_model(await read_json(request.body))
        await trio.to_thread.run_sync(self.ctx.store.delete, name)
        settings = self.ctx.settings
        cache = SlotCache(settings.prompt_disk_cache_dir, settings.prompt_disk_cache)
        try:  # the saved prompt states of a model whose file went with it
            await trio.to_thread.run_sync(cache.forget_missing)
        except OSError as exc:
            log.warning("prompt cache: could not drop a deleted model's states: %s", exc)
        return empty_response()

    # -- blobs ------------------------------------------------------------------------

    async def blob_head(self, digest: str) -> Response:
        digest = parse_digest(digest)
        present = await trio.to_thread.run_sync(self.ctx.store.has_blob, digest)
        # As Ollama: a JSON error (its body dropped, this being HEAD) when it is absent.
        return empty_response() if present else error_response(f'blob "{digest}" not found', 404)


# -- the streamed routes (api/routes.py writes their plans) ---------------------------


async def generate(ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
    req = wire.generate_request(body)
    lines = GenerateLines(req.model)
    return await plan_generation(
        ctx, req, started, native=True, encoder=lines, load_line=lines.load_line,
        render=lambda answer: wire.generate_answer(req.model, answer),
    )  # fmt: skip


async def chat(ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
    req = wire.chat_request(body)
    lines = ChatLines(req.model)
    return await plan_generation(
        ctx, req, started, native=True, encoder=lines, load_line=lines.load_line,
        render=lambda answer: wire.chat_answer(req.model, answer),
    )  # fmt: skip
