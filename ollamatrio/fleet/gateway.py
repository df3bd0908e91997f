"""``ollamatrio fleet gateway``: one address in front of several ollamatrio hosts.

The gateway is an ASGI app served by the project's own front door (``http/front.py``: the
head parsing, keep-alive, body deadlines, connection budget and drain of ``serve``).  For
each request it reads the body (a blob upload is streamed instead), takes its ``model``
field (or ``name``, as ``/api/show`` and ``/api/pull`` accept), asks the routing policy
(``fleet/routing.py``, over the host table of ``fleet/gateway_hosts.py``) for the hosts in
order, and sends the request to the first that takes it, over that host's keep-alive pool
(``fleet/gateway_upstream.py``).  The answer goes back as it arrives, each piece the host
wrote one piece to the client: the body bytes are never parsed.

* A host that cannot be reached, or fails before its answer starts, or answers 503 (its
  queue is full) while another host could take the request: the next host is tried (the
  body is in hand, and the client has seen nothing yet).
* The client leaves mid-answer: the host's connection is closed, which is how the host
  learns it, and it frees the generation's slot.
* The host dies mid-stream: a streamed answer (NDJSON or SSE) ends with one error line in
  its dialect's shape, as the host itself ends a stream that fails; another answer's
  connection is closed.

Requests that name no model (``/api/tags``, ``/api/version``, ``/``) go to the first host
that is up; with one shared model store (``OLLAMA_MODELS`` on shared storage) every host
answers them alike.  ``/api/ps``, ``/metrics`` and ``/api/events`` are the gateway's own,
fleet-wide answers (``fleet/gateway_fleetwide.py``), and so is the console (``/ui``), which
shows every host from them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from socket import socket
from typing import Any, Final

import orjson
import trio

from ..api.anthropic import wire as anthropic_wire
from ..api.anthropic.stream import MessageEvents
from ..api.bodies import MAX_JSON_BODY
from ..api.chain import Chain, current_request
from ..api.native.stream import GenerateLines
from ..api.openai import wire as openai_wire
from ..api.openai.stream import ChatEvents
from ..api.usage import UsageView, write_usage
from ..auth.usage import UsageLedger, UsageStore
from ..config import Settings
from ..console import PREFIX as CONSOLE
from ..console import answer_console
from ..http.drain import Drain
from ..http.fleet_secret import HEADER as FLEET_SECRET
from ..http.front import serve_http
from ..http.http1 import LAST_CHUNK, chunk
from ..http1.client import BodyReader, Connection
from ..http1.framing import ResponseHead
from ..serve import hypercorn_config, tls_context
from . import gateway_fleetwide as fleetwide
from .gateway_hosts import Host, HostTable, model_key
from .gateway_sizes import SizePredictor
from .gateway_tokens import TokenTally
from .gateway_upstream import HostConnectionError
from .routing import Choice

log = logging.getLogger(__name__)

ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]

# Headers that describe one hop, not the request: the gateway frames its own.
_HOP: Final = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"host", b"content-length", b"expect",
    FLEET_SECRET,  # the gateway sends its own
})  # fmt: skip
_ANSWER_HOP: Final = frozenset({
    b"connection", b"keep-alive", b"transfer-encoding", b"date", b"trailer",
})  # fmt: skip
_BLOBS: Final = "/api/blobs/"
_STREAMED_TYPES: Final = (b"application/x-ndjson", b"text/event-stream")


@dataclass(frozen=True)
class Target:
    """Where one request may go: the hosts in order, and what each choice was."""

    hosts: list[tuple[Host, str | None]]  # (host, decision kind) ; kind None: no model
    model: str | None  # the model key


def model_of(body: bytes) -> str | None:
    """The ``model`` (else ``name``) field of a JSON object body, if there is one."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    for field in ("model", "name"):
        value = data.get(field)
        if isinstance(value, str) and value:
            return value
    return None


def error_body(path: str, message: str, status: int) -> bytes:
    """An error answer in the shape of the route's dialect."""
    if path.startswith("/v1/messages"):
        return orjson.dumps(anthropic_wire.error_object(message, status))
    if path.startswith("/v1/"):
        return orjson.dumps(openai_wire.error_object(message, status))
    return orjson.dumps({"error": message})


def error_line(path: str, content_type: bytes, message: str) -> bytes:
    """The last piece of a stream that a dying host cut: one error line, as the host's own
    encoder writes it for a stream that fails (``api/*_stream.py``)."""
    status = 502
    if content_type.startswith(b"application/x-ndjson"):
        return GenerateLines("").error(message, status)
    if path.startswith("/v1/messages"):
        return MessageEvents("").error(message, status)
    if path.startswith("/v1/responses"):
        error = openai_wire.error_object(message, status)["error"]
        data = {"type": "error", "code": error["type"], "message": message, "param": None}
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"
    return ChatEvents("", include_usage=False).error(message, status)


USAGE: Final = "/api/usage"  # answered here: the fleet's keys and their usage are the gateway's


class Gateway:
    """The gateway's ASGI app."""

    def __init__(
        self, table: HostTable, sizes: SizePredictor | None = None,
        usage: UsageView | None = None,
    ) -> None:  # fmt: skip
        self.table = table
        self.sizes = sizes  # None: every model's size unknown (it fits anywhere)
        self.usage = usage  # the fleet's keys' usage, kept here (None: keys not asked for)

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _http(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        if method in ("GET", "HEAD") and (path == CONSOLE or path.startswith(CONSOLE + "/")):
            await answer_console(scope, send)  # the console's files are the gateway's own
            return
        if method == "GET" and path in fleetwide.FLEETWIDE:
            await fleetwide.answer(self.table, path, receive, send)
            return
        if method == "GET" and path == USAGE and self.usage is not None:
            await _answer(send, 200, orjson.dumps(await self.usage.document()))
            return
        # The request's key pays for the tokens of the answer (its quota, its usage).
        state = current_request()
        tally = TokenTally() if state is not None and state.key is not None else None
        length = next((v for k, v in headers if k == b"content-length"), None)
        streamed = method == "POST" and path.startswith(_BLOBS)
        body = b""
        if not streamed:
            if length is not None and int(length) > MAX_JSON_BODY:
                message = f"request body exceeds {MAX_JSON_BODY} bytes"
                await _answer(send, 413, error_body(path, message, 413))
                return
            read = await _read_body(receive)
            if read is None:
                return  # the client left
            body = read
        target = await self._target(method, body)
        if not target.hosts:
            await _answer(send, 503, error_body(path, "no host of the fleet is up", 503))
            return
        if not streamed:
            head = _request_head(scope, len(body))
        else:  # as the client frames it: its Content-Length, else chunks
            head = _request_head(scope, int(length) if length is not None else None)
        last = len(target.hosts) - 1
        for index, (host, kind) in enumerate(target.hosts):
            with self.table.sending(host, target.model, kind) as attempt:
                try:
                    if streamed:
                        conn, answer = await _send_streamed(
                            host, head, receive, chunked=length is None
                        )
                    else:
                        request = head + host.pool.authority + b"\r\n\r\n" + body
                        conn, answer = await host.pool.send(request)
                except HostConnectionError as exc:
                    log.warning("%s %s: host %s failed: %s", method, path, host.name, exc)
                    if index < last and not streamed:
                        continue
                    message = f"the fleet's host failed: {exc}"
                    await _answer(send, 502, error_body(path, message, 502))
                    return
                if answer.status == 503 and index < last and not streamed:
                    # The host's queue is full: the next host may take it.
                    self.table.refused(host, attempt)
                    await _discard(host, conn, answer)
                    continue
                await _relay(host, conn, answer, method, path, receive, send, tally)
                if tally is not None and state is not None:
                    state.tokens_used(*tally.counts())
                return

    async def _target(self, method: str, body: bytes) -> Target:
        name = model_of(body) if method in ("POST", "DELETE") else None
        if name is None:
            return Target([(h, None) for h in self.table.default()], None)
        model = model_key(name)
        size = None
        if self.sizes is not None and self.table.needs_size(model):
            size = await self.sizes.predict(name)  # a cold model: which hosts have room
        hosts = self.table.hosts
        choices: list[Choice] = self.table.choose(model, size)
        return Target([(hosts[c.host], c.kind) for c in choices], model)


async def _lifespan(receive: ASGIReceive, send: ASGISend) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _answer(send: ASGISend, status: int, body: bytes) -> None:
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json; charset=utf-8")],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: ASGIReceive) -> bytes | None:
    """The whole request body; None if the client left first."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)


def _request_head(scope: dict[str, Any], length: int | None) -> bytes:
    """The request head for a host, up to its ``host:`` value (the host fills that in)
    and with its own framing (``length`` None: chunks): the client's hop-by-hop headers
    are dropped."""
    target = scope["raw_path"]
    if scope["query_string"]:
        target += b"?" + scope["query_string"]
    lines = [b"%b %b HTTP/1.1\r\n" % (scope["method"].encode(), target)]
    lines += [
        name + b": " + value + b"\r\n" for name, value in scope["headers"] if name not in _HOP
    ]
    if length is None:
        lines.append(b"transfer-encoding: chunked\r\n")
    elif length or scope["method"] in ("POST", "PUT", "PATCH"):
        lines.append(b"content-length: %d\r\n" % length)
    lines.append(b"host: ")
    return b"".join(lines)


async def _send_streamed(
    host: Host, head: bytes, receive: ASGIReceive, *, chunked: bool
) -> tuple[Connection, ResponseHead]:
    """A request whose body is streamed to the host as the client sends it (blob uploads),
    on a fresh connection: a body half-sent cannot be sent again.  A body without a
    ``Content-Length`` (the official Python client's uploads) goes on in chunks."""
    conn = await host.pool.connect()
    try:
        await conn.send_all(host.pool.signed(head + host.pool.authority + b"\r\n\r\n"))
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HostConnectionError("the client left during the upload")
            if piece := message.get("body", b""):
                await conn.send_all(chunk(piece) if chunked else piece)
            if not message.get("more_body", False):
                if chunked:
                    await conn.send_all(LAST_CHUNK)
                break
        return conn, await conn.read_head()
    except BaseException:
        conn.close()
        raise


async def _discard(host: Host, conn: Connection, answer: ResponseHead) -> None:
    reader = BodyReader(conn, answer, no_body=False)
    try:
        await reader.read_all()
    except HostConnectionError:
        conn.close()
        return
    if reader.keep_alive:
        host.pool.give_back(conn)
    else:
        conn.close()


async def _relay(
    host: Host, conn: Connection, answer: ResponseHead, method: str, path: str,
    receive: ASGIReceive, send: ASGISend, tally: TokenTally | None = None,
) -> None:  # fmt: skip
    """The host's answer to the client as it comes; the connection back to the pool when
    the answer was read whole, else closed (the host learns the client left)."""
    no_body = method == "HEAD" or answer.status in (204, 304) or answer.status < 200
    reader = BodyReader(conn, answer, no_body=no_body)
    headers = [(k, v) for k, v in answer.headers if k not in _ANSWER_HOP]
    content_type = answer.header(b"content-type") or b""
    complete = False
    failure: HostConnectionError | None = None
    try:
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        if reader.done:  # no body (HEAD, 204, an empty answer): its end at once
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            try:
                while not reader.done:
                    piece = await reader.next()
                    if tally is not None:
                        tally.feed(piece)
                    if piece or reader.done:
                        await send({"type": "http.response.body", "body": piece,
                                    "more_body": not reader.done})  # fmt: skip
                complete = True
            except HostConnectionError as exc:
                failure = exc
            nursery.cancel_scope.cancel()
    finally:
        if complete and reader.keep_alive:
            host.pool.give_back(conn)
        else:
            conn.close()  # mid-answer: the host sees its client leave
    if failure is None:
        return
    log.warning("%s %s: host %s failed mid-answer: %s", method, path, host.name, failure)
    if answer.status == 200 and content_type.startswith(_STREAMED_TYPES):
        line = error_line(path, content_type, f"the fleet's host {host.name} failed: {failure}")
        await send({"type": "http.response.body", "body": line, "more_body": False})
    # Otherwise the answer stays unfinished: the front door closes the connection.


async def _cancel_on_disconnect(receive: ASGIReceive, scope: trio.CancelScope) -> None:
    message = await receive()
    if message["type"] == "http.disconnect":
        scope.cancel()


@dataclass(frozen=True)
class RunningGateway:
    url: str
    table: HostTable


async def serve_gateway(
    hosts: list[str] | HostTable,
    settings: Settings,
    *,
    shutdown_trigger: Callable[..., Awaitable[None]] | None = None,
    listener: socket | None = None,
    task_status: trio.TaskStatus[RunningGateway] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway for ``hosts`` (``http://HOST:PORT`` each, or a table that learns
    them as they come) on ``listener`` (else ``settings.bind``) until ``shutdown_trigger``
    returns."""
    if isinstance(hosts, HostTable):
        table = hosts
    else:
        table = HostTable(hosts, fleet_secret=settings.fleet_secret)
    # The request chain, as on a server: keys (OLLAMATRIO_AUTH, the gateway's own key table:
    # one state for the fleet), their quotas, CORS and the Host guard, the access line.  The
    # fleet secret is what the gateway sends its hosts, not what it asks of clients.
    front = replace(settings, fleet_secret="")
    ledger = UsageLedger()
    usage = UsageView(ledger, UsageStore.in_folder(settings.state_dir))
    keys = settings.auth == "required"
    gateway = Gateway(table, SizePredictor(settings), usage if keys else None)
    app = Chain(gateway, front, Drain(), lambda: None, usage=ledger)
    async with trio.open_nursery() as nursery:
        await nursery.start(table.run)
        if keys:
            nursery.start_soon(write_usage, ledger, usage.store)

        async def serve(task_status: trio.TaskStatus[list[str]]) -> None:
            await serve_http(
                app, hypercorn_config(settings, listener), shutdown_trigger=shutdown_trigger,
                body_timeout=settings.body_timeout, tls=tls_context(settings),
                task_status=task_status,
            )  # fmt: skip
            nursery.cancel_scope.cancel()  # the watchers end with the server

        binds = await nursery.start(serve)
        task_status.started(RunningGateway(binds[0], table))
