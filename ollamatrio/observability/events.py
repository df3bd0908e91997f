"""``GET /api/events``: the scheduler's events as server-sent events, for dashboards and CLIs.

Each event is ``event: <kind>`` plus ``data: <SchedulerEvent.as_json()>``; ``?model=NAME``
keeps one model's.  A comment line (``: ping``) every ``PING_SECONDS`` keeps proxies from
timing the connection out.  The stream ends cleanly (the chunked body is closed) when
shutdown begins (it must not hold the drain), when the subscriber falls too far behind (the
hub cuts it off; it may reconnect and read ``/api/ps``), and at once when the client leaves.

Plain ASGI beside the app, as the generation routes: one task per request owns the
subscription, with a disconnect watcher and a shutdown watcher beside it.  What holds for
every request (CORS, the Host guard, the access line) is applied around it by the API's
request chain.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import trio

from ..scheduler import Scheduler
from ..scheduler.events import SchedulerEvent
from ..store.names import InvalidModelNameError, ModelName
from ..wire import SSE

PATH = "/api/events"
PING_SECONDS = 15.0

ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]


def sse_bytes(event: SchedulerEvent) -> bytes:
    data = json.dumps(event.as_json(), separators=(",", ":"))
    return f"event: {event.kind}\ndata: {data}\n\n".encode()


def _full_name(model: str) -> tuple[str, ...]:
    """A name as the store compares it: ``tiny``, ``library/TINY`` and the runner's
    ``tiny:latest`` are one model (defaults filled in, case folded)."""
    try:
        return ModelName.parse(model).folded()
    except InvalidModelNameError:
        return (model,)  # matches no runner's name


class EventsRoute:
    """ASGI app: ``GET /api/events``."""

    def __init__(self, scheduler: Scheduler, stopping: trio.Event) -> None:
        self.scheduler = scheduler
        self.stopping = stopping  # set when shutdown begins

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        model = _full_name(query["model"][0]) if query.get("model") else None
        await self._stream(receive, send, model)

    async def _stream(
        self, receive: ASGIReceive, send: ASGISend, model: tuple[str, ...] | None
    ) -> None:
        left = False
        async with self.scheduler.events.subscribe() as events, trio.open_nursery() as nursery:

            async def watch_disconnect() -> None:
                nonlocal left
                while (await receive())["type"] != "http.disconnect":
                    pass
                left = True
                nursery.cancel_scope.cancel()

            async def watch_shutdown() -> None:
                await self.stopping.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_disconnect)
            nursery.start_soon(watch_shutdown)
            headers = [(b"content-type", SSE.encode()), (b"cache-control", b"no-cache")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await _relay(events, send, model)
            nursery.cancel_scope.cancel()  # the hub cut this subscriber off
        if not left:  # end the chunked body, so the client sees a clean end
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _relay(
    events: trio.MemoryReceiveChannel[SchedulerEvent],
    send: ASGISend,
    model: tuple[str, ...] | None,
) -> None:
    """Write events until the channel ends, and a ping whenever nothing was written for a
    while (events for other models do not count)."""
    quiet_until = trio.current_time() + PING_SECONDS
    while True:
        with trio.move_on_at(quiet_until) as quiet:
            try:
                event = await events.receive()
            except trio.EndOfChannel:
                return
        if quiet.cancelled_caught:
            data = b": ping\n\n"
        elif model is None or _full_name(event.model) == model:
            data = sse_bytes(event)
        else:
            continue
        await send({"type": "http.response.body", "body": data, "more_body": True})
        quiet_until = trio.current_time() + PING_SECONDS
