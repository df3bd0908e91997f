"""The steps every dialect's requests take once translated into the core's typed records:
the queue check, the model and its capabilities, the merged options, and embeddings.

A dialect only translates (``native_wire``, ``openai_wire``); what a request needs of the
store and the scheduler is decided here, the same for all of them.  Generations then run
in the routes (:mod:`.routes`), their completion request built by
:mod:`ollamatrio.generation.completion`.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from ..errors import QueueFullError
from ..generation.completion import chat_completion
from ..generation.images import runner_images
from ..generation.requests import ChatRequest, EmbedRequest, GenerateRequest, RerankRequest
from ..gguf import GGUFInfo
from ..scheduler import ModelRequest
from ..store import Model
from .bodies import merge_options
from .chain import current_request
from .models import ApiContext, capabilities, require, require_for_runner, require_loadable
from .priority import estimated_cost


def refuse_when_queue_full(ctx: ApiContext) -> None:
    """Refuse a request that could only join a full queue before it does any work of its own
    (resolving the name, reading headers, rendering templates), so that every request of a
    burst over ``OLLAMA_MAX_QUEUE`` gets its 503 at once.  The scheduler's own check at
    admission still decides for the requests that pass this one."""
    waiting = ctx.scheduler.waiting
    if waiting > 0 and waiting >= ctx.scheduler.settings.max_queue:
        raise QueueFullError()


@dataclass(frozen=True)
class Prepared:
    """A generation request's model, checked: what the scheduler is asked for, the stored
    model and its GGUF header, and the request as the runner takes it (its images each in
    a format the runner decodes)."""

    model_request: ModelRequest
    model: Model
    info: GGUFInfo
    request: GenerateRequest | ChatRequest


def unloads(req: GenerateRequest | ChatRequest) -> bool:
    """An empty request with ``keep_alive`` 0 only unloads its model, as in Ollama."""
    empty = not req.prompt if isinstance(req, GenerateRequest) else not req.messages
    return empty and req.keep_alive == 0


async def prepare(ctx: ApiContext, req: GenerateRequest | ChatRequest) -> Prepared | None:
    """Resolve and check the model for ``req``; None when the request only unloaded it
    (:func:`unloads`): an idle model is gone (off ``/api/ps``) when this returns, a busy
    one finishes its requests first."""
    if not unloads(req):
        refuse_when_queue_full(ctx)
    model = await ctx.resolve(req.model)
    assert model.model_path is not None
    if unloads(req):
        await ctx.scheduler.stop(str(model.model_path))
        return None
    info = await ctx.gguf(str(model.model_path))
    require_loadable(req.model, info)
    caps = capabilities(model, info)
    require(req.model, caps, "completion", "chat" if isinstance(req, ChatRequest) else "generate")
    if req.has_images:
        require(req.model, caps, "vision")
        req = await runner_images(req)
    if req.think:
        require(req.model, caps, "thinking")
    if isinstance(req, ChatRequest) and req.tools:
        require_for_runner(model, caps, "tools")
    if isinstance(req, GenerateRequest) and req.suffix:
        require_for_runner(model, caps, "insert")
    options = merge_options(model.params, req.options)
    model_request = ctx.model_request(
        model, options, req.keep_alive, caps, shift=req.shift, cost=estimated_cost(req)
    )
    return Prepared(model_request, model, info, req)


async def count_tokens(ctx: ApiContext, req: ChatRequest) -> int:
    """The tokens ``req``'s conversation would give its model, counted by the loaded model's
    own template and tokenizer (the measure truncation uses); loads the model if needed."""
    prepared = await prepare(ctx, req)
    assert prepared is not None  # a conversation is never an unload request
    ready = prepared.request  # its images as the runner takes them
    assert isinstance(ready, ChatRequest)
    options = prepared.model_request.options
    completion = chat_completion(ready, prepared.model, prepared.info, options)
    async with ctx.scheduler.lease(prepared.model_request) as lease:
        if ctx.metrics is not None:
            ctx.metrics.lease_taken(lease)
        return await lease.engine.count_tokens(completion)


@dataclass(frozen=True)
class Embedded:
    """An embedding request's result."""

    vectors: list[list[float]]
    prompt_eval_count: int
    load_duration: float  # seconds
    total_duration: float  # seconds


async def embed(ctx: ApiContext, req: EmbedRequest) -> Embedded:
    """Embed ``req.inputs``; no inputs only loads the model.  The tokens are counted in
    the metrics, and in the request chain's record of the request (the key's usage)."""
    started = trio.current_time()
    refuse_when_queue_full(ctx)
    model = await ctx.resolve(req.model, scheduled=True)
    assert model.model_path is not None
    info = await ctx.gguf(str(model.model_path))
    require_loadable(req.model, info)
    caps = capabilities(model, info)
    merged = merge_options(model.params, req.options)
    # Any model can embed: a chat model's runner is loaded (or reloaded) in embedding mode.
    model_request = ctx.model_request(
        model, merged, req.keep_alive, caps, embedding=True, cost=estimated_cost(req)
    )
    metrics = ctx.metrics
    async with ctx.scheduler.lease(model_request) as lease:
        if metrics is not None:
            metrics.lease_taken(lease)
        if not req.inputs:
            return Embedded([], 0, lease.load_duration, trio.current_time() - started)
        result = await lease.engine.embed(
            req.inputs, truncate=req.truncate, dimensions=req.dimensions
        )
    if metrics is not None:
        metrics.tokens_counted(lease.runner.name, result.prompt_eval_count)
    if (state := current_request()) is not None:
        state.tokens_used(result.prompt_eval_count)
    return Embedded(
        result.vectors,
        result.prompt_eval_count,
        lease.load_duration,
        trio.current_time() - started,
    )


@dataclass(frozen=True)
class Reranked:
    """A rerank request's result: ``(document index, score)`` pairs, best first, cut to
    the request's ``top_n``."""

    ranked: list[tuple[int, float]]
    prompt_eval_count: int
    load_duration: float  # seconds
    total_duration: float  # seconds


async def rerank(ctx: ApiContext, req: RerankRequest) -> Reranked:
    """Score ``req.documents`` against ``req.query`` with a reranker; no documents only
    loads the model.  Scheduled as embeddings are (the model's runner, loaded in embedding
    mode with its rank pooling); a model that is no reranker is a 400."""
    started = trio.current_time()
    refuse_when_queue_full(ctx)
    model = await ctx.resolve(req.model, scheduled=True)
    assert model.model_path is not None
    info = await ctx.gguf(str(model.model_path))
    require_loadable(req.model, info)
    caps = capabilities(model, info)
    require(req.model, caps, "rerank")
    merged = merge_options(model.params, req.options)
    model_request = ctx.model_request(
        model, merged, req.keep_alive, caps, embedding=True, cost=estimated_cost(req)
    )
    metrics = ctx.metrics
    async with ctx.scheduler.lease(model_request) as lease:
        if metrics is not None:
            metrics.lease_taken(lease)
        if not req.documents:
            return Reranked([], 0, lease.load_duration, trio.current_time() - started)
        result = await lease.engine.rerank(req.query, req.documents)
    if metrics is not None:
        metrics.tokens_counted(lease.runner.name, result.prompt_eval_count)
    if (state := current_request()) is not None:
        state.tokens_used(result.prompt_eval_count)
    # Best first; equal scores keep the documents' order (a stable sort).
    ranked = sorted(enumerate(result.scores), key=lambda pair: -pair[1])
    return Reranked(
        ranked[: req.top_n] if req.top_n is not None else ranked,
        result.prompt_eval_count,
        lease.load_duration,
        trio.current_time() - started,
    )
