"""The stored side of the OpenAI Responses dialect: ``GET`` and ``DELETE``
``/v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items`` (the streamed
``POST /v1/responses`` is in :mod:`.routes`), and the retention pruning that runs in the
app's nursery for as long as the app serves."""

from __future__ import annotations

import logging

import trio
from quart import Quart, Response, request

from ...errors import InvalidRequestError, ResponseNotFoundError
from ..answers import v1_json_response
from ..openai.errors import openai_errors
from . import wire
from .store import ResponseStore

log = logging.getLogger(__name__)

#: How often expired responses are deleted while the server runs (also once at start).
PRUNE_EVERY = 3600.0


class ResponsesApi:
    """The stored-response views over ``store`` (None: nothing is ever stored, so every id
    is not found)."""

    def __init__(self, store: ResponseStore | None) -> None:
        self.store = store

    def register(self, app: Quart) -> None:
        for path, handler, methods in (
            ("/v1/responses/<response_id>", self.retrieve, ["GET"]),
            ("/v1/responses/<response_id>", self.delete, ["DELETE"]),
            ("/v1/responses/<response_id>/input_items", self.input_items, ["GET"]),
        ):
            app.add_url_rule(
                path, f"responses_{handler.__name__}", openai_errors(handler), methods=methods
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
