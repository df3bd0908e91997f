"""The streamed routes as plain ASGI, ahead of the Quart views.

``POST /api/generate``, ``/api/chat`` and the ``/v1`` generations carry every token, so they
skip Quart's request and response machinery: one task per request reads the body, has the
dialect's handler plan it (:mod:`.plan`), and then owns the generation (lease and engine
stream) in an ``async with`` for exactly as long as it writes the response, one write per
engine wake-up.  A watcher in the request's nursery cancels it when the client disconnects,
which returns the lease and closes the runner connection (llama.cpp stops generating).
``POST /api/pull``, ``/api/push`` and ``/api/create`` stream their progress the same way
(:mod:`.progress`), and ``POST /api/blobs/<digest>`` is served here too, so that its body is
pulled piece by piece as the disk takes it (:mod:`.blob_upload`), never queued by Quart.

What holds for every request (admission, the drain, the error shape, the access line and
metrics) is the chain's (:mod:`.chain`): an error raised here before the answer begins is
answered there in the route's dialect, and a stream cut short ends there with the last
words it registered (:attr:`~.chain.RequestState.last_words`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
from quart import Response

from ..errors import RequestTooLargeError
from ..generation.answer import Fold
from ..generation.load_lines import announcing_load
from ..generation.relay import Generation
from ..wire import JSON, ndjson_line
from . import blob_upload, priority, progress
from .answers import json_response, send_response, v1_json_response
from .anthropic import handlers as anthropic
from .bodies import MAX_JSON_BODY, decode_json_object
from .chain import RequestState, request_state
from .models import ApiContext
from .native import handlers as native
from .openai import handlers as openai
from .plan import Plan, Planner
from .progress import Progress, ProgressLines
from .responses import handlers as responses
from .table import Dialect


async def _progress(events: Progress) -> Plan:
    return Plan(progress=events)


ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]

# Each streamed JSON route's handler; a test holds them to the route table.
PLANNERS: dict[str, Planner] = {
    "/api/generate": native.generate,
    "/api/chat": native.chat,
    "/v1/completions": openai.completions,
    "/v1/chat/completions": openai.chat_completions,
    "/v1/responses": responses.responses,
    "/v1/messages": anthropic.messages,
    "/v1/messages/count_tokens": anthropic.count_tokens,
    "/api/create": lambda ctx, body, started: _progress(progress.create(ctx, body)),
}
_PULL = "/api/pull"
_PUSH = "/api/push"


class StreamRoutes:
    """ASGI: the table's streamed routes (the chain has found the route).  ``nursery``
    gives the app's nursery, where pulls and pushes run."""

    def __init__(self, ctx: ApiContext, nursery: Callable[[], trio.Nursery]) -> None:
        self.ctx = ctx
        self._nursery = nursery

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        state = request_state(scope)
        route = state.route
        assert route is not None
        exchange = _StreamedRequest(self.ctx, state, receive, send)
        if route.path == blob_upload.ENDPOINT:
            await exchange.upload(scope["path"].removeprefix(blob_upload.PREFIX))
        elif route.path == _PULL:
            await exchange.run(self._pull)
        elif route.path == _PUSH:
            await exchange.run(self._push)
        else:
            await exchange.run(PLANNERS[route.path])

    async def _pull(self, ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
        return Plan(progress=progress.pull(ctx, self._nursery, body))

    async def _push(self, ctx: ApiContext, body: dict[str, Any], started: float) -> Plan:
        return Plan(progress=progress.push(ctx, self._nursery, body))


class _StreamedRequest:
    """One request on a streamed route: its body, plan and response."""

    def __init__(
        self, ctx: ApiContext, state: RequestState, receive: ASGIReceive, send: ASGISend
    ) -> None:
        self.ctx = ctx
        self.state = state
        self.receive = receive
        self._send = send
        assert state.route is not None
        self.v1 = state.route.dialect is not Dialect.NATIVE
        self.started = False  # the response has begun
        self.generation: Generation | None = None  # once a lease is held

    # -- sending ------------------------------------------------------------------------

    async def start(
        self, status: int, content_type: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = [(b"content-type", content_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, *, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, response: Response) -> None:
        self.started = True
        await send_response(self._send, response)

    # -- the exchange -------------------------------------------------------------------

    async def read_body(self) -> dict[str, Any] | None:
        """The JSON body; None if the client left before sending all of it."""
        data = bytearray()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return None  # the chain has seen whether it left or was answered
            data += message.get("body", b"")
            if len(data) > MAX_JSON_BODY:
                raise RequestTooLargeError(f"request body exceeds {MAX_JSON_BODY} bytes")
            if not message.get("more_body", False):
                return decode_json_object(bytes(data))

    async def watch_disconnect(self, scope: trio.CancelScope) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async def upload(self, digest: str) -> None:
        """``POST /api/blobs/<digest>``: the body streamed into the store (201, 200), or an
        error's status (400 for a malformed or mismatched digest); nothing if the client
        left first."""
        status = await blob_upload.upload_blob(self.ctx.store, digest, self.receive)
        if status is not None:
            # No body, as Ollama answers (a length, not chunks, even from hypercorn).
            await self.start(status, "text/plain", {"Content-Length": "0"})
            await self.body(b"", more=False)

    async def run(self, planner: Planner) -> None:
        started = trio.current_time()
        body = await self.read_body()
        if body is None:
            return
        if priority.FIELD in body:  # the body's priority wins over the header's
            self.state.priority = priority.checked_priority(body[priority.FIELD])
        failure: Exception | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.watch_disconnect, nursery.cancel_scope)
                try:
                    await self.serve(nursery, planner, body, started)
                except Exception as exc:  # trio.Cancelled is a BaseException: it passes
                    failure = exc  # raised to the chain below, not in an exception group
                nursery.cancel_scope.cancel()
        finally:
            generation = self.generation
            if generation is not None:
                if generation.final is not None:  # every dialect's generations end here
                    final = generation.final
                    cached = final.prompt_cached_count
                    self.state.tokens_used(
                        final.prompt_eval_count - cached, cached, final.eval_count
                    )
                if self.ctx.metrics is not None:
                    self.ctx.metrics.generation_done(generation)
        if failure is not None:
            raise failure

    async def serve(
        self, nursery: trio.Nursery, planner: Planner, body: dict[str, Any], started: float
    ) -> None:
        plan = await planner(self.ctx, body, started)
        if plan.response is not None:
            await self.respond(plan.response)
            return
        if plan.progress is not None:
            await self.serve_progress(plan.progress)
            return
        generation = plan.generation
        assert generation is not None  # neither an answer nor progress: a generation
        if plan.announce is not None and plan.announce.needed():
            # A load first: start the stream now and tell the client how it goes.
            assert plan.encoder is not None
            self.state.last_words = plan.encoder.error
            await self.start(200, plan.encoder.content_type)
            generation = announcing_load(nursery, plan.announce, generation, self.body)
        async with generation as gen:
            self.generation = gen
            fold = Fold()
            if plan.render is not None:
                while batch := await gen.next_batch():
                    fold.add(batch)
                answer = fold.answer(gen)
                if plan.finish is not None:
                    await plan.finish(answer)
                respond = v1_json_response if self.v1 else json_response
                await self.respond(respond(plan.render(answer)))
                return
            encoder = plan.encoder
            assert encoder is not None
            batch = await gen.next_batch()  # an error before it keeps its own status
            self.state.last_words = encoder.error
            extra = {"Cache-Control": "no-cache"} if self.v1 else None
            if not self.started:
                await self.start(200, encoder.content_type, extra)
            while True:  # one write per wake-up; the last one ends the response
                data = encoder.encode(batch, gen)
                if plan.finish is not None:
                    fold.add(batch)
                if gen.final is not None:
                    if plan.finish is not None:
                        await plan.finish(fold.answer(gen))
                    await self.body(data + encoder.end(), more=False)
                    return
                if data:
                    await self.body(data)
                batch = await gen.next_batch()

    async def serve_progress(self, plan: Progress) -> None:
        """Progress events as NDJSON, one line per event as it comes, or (``stream``
        false) the last one; the source is open for exactly as long as this runs."""
        async with plan.open() as events:
            if not plan.stream:
                last: dict[str, Any] = {}
                async for event in events:
                    if "error" in event and plan.failed_status is not None:
                        await self.respond(json_response(event, plan.failed_status, JSON))
                        return
                    last = event
                # Ollama's streamResponse folded: no charset, as its streams.
                await self.respond(json_response(last, content_type=JSON))
                return
            first = await anext(events, None)  # an error before it keeps its own status
            self.state.last_words = ProgressLines().error
            await self.start(200, ProgressLines.content_type)
            if first is not None:
                await self.body(ndjson_line(first))
                async for event in events:
                    await self.body(ndjson_line(event))
            await self.body(b"", more=False)
