"""What a streamed route decides before it writes: a :class:`Plan`, made by the dialect's
handler (each dialect's ``handlers.py``) and carried out by :mod:`.routes`.

:func:`plan_generation` is the part every dialect shares: the model, capability and option
checks (:mod:`.pipeline`), then the generation to run, streamed with the dialect's encoder or
folded and rendered with its ``render``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from quart import Response

from ..generation.answer import Answer
from ..generation.completion import chat_completion, generate_completion
from ..generation.load_lines import LoadAnnouncement, LoadLine
from ..generation.relay import Encoder, Generation, open_generation
from ..generation.requests import ChatRequest, GenerateRequest
from . import pipeline
from .answers import json_response
from .models import ApiContext
from .native import wire as native_wire
from .progress import Progress


@dataclass
class Plan:
    """What a streamed route decided: answer at once (``response``), or run a generation
    and stream it with ``encoder`` or fold it into one answer and ``render`` that."""

    response: Response | None = None
    generation: AbstractAsyncContextManager[Generation] | None = None  # open_generation(...)
    encoder: Encoder | None = None
    render: Callable[[Answer], dict[str, Any]] | None = None  # the folded answer's object
    announce: LoadAnnouncement | None = None  # native streams: progress lines while loading
    progress: Progress | None = None  # pull, create: their progress events
    # Awaited with the folded answer once the generation is over, before the last bytes
    # are written (/v1/responses stores its response there).
    finish: Callable[[Answer], Awaitable[None]] | None = None


# A streamed route's handler: the request's context, its JSON body and when it arrived.
Planner = Callable[[ApiContext, dict[str, Any], float], Awaitable[Plan]]


async def plan_generation(
    ctx: ApiContext, req: GenerateRequest | ChatRequest, started: float, *, native: bool,
    encoder: Encoder, render: Callable[[Answer], dict[str, Any]],
    load_line: LoadLine | None = None,
    unloaded: Callable[[], Response] | None = None,
) -> Plan:  # fmt: skip
    """The dialect-neutral checks (model, capabilities, options), then the generation to
    run, streamed with the dialect's ``encoder`` or folded and rendered with its
    ``render``; a stream that must wait for a load first writes ``load_line`` lines, if
    its dialect has them.  Native routes also answer an unload (``keep_alive`` 0 and
    nothing to generate) and a load-only request (an empty prompt) at once; ``unloaded``
    answers an unload in a dialect whose requests can ask for one (an empty
    ``/v1/completions`` prompt with ``keep_alive: 0``)."""
    prepared = await pipeline.prepare(ctx, req)
    if prepared is None:
        if unloaded is not None:
            return Plan(response=unloaded())
        return Plan(response=json_response(native_wire.done_object(req, "unload")))
    model_request = prepared.model_request
    req = prepared.request  # its images as the runner takes them
    empty = not req.messages if isinstance(req, ChatRequest) else not (req.prompt or req.images)
    if native and empty:
        lease = await ctx.scheduler.load(model_request)
        if ctx.metrics is not None:
            ctx.metrics.lease_taken(lease)
        return Plan(response=json_response(native_wire.done_object(req, "load")))
    if isinstance(req, ChatRequest):
        completion = chat_completion(req, prepared.model, prepared.info, model_request.options)
    else:
        completion = generate_completion(req, prepared.model, prepared.info, model_request.options)
    generation = open_generation(ctx.scheduler, model_request, completion, started)
    if req.stream:
        announce = None
        if load_line is not None:
            announce = LoadAnnouncement(ctx.scheduler, model_request, load_line)
        return Plan(generation=generation, encoder=encoder, announce=announce)
    return Plan(generation=generation, render=render)
