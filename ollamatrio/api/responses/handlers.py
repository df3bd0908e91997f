"""The stored side of the OpenAI Responses dialect: ``GET`` and ``DELETE``
``/v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items`` (the streamed
``POST /v1/responses`` is in :mod:`.routes`), and the retention pruning that runs in the
app's nursery for as long as the app serves."""

from __future__ import annotations

import logging
from typing import Any

import trio
from quart import Response, request

from ...errors import InvalidRequestError, ResponseNotFoundError
from ...generation.answer import Answer
from ..answers import v1_json_response
from ..models import ApiContext
from ..plan import Plan, plan_generation
from ..table import Views, views_of
from . import wire
from .store import ResponseStore
from .stream import ResponseEvents

log = logging.getLogger(__name__)

#: How often expired responses are deleted while the server runs (also once at start).
PRUNE_EVERY = 3600.0


class ResponsesApi:
    """The stored-response views over ``store`` (None: nothing is ever stored, so every id
    is not found)."""

    def __init__(self, store: ResponseStore | None) -> None:
        self.store = store

    def views(self) -> Views:
        return views_of(
            ("GET", "/v1/responses/<response_id>", self.retrieve),
            ("DELETE", "/v1/responses/<response_id>", self.delete),
            ("GET", "/v1/responses/<response_id>/input_items", self.input_items),
        )

    def _store(self, response_id: str) -> ResponseStore:
        if self.store is None:
            raise ResponseNotFoundError(f"Response with id '{response_id}' not found.")
        return self.store

    async def retrieve(self, response_id: str) -> Response:
        stored = await trio.to_thread.run_sync(self._store(response_id).get, response_id)
        return v1_json_response(stored.response)

    async def delete(self, response_id: str) -> Response:
        await trio.to_thread.run_sync(self._store(response_id).delete, response_id)
        return v1_json_response(wire.deleted_object(response_id))

    async def input_items(self, response_id: str) -> Response:
        order = request.args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequestError("invalid value for 'order': expected 'asc' or 'desc'")
        try:
            limit = int(request.args.get("limit", "20"))
        except ValueError:
            raise InvalidRequestError("invalid value for 'limit': expected an integer") from None
        if not 1 <= limit <= 100:
            raise InvalidRequestError("invalid value for 'limit': must be between 1 and 100")
        stored = await trio.to_thread.run_sync(self._store(response_id).get, response_id)
        after = request.args.get("after", "")
        return v1_json_response(wire.input_items_page(stored.input, order=order, limit=limit,
                                                   after=after))  # fmt: skip


async def prune_forever(store: ResponseStore, every: float = PRUNE_EVERY) -> None:
    """Delete expired responses now and every ``every`` seconds, until cancelled (the
    app's nursery closes at shutdown)."""
    while True:
        try:
            removed = await trio.to_thread.run_sync(store.prune)
        except Exception as exc:  # a full or unreadable disk must not end the server
            log.warning("pruning stored responses failed: %s", exc)
        else:
            if removed:
                log.info("removed %d expired stored responses", removed)
        await trio.sleep(every)


# -- the streamed routes (api/routes.py writes their plans) ---------------------------


async def responses(ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
    call = wire.responses_call(body)
    store = ctx.responses
    history: list[dict[str, Any]] = []
    if call.previous_response_id:
        if store is None:
            raise InvalidRequestError("previous_response_id needs a response store")
        previous = await trio.to_thread.run_sync(store.get, call.previous_response_id)
        history = previous.history()
    req = wire.chat_request(call, history)
    draft = wire.Draft(call)
    plan = await plan_generation(
        ctx, req, started, native=False, encoder=ResponseEvents(draft),
        render=lambda answer: wire.response_object(draft, answer),
    )  # fmt: skip
    if call.store and store is not None:
        conversation = [*history, *call.input]

        async def keep(answer: Answer) -> None:
            response = wire.response_object(draft, answer)
            await trio.to_thread.run_sync(store.put, response, call.input, conversation)

        plan.finish = keep
    return plan
