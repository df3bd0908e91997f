"""Handlers of Ollama's native ``/api`` routes that answer in one piece, and the checks and
completion requests the generation routes (api/routes.py) share.

A request is parsed (``requests``), its model resolved and checked (``models``), then
answered.  The streams (generation, pull and create progress) are served as plain ASGI in
api/routes.py, each owning its source for exactly as long as it writes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import trio
from quart import Quart, Response, request

from .._version import __version__
from ..errors import InvalidRequestError, ModelNotFoundError, QueueFullError
from ..gguf import GGUFInfo
from ..scheduler import ModelRequest
from ..store import Model, parse_digest
from ..template.gotemplate import is_go_template, parse, render_prompt
from ..types import CompletionRequest
from ..wire import json_bytes, ns, rfc3339, rfc3339_from_timestamp
from .models import ApiContext, capabilities, require, show
from .requests import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    get_bool,
    get_model,
    get_str,
    merge_options,
    read_json,
)

log = logging.getLogger(__name__)

_BLOB_BATCH = 1 << 20  # bytes handed to the writer thread at a time


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(json_bytes(obj), status=status, content_type="application/json")


def empty_response(status: int = 200) -> Response:
    return Response(b"", status=status)


def refuse_when_queue_full(ctx: ApiContext) -> None:
    """Refuse a request that could only join a full queue before it does any work of its own
    (resolving the name, reading headers, rendering templates), so that every request of a
    burst over ``OLLAMA_MAX_QUEUE`` gets its 503 at once.  The scheduler's own check at
    admission still decides for the requests that pass this one."""
    waiting = ctx.scheduler.waiting
    if waiting > 0 and waiting >= ctx.scheduler.settings.max_queue:
        raise QueueFullError()


def _images_present(req: GenerateRequest | ChatRequest) -> bool:
    return bool(req.images) if isinstance(req, GenerateRequest) else req.images


# -- handlers --------------------------------------------------------------------------


class OllamaApi:
    """The native routes, bound to one :class:`ApiContext`."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def register(self, app: Quart) -> None:
        routes: list[tuple[str, Callable[..., Any], list[str]]] = [
            ("/", self.root, ["GET", "HEAD"]),
            ("/api/version", self.version, ["GET", "HEAD"]),
            ("/api/embed", self.embed, ["POST"]),
            ("/api/embeddings", self.embeddings, ["POST"]),
            ("/api/tags", self.tags, ["GET", "HEAD"]),
            ("/api/show", self.show, ["POST"]),
            ("/api/ps", self.ps, ["GET"]),
            ("/api/copy", self.copy, ["POST"]),
            ("/api/delete", self.delete, ["DELETE"]),
            ("/api/blobs/<digest>", self.blob_head, ["HEAD"]),
            ("/api/blobs/<digest>", self.blob_upload, ["POST"]),
        ]
        for path, handler, methods in routes:
            endpoint = f"{handler.__name__}_{'_'.join(methods).lower()}"
            app.add_url_rule(path, endpoint, handler, methods=methods)

    # -- liveness ---------------------------------------------------------------------

    async def root(self) -> Response:
        return Response("Ollama is running", content_type="text/plain; charset=utf-8")

    async def version(self) -> Response:
        return json_response({"version": __version__})

    # -- generation -------------------------------------------------------------------

    async def prepare(
        self, req: GenerateRequest | ChatRequest, label: str
    ) -> tuple[ModelRequest, Model, GGUFInfo] | Response:
        """Resolve and check the model; answer unload requests at once (B23).  Returns the
        scheduler's request, the stored model and its GGUF header."""
        empty = not req.prompt if isinstance(req, GenerateRequest) else not req.messages
        if not (empty and req.keep_alive == 0):
            refuse_when_queue_full(self.ctx)
        model = await self.ctx.resolve(req.model)
        if empty and req.keep_alive == 0:
            assert model.model_path is not None
            self.ctx.scheduler.unload(str(model.model_path))
            return json_response(self._done(req, "unload"))
        assert model.model_path is not None
        info = await self.ctx.gguf(str(model.model_path))
        caps = capabilities(model, info)
        require(req.model, caps, "completion", label)
        if _images_present(req):
            require(req.model, caps, "vision", "vision: it has no projector (mmproj)")
        if req.think:
            require(req.model, caps, "thinking")
        if isinstance(req, ChatRequest) and req.tools:
            require(req.model, caps, "tools")
        options = merge_options(model.params, req.options)
        model_request = self.ctx.model_request(
            model, options, req.keep_alive, caps, shift=req.shift
        )
        return model_request, model, info

    @staticmethod
    def _done(req: GenerateRequest | ChatRequest, reason: str) -> dict[str, Any]:
        out: dict[str, Any] = {"model": req.model, "created_at": rfc3339()}
        if isinstance(req, GenerateRequest):
            out["response"] = ""
        else:
            out["message"] = {"role": "assistant", "content": ""}
        out.update(done=True, done_reason=reason)
        return out

    # -- embeddings -------------------------------------------------------------------

    async def embed_inputs(
        self, name: str, inputs: tuple[str, ...], options: Mapping[str, Any],
        keep_alive: float | None, *, truncate: bool = True, dimensions: int | None = None,
    ) -> tuple[list[list[float]], int, float, float]:  # fmt: skip
        """(vectors, prompt tokens, load seconds, total seconds); empty input only loads."""
        started = trio.current_time()
        refuse_when_queue_full(self.ctx)
        model = await self.ctx.resolve(name)
        caps = await self.ctx.capabilities(model)
        merged = merge_options(model.params, options)
        # Any model can embed: a chat model gets a runner of its own in embedding mode.
        model_request = self.ctx.model_request(model, merged, keep_alive, caps, embedding=True)
        metrics = self.ctx.metrics
        async with self.ctx.scheduler.lease(model_request) as lease:
            if metrics is not None:
                metrics.lease_taken(lease)
            if not inputs:
                return [], 0, lease.load_duration, trio.current_time() - started
            result = await lease.engine.embed(inputs, truncate=truncate, dimensions=dimensions)
        if metrics is not None:
            metrics.tokens_counted(lease.runner.name, result.prompt_eval_count)
        return (
            result.vectors,
            result.prompt_eval_count,
            lease.load_duration,
            trio.current_time() - started,
        )

    async def embed(self) -> Response:
        req = EmbedRequest.parse(await read_json(request.body))
        vectors, count, load, total = await self.embed_inputs(
            req.model, req.inputs, req.options, req.keep_alive,
            truncate=req.truncate, dimensions=req.dimensions,
        )  # fmt: skip
        return json_response(
            {
                "model": req.model,
                "embeddings": vectors,
                "total_duration": ns(total),
                "load_duration": ns(load),
                "prompt_eval_count": count,
            }
        )

    async def embeddings(self) -> Response:
        req = EmbeddingsRequest.parse(await read_json(request.body))
        inputs = (req.prompt,) if req.prompt else ()
        vectors, *_ = await self.embed_inputs(req.model, inputs, req.options, req.keep_alive)
        return json_response({"embedding": vectors[0] if vectors else []})

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
                    }
                    for info in self.ctx.scheduler.ps()
                ]
            }
        )

    async def copy(self) -> Response:
        body = await read_json(request.body)
        source, destination = get_str(body, "source"), get_str(body, "destination")
        if not source or not destination:
            raise InvalidRequestError("source and destination are required")
        await trio.to_thread.run_sync(self.ctx.store.copy, source, destination)
        return empty_response()

    async def delete(self) -> Response:
        name = get_model(await read_json(request.body))
        await trio.to_thread.run_sync(self.ctx.store.delete, name)
        return empty_response()

    # -- blobs ------------------------------------------------------------------------

    async def blob_head(self, digest: str) -> Response:
        digest = parse_digest(digest)
        present = await trio.to_thread.run_sync(self.ctx.store.has_blob, digest)
        return empty_response(200 if present else 404)

    async def blob_upload(self, digest: str) -> Response:
        """Stream the body to disk, hashing as it goes: 201 new, 200 present, 400 mismatch."""
        store = self.ctx.store
        try:
            digest = parse_digest(digest)
            present = await trio.to_thread.run_sync(store.has_blob, digest)
        except InvalidRequestError:
            await _discard(request.body)
            raise
        if present:
            # An unread body would stall the connection for the client's next request.
            await _discard(request.body)
            return empty_response(200)
        writer = await trio.to_thread.run_sync(store.blob_writer, digest)
        try:
            batch = bytearray()
            async for chunk in request.body:
                batch += chunk
                if len(batch) >= _BLOB_BATCH:
                    await trio.to_thread.run_sync(writer.write, bytes(batch))
                    batch.clear()
            await trio.to_thread.run_sync(writer.write, bytes(batch))
            await trio.to_thread.run_sync(writer.commit)
        finally:
            if writer.digest is None:
                writer.abort()  # removes the temporary file (a quick unlink)
        return empty_response(201 if writer.created else 200)


async def _discard(body: AsyncIterator[bytes]) -> None:
    async for _ in body:
        pass


def go_template(model: Model, info: GGUFInfo, requested: str = "") -> str | None:
    """The Go template to render the prompt with here, as Ollama does, or None to let
    llama.cpp apply the GGUF's Jinja template: the request's own ``template``, or a Go
    template layer on a GGUF (``info``) that has no chat template of its own."""
    if requested:
        return requested
    if not is_go_template(model.template):
        return None
    return model.template if not info.chat_template else None


def generate_completion(
    req: GenerateRequest, model: Model, info: GGUFInfo, options: Mapping[str, Any]
) -> CompletionRequest:
    """What /api/generate (and /v1/completions) asks of the engine: a raw prompt, a
    prompt rendered with a Go template, or the prompt as chat messages so that the
    model's own template applies."""
    template = None if req.raw or req.images else go_template(model, info, req.template)
    if template is not None and (not req.suffix or "suffix" in parse(template).vars):
        messages = () if req.suffix else _generate_messages(req, model)
        prompt = render_prompt(
            template, messages, think=req.think, prompt=req.prompt, suffix=req.suffix
        )
        completion = CompletionRequest(prompt=prompt)
    elif req.raw or req.suffix:
        completion = CompletionRequest(prompt=req.prompt, suffix=req.suffix or None)
    else:
        completion = CompletionRequest(messages=_generate_messages(req, model))
    return with_common(completion, req, options)


def _generate_messages(req: GenerateRequest, model: Model) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = req.system or model.system
    if system:
        messages.append({"role": "system", "content": system})
    if not req.context:
        messages.extend(dict(m) for m in model.messages)
    user: dict[str, Any] = {"role": "user", "content": req.prompt}
    if req.images:
        user["images"] = list(req.images)
    messages.append(user)
    return messages


def chat_completion(
    req: ChatRequest, model: Model, info: GGUFInfo, options: Mapping[str, Any]
) -> CompletionRequest:
    """What /api/chat (and /v1/chat/completions) asks of the engine.  Tool calling and
    images stay on llama.cpp's messages path."""
    messages: list[dict[str, Any]] = []
    if model.system and req.messages[0].get("role") != "system":
        messages.append({"role": "system", "content": model.system})
    messages.extend(dict(m) for m in model.messages)
    messages.extend(req.messages)
    template = None if req.tools or req.images else go_template(model, info)
    if template is not None:
        prompt = render_prompt(template, messages, think=req.think)
        return with_common(CompletionRequest(prompt=prompt), req, options)
    return with_common(
        CompletionRequest(messages=messages, tools=list(req.tools) or None), req, options
    )


def with_common(
    completion: CompletionRequest, req: GenerateRequest | ChatRequest, options: Mapping[str, Any]
) -> CompletionRequest:
    return CompletionRequest(
        prompt=completion.prompt,
        messages=completion.messages,
        suffix=completion.suffix,
        options=options,
        format=req.format,
        tools=completion.tools,
        think=req.think,
        images=req.images if isinstance(req, GenerateRequest) and completion.prompt else (),
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs,
        truncate=req.truncate,
        # Ollama returns the token context on /api/generate except in raw mode.
        context=req.context if isinstance(req, GenerateRequest) else (),
        return_context=isinstance(req, GenerateRequest) and not req.raw,
    )
