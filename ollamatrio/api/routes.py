"""The generation routes and the progress streams as plain ASGI, in front of the Quart app.

``POST /api/generate``, ``/api/chat``, ``/v1/completions`` and ``/v1/chat/completions`` carry
every token, so they skip Quart's request and response machinery: one task per request
reads the body, runs the same parsing and model checks as the Quart views, and then owns
the generation (lease and engine stream) in an ``async with`` for exactly as long as it
writes the response, one write per engine wake-up.  A watcher in the request's nursery
cancels it when the client disconnects, which returns the lease and closes the runner
connection (llama.cpp stops generating); shutdown's cut ends it the same way, with a last
error line.  ``POST /api/pull`` and ``/api/create`` stream their progress the same way
(api/progress.py).  ``POST /api/blobs/<digest>`` is served here too, so that its body is
pulled piece by piece as the disk takes it (api/blob_upload.py), never queued by Quart.
Everything else goes to Quart unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from quart import Response

from ..errors import (
    InvalidRequestError,
    OllamatrioError,
    RequestTooLargeError,
    ServerShuttingDownError,
)
from ..generation.answer import Answer, Fold
from ..generation.completion import chat_completion, generate_completion
from ..generation.load_lines import LoadAnnouncement, LoadLine, announcing_load
from ..generation.relay import Encoder, Generation, open_generation
from ..generation.requests import ChatRequest, GenerateRequest
from ..http.asgi import ANSWERED, ASGIApp
from ..http.cors import OriginPolicy, cors_answer
from ..http.drain import Drain
from ..observability.metrics import CLIENT_CLOSED
from ..wire import JSON, SSE, SSE_DONE, ndjson_line
from . import (
    anthropic_wire,
    blob_upload,
    native_wire,
    openai_wire,
    pipeline,
    progress,
    responses_wire,
)
from .anthropic import PATHS as ANTHROPIC_PATHS
from .anthropic import anthropic_error_response
from .anthropic_stream import MessageEvents
from .errors import response_for
from .models import ApiContext
from .native import json_response, v1_json_response
from .native_stream import ChatLines, GenerateLines
from .openai import openai_error_response
from .openai_stream import ChatEvents, CompletionEvents
from .progress import Progress, ProgressLines
from .requests import MAX_JSON_BODY, decode_json_object
from .responses_stream import ResponseEvents

log = logging.getLogger(__name__)

ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Plan:
    """What a generation route decided: answer at once (``response``), or run a generation
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


def _v1_answer(obj: dict[str, Any], stream: bool) -> Response:
    """A ``/v1`` object answered at once: JSON, or one event and ``[DONE]`` to a stream."""
    if stream:
        return Response(openai_wire.sse_event(obj) + SSE_DONE, content_type=SSE)
    return v1_json_response(obj)


class LastWords(Protocol):
    """What a stream cut short ends with (an encoder's error line or event)."""

    def error(self, message: str, status: int) -> bytes: ...


class GenerationRoutes:
    """ASGI app: the four generation routes and the two progress streams here, everything
    else to ``app``.  ``nursery`` gives the app's nursery, where pulls run."""

    def __init__(
        self, app: ASGIApp, ctx: ApiContext, drain: Drain, origins: OriginPolicy,
        guard_hosts: bool, allowed_host: Callable[[str], bool],
        nursery: Callable[[], trio.Nursery],
    ) -> None:  # fmt: skip
        self.app = app
        self._nursery = nursery
        self.ctx = ctx
        self.drain = drain
        self._origins = origins
        self._guard_hosts = guard_hosts
        self._allowed_host = allowed_host
        self._routes: dict[str, tuple[Callable[[dict[str, Any], float], Awaitable[Plan]], bool]] = {
            "/api/generate": (self._generate, False),
            "/api/chat": (self._chat, False),
            "/v1/completions": (self._completions, True),
            "/v1/chat/completions": (self._chat_completions, True),
            "/v1/responses": (self._responses, True),
            "/v1/messages": (self._messages, True),
            "/v1/messages/count_tokens": (self._count_tokens, True),
            "/api/pull": (self._pull, False),
            "/api/create": (self._create, False),
        }

    @property
    def paths(self) -> list[str]:
        """The JSON routes' paths (all ``POST``), whose body the front door limits.  (Blob
        uploads, ``POST /api/blobs/<digest>``, have no limit: they reach these routes
        through the app like any other request.)"""
        return list(self._routes)

    @property
    def body_limit(self) -> int:
        """The largest JSON body these routes read (the front door refuses a larger one
        before reading it)."""
        return MAX_JSON_BODY

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            route = self._routes.get(path)
            digest = path.removeprefix(blob_upload.PREFIX)
            if route is None and digest != path and digest and "/" not in digest:
                await _Exchange(self, scope, receive, send, openai=False).upload(digest)
                return
        if route is None:
            await self.app(scope, receive, send)
            return
        await _Exchange(self, scope, receive, send, openai=route[1]).run(route[0])

    # -- the routes: parse, check, plan -------------------------------------------------

    async def _plan(
        self, req: GenerateRequest | ChatRequest, started: float, *, native: bool,
        encoder: Encoder, render: Callable[[Answer], dict[str, Any]],
        load_line: LoadLine | None = None,
        unloaded: Callable[[], Response] | None = None,
    ) -> Plan:  # fmt: skip
        """The dialect-neutral checks (model, capabilities, options), then the generation to
        run, streamed with the dialect's ``encoder`` or folded and rendered with its
        ``render``; a stream that must wait for a load first writes ``load_line`` lines, if
        its dialect has them.  Native routes also answer unload and load-only requests (an
        empty prompt, with or without ``keep_alive: 0``) at once; ``unloaded`` answers an
        unload in a dialect whose requests can ask for one (an empty ``/v1/completions``
        prompt with ``keep_alive: 0``)."""
        prepared = await pipeline.prepare(self.ctx, req)
        if prepared is None:
            if unloaded is not None:
                return Plan(response=unloaded())
            return Plan(response=json_response(native_wire.done_object(req, "unload")))
        model_request = prepared.model_request
        empty = not req.messages if isinstance(req, ChatRequest) else not (req.prompt or req.images)
        if native and empty:
            lease = await self.ctx.scheduler.load(model_request)
            if self.ctx.metrics is not None:
                self.ctx.metrics.lease_taken(lease)
            return Plan(response=json_response(native_wire.done_object(req, "load")))
        if isinstance(req, ChatRequest):
            completion = chat_completion(req, prepared.model, prepared.info, model_request.options)
        else:
            completion = generate_completion(
                req, prepared.model, prepared.info, model_request.options
            )
        generation = open_generation(self.ctx.scheduler, model_request, completion, started)
        if req.stream:
            announce = None
            if load_line is not None:
                announce = LoadAnnouncement(self.ctx.scheduler, model_request, load_line)
            return Plan(generation=generation, encoder=encoder, announce=announce)
        return Plan(generation=generation, render=render)

    async def _generate(self, body: dict[str, Any], started: float) -> Plan:
        req = native_wire.generate_request(body)
        lines = GenerateLines(req.model)
        return await self._plan(
            req, started, native=True, encoder=lines, load_line=lines.load_line,
            render=lambda answer: native_wire.generate_answer(req.model, answer),
        )  # fmt: skip

    async def _chat(self, body: dict[str, Any], started: float) -> Plan:
        req = native_wire.chat_request(body)
        lines = ChatLines(req.model)
        return await self._plan(
            req, started, native=True, encoder=lines, load_line=lines.load_line,
            render=lambda answer: native_wire.chat_answer(req.model, answer),
        )  # fmt: skip

    async def _completions(self, body: dict[str, Any], started: float) -> Plan:
        call = openai_wire.completion_request(body)
        model = call.core.model
        return await self._plan(
            call.core, started, native=False,
            encoder=CompletionEvents(model, call.include_usage),
            render=lambda answer: openai_wire.text_completion(model, answer),
            unloaded=lambda: _v1_answer(openai_wire.unloaded_completion(model), call.core.stream),
        )  # fmt: skip

    async def _chat_completions(self, body: dict[str, Any], started: float) -> Plan:
        call = openai_wire.chat_request(body)
        model = call.core.model
        return await self._plan(
            call.core, started, native=False,
            encoder=ChatEvents(model, call.include_usage),
            render=lambda answer: openai_wire.chat_completion(model, answer),
        )  # fmt: skip

    async def _responses(self, body: dict[str, Any], started: float) -> Plan:
        call = responses_wire.responses_call(body)
        store = self.ctx.responses
        history: list[dict[str, Any]] = []
        if call.previous_response_id:
            if store is None:
                raise InvalidRequestError("previous_response_id needs a response store")
            previous = await trio.to_thread.run_sync(store.get, call.previous_response_id)
            history = previous.history()
        req = responses_wire.chat_request(call, history)
        draft = responses_wire.Draft(call)
        plan = await self._plan(
            req, started, native=False, encoder=ResponseEvents(draft),
            render=lambda answer: responses_wire.response_object(draft, answer),
        )  # fmt: skip
        if call.store and store is not None:
            conversation = [*history, *call.input]

            async def keep(answer: Answer) -> None:
                response = responses_wire.response_object(draft, answer)
                await trio.to_thread.run_sync(store.put, response, call.input, conversation)

            plan.finish = keep
        return plan

    async def _messages(self, body: dict[str, Any], started: float) -> Plan:
        call = anthropic_wire.messages_request(body)
        model = call.core.model
        encoder = MessageEvents(model)
        return await self._plan(
            call.core, started, native=False, encoder=encoder,
            render=lambda answer: anthropic_wire.message_object(model, answer, encoder.id),
        )  # fmt: skip

    async def _count_tokens(self, body: dict[str, Any], started: float) -> Plan:
        req = anthropic_wire.count_tokens_request(body)
        tokens = await pipeline.count_tokens(self.ctx, req)
        return Plan(response=v1_json_response({"input_tokens": tokens}))

    async def _pull(self, body: dict[str, Any], started: float) -> Plan:
        return Plan(progress=progress.pull(self.ctx, self._nursery, body))

    async def _create(self, body: dict[str, Any], started: float) -> Plan:
        return Plan(progress=progress.create(self.ctx, body))


class _Exchange:
    """One request on a generation or progress route: its guard, body, plan and response."""

    def __init__(
        self, routes: GenerationRoutes, scope: dict[str, Any], receive: ASGIReceive,
        send: ASGISend, *, openai: bool,
    ) -> None:  # fmt: skip
        self.routes = routes
        self.scope = scope
        self.receive = receive
        self._send = send
        self.openai = openai
        self.status: int | None = None  # once the response has started
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", ())}
        self.origin = headers["origin"].decode("latin-1") if "origin" in headers else None
        self.host = headers.get("host", b"").decode("latin-1")
        self.cors_headers: list[tuple[str, str]] = []
        self.encoder: LastWords | None = None  # once a stream has started
        self.generation: Generation | None = None  # once a lease is held
        self.arrived = trio.current_time()
        self.nursery: trio.Nursery | None = None  # the request's own, once the body is read
        self.client_left = False  # before the answer: it closed (or half-closed) its side

    # -- sending ------------------------------------------------------------------------

    async def start(
        self, status: int, content_type: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = [(b"content-type", content_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
        headers += [(k.encode(), v.encode()) for k, v in self.cors_headers]
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, *, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, response: Response) -> None:
        data = await response.get_data()
        body = data if isinstance(data, bytes) else data.encode()
        extra = {k: v for k, v in response.headers.items() if k.lower() != "content-type"}
        extra.pop("Content-Length", None)
        # Announced, so that a transport that writes the head at once (hypercorn, the front
        # door for a blob upload) need not send chunks.
        extra["Content-Length"] = str(len(body))
        await self.start(response.status_code, response.content_type or "", extra)
        await self.body(body, more=False)

    async def error(self, exc: BaseException) -> None:
        if self.scope["path"] in ANTHROPIC_PATHS:
            response = anthropic_error_response(exc)
        elif self.openai:
            response = openai_error_response(exc)
        else:
            response = response_for(exc)
        await self.respond(response)

    # -- the exchange -------------------------------------------------------------------

    async def read_body(self) -> dict[str, Any] | None:
        """The JSON body; None if the client left before sending all of it."""
        data = bytearray()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.client_left = ANSWERED not in message  # else answered (and logged) there
                return None
            data += message.get("body", b"")
            if len(data) > MAX_JSON_BODY:
                raise RequestTooLargeError(f"request body exceeds {MAX_JSON_BODY} bytes")
            if not message.get("more_body", False):
                return decode_json_object(bytes(data))

    async def watch_disconnect(self, scope: trio.CancelScope) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.client_left = True
        scope.cancel()

    async def run(self, route: Callable[[dict[str, Any], float], Awaitable[Plan]]) -> None:
        try:
            await self.exchange(route)
        finally:
            self.done(self.scope["path"])

    def done(self, endpoint: str) -> None:
        """The access line and the metrics, once the answer is complete (as Ollama's line,
        with the duration), so they cost nothing before the first token."""
        metrics = self.routes.ctx.metrics
        if metrics is not None:
            metrics.request_done(endpoint, self.status)
            if self.generation is not None:
                metrics.generation_done(self.generation)
        # A client that left before the answer: 499, as nginx logs it and the metrics count it.
        status = self.status or (CLIENT_CLOSED if self.client_left else None)
        if status is not None:
            log.info(
                "%s %s %s %.3fs", self.scope["method"], self.scope["path"], status,
                trio.current_time() - self.arrived,
                extra={"client": (self.scope.get("client") or ("",))[0]},
            )  # fmt: skip

    async def guarded(self) -> bool:
        """CORS and the DNS-rebinding guard; False when they answered (403, say)."""
        cors = cors_answer(self.origin, self.host, "POST", self.routes._origins)
        self.cors_headers = cors.headers
        status = cors.status
        if status is None and self.routes._guard_hosts and not self.routes._allowed_host(self.host):
            status = 403
        if status is None:
            return True
        await self.start(status, "text/plain", {"Content-Length": "0"})
        await self.body(b"", more=False)
        return False

    async def upload(self, digest: str) -> None:
        """``POST /api/blobs/<digest>``: the body streamed into the store (201, 200), or an
        error's status (400 for a malformed or mismatched digest); nothing if the client
        left first."""
        try:
            if not await self.guarded():
                return
            try:
                with self.routes.drain.guard():
                    status = await blob_upload.upload_blob(
                        self.routes.ctx.store, digest, self.receive
                    )
            except Exception as exc:  # trio.Cancelled is a BaseException: it passes
                await self.error(exc)
                return
            if status is not None:
                # No body, as Ollama answers (a length, not chunks, even from hypercorn).
                await self.start(status, "text/plain", {"Content-Length": "0"})
                await self.body(b"", more=False)
        finally:
            self.done(blob_upload.ENDPOINT)

    async def exchange(self, route: Callable[[dict[str, Any], float], Awaitable[Plan]]) -> None:
        if not await self.guarded():
            return
        started = trio.current_time()
        try:
            body = await self.read_body()
        except OllamatrioError as exc:
            await self.error(exc)
            return
        if body is None:
            return
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self.watch_disconnect, nursery.cancel_scope)
            try:
                with self.routes.drain.guard():
                    await self.serve(route, body, started)
            except ServerShuttingDownError as exc:
                await self.last_words(exc)
            except Exception as exc:  # trio.Cancelled is a BaseException: it passes
                await self.last_words(exc)
            nursery.cancel_scope.cancel()

    async def serve(
        self, route: Callable[[dict[str, Any], float], Awaitable[Plan]], body: dict[str, Any],
        started: float,
    ) -> None:  # fmt: skip
        plan = await route(body, started)
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
            assert self.nursery is not None
            self.encoder = plan.encoder
            await self.start(200, plan.encoder.content_type)
            generation = announcing_load(self.nursery, plan.announce, generation, self.body)
        async with generation as gen:
            self.generation = gen
            fold = Fold()
            if plan.render is not None:
                while batch := await gen.next_batch():
                    fold.add(batch)
                answer = fold.answer(gen)
                if plan.finish is not None:
                    await plan.finish(answer)
                respond = v1_json_response if self.openai else json_response
                await self.respond(respond(plan.render(answer)))
                return
            encoder = plan.encoder
            assert encoder is not None
            self.encoder = encoder
            batch = await gen.next_batch()  # an error before it keeps its own status
            extra = {"Cache-Control": "no-cache"} if self.openai else None
            if self.status is None:
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
            self.encoder = ProgressLines()
            await self.start(200, ProgressLines.content_type)
            if first is not None:
                await self.body(ndjson_line(first))
                async for event in events:
                    await self.body(ndjson_line(event))
            await self.body(b"", more=False)

    async def last_words(self, exc: BaseException) -> None:
        """An error's answer: its own status before the response started, else one last
        error line (event) on the stream."""
        if self.status is None:
            await self.error(exc)
            return
        status = 503 if isinstance(exc, ServerShuttingDownError) else 500
        if isinstance(exc, OllamatrioError):
            log.warning("stream failed mid-way: %s", exc)
        else:
            log.error("unexpected error in a stream", exc_info=exc)
        assert self.encoder is not None  # only streams start before the end
        await self.body(self.encoder.error(str(exc), status), more=False)
