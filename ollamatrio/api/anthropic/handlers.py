"""The Anthropic routes, ``POST /v1/messages`` and ``/v1/messages/count_tokens``: a body
translated (:mod:`.wire`) and planned (:mod:`..plan`), a message streamed as Anthropic's
events (:mod:`.stream`) or folded into one message object."""

from __future__ import annotations

from typing import Any

from .. import pipeline
from ..answers import v1_json_response
from ..models import ApiContext
from ..plan import Plan, plan_generation
from . import wire
from .stream import MessageEvents


async def messages(ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
    call = wire.messages_request(body)
    model = call.core.model
    encoder = MessageEvents(model)
    return await plan_generation(
        ctx, call.core, started, native=False, encoder=encoder,
        render=lambda answer: wire.message_object(model, answer, encoder.id),
    )  # fmt: skip


async def count_tokens(ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
    req = wire.count_tokens_request(body)
    tokens = await pipeline.count_tokens(ctx, req)
    return Plan(response=v1_json_response({"input_tokens": tokens}))
