"""Hostile clients and the end of a connection: a ``Connection: close`` answer is followed
by a close within a second on every path (HTTP/1.0, streamed or not, on every generation
route; HTTP/1.1 with a chunked body; connections hypercorn serves), and a client that stops
reading frees its generation slot after the send timeout on every path.

Everything is driven over raw sockets, as such a client would."""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio
from test_front import CHAT, GENERATE

from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.http import front

CLOSE_WITHIN = 1.0  # seconds from an answer's last byte to the server's FIN


async def answer_and_close(url: str, request: bytes) -> tuple[bytes, float]:
    """Send ``request``; everything the server sends until it closes, and how long the
    close came after the last byte of the answer."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    async with stream:
        await stream.send_all(request)
        data = bytearray()
        last = trio.current_time()
        while chunk := await stream.receive_some(65536):
            data += chunk
            last = trio.current_time()
        return bytes(data), trio.current_time() - last


def request(host: bytes, path: bytes, body: Any, *, version: bytes = b"HTTP/1.0",
            extra: bytes = b"", line_end: bytes = b"\r\n") -> bytes:  # fmt: skip
    data = json.dumps(body).encode()
    head = (
        b"POST %s %s\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
    )
    return (head % (path, version, host, len(data), extra)).replace(b"\r\n", line_end) + data


def body_of(answer: bytes) -> tuple[dict[bytes, bytes], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return headers, body


STREAM = {**GENERATE, "stream": True}
CHAT_STREAM = {**CHAT, "stream": True}
OPENAI_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 3}  # fmt: skip
OPENAI_TEXT = {"model": "tiny", "prompt": "hi", "max_tokens": 3}


@pytest.mark.parametrize(
    ("path", "body", "last_line"),
    [
        (b"/api/generate", STREAM, b'"done":true'),
        (b"/api/generate", {**GENERATE, "stream": False}, b"}"),
        (b"/api/chat", CHAT_STREAM, b'"done":true'),
        (b"/api/chat", CHAT, b"}"),
        (b"/v1/chat/completions", {**OPENAI_CHAT, "stream": True}, b"data: [DONE]"),
        (b"/v1/chat/completions", OPENAI_CHAT, b"}"),
        (b"/v1/completions", {**OPENAI_TEXT, "stream": True}, b"data: [DONE]"),
        (b"/v1/completions", OPENAI_TEXT, b"}"),
        (b"/api/show", {"model": "tiny"}, b"}"),
    ],
)
async def test_an_http10_answer_is_followed_by_a_close(
    api_server: Any, path: bytes, body: Any, last_line: bytes
) -> None:
    """As ``curl -0`` and nginx's default ``proxy_http_version 1.0`` send them: the answer
    ends with the connection (no chunks: such a client cannot read them)."""
    async with api_server() as srv:
        host = urlsplit(srv.url).netloc.encode()
        with trio.fail_after(20):
            answer, close_after = await answer_and_close(srv.url, request(host, path, body))
    headers, data = body_of(answer)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert headers[b"connection"] == b"close"
    assert b"transfer-encoding" not in headers
    assert last_line in data.rstrip().splitlines()[-1], data  # the whole answer came
    if b"content-length" in headers:
        assert len(data) == int(headers[b"content-length"])
    assert close_after < CLOSE_WITHIN


async def test_a_chunked_request_with_connection_close_is_followed_by_a_close(
    api_server: Any,
) -> None:
    async with api_server() as srv:
        host = urlsplit(srv.url).netloc.encode()
        data = json.dumps(STREAM).encode()
        raw = (
            b"POST /api/generate HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (host, len(data), data)
        )
        with trio.fail_after(20):
            answer, close_after = await answer_and_close(srv.url, raw)
    headers, body = body_of(answer)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert headers[b"connection"] == b"close"
    assert body.endswith(b"0\r\n\r\n")  # a chunked answer: this client speaks HTTP/1.1
    assert close_after < CLOSE_WITHIN


async def test_hypercorns_close_answers_are_followed_by_a_close(api_server: Any) -> None:
    """Connections the front door hands to hypercorn (pipelined requests, bare-LF heads):
    hypercorn's own close after a ``Connection: close`` answer runs in a cancelled scope;
    the connection is closed all the same."""
    async with api_server() as srv:
        host = urlsplit(srv.url).netloc.encode()
        pipelined = b"GET /api/version HTTP/1.1\r\nHost: %s\r\n\r\n" % host + request(
            host, b"/api/generate", STREAM, version=b"HTTP/1.1", extra=b"Connection: close\r\n"
        )
        bare_lf = request(host, b"/api/generate", STREAM, line_end=b"\n")
        for raw in (pipelined, bare_lf):
            with trio.fail_after(20):
                answer, close_after = await answer_and_close(srv.url, raw)
            assert b"server: hypercorn-h11" in answer  # it was hypercorn's
            assert b'"done":true' in answer, answer  # the whole answer came
            assert close_after < CLOSE_WITHIN, raw


# -- a client that stops reading -------------------------------------------------------------

SEND_TIMEOUT = 1.0  # seconds, for the servers here (30 by default)
# Slow enough that the generation would run for 20 s and more if nobody stopped it.
SLOW = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=1000)
ENDLESS = {"model": "tiny", "prompt": "hi", "options": {"num_predict": 1_000_000}}


async def not_reading(url: str, raw: bytes) -> trio.SocketStream:
    """A connection that sends ``raw`` and then never reads (a small receive buffer, so the
    server's writes soon wait)."""
    parts = urlsplit(url)
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((parts.hostname, parts.port))
    stream = trio.SocketStream(sock)
    await stream.send_all(raw)
    return stream


@pytest.mark.parametrize("path", ["front door", "HTTP/1.0", "hypercorn"])
async def test_a_client_that_stops_reading_frees_its_slot(
    api_server: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.setattr(front, "SEND_TIMEOUT", SEND_TIMEOUT)
    async with api_server(behaviour=SLOW) as srv:
        host = urlsplit(srv.url).netloc.encode()
        with trio.fail_after(20):
            # Load the model first: its runner's lease count is what this watches.
            answer, _ = await answer_and_close(
                srv.url, request(host, b"/api/generate", {**GENERATE, "stream": False})
            )
            assert answer.startswith(b"HTTP/1.1 200 ")
            (info,) = srv.scheduler.ps()
            runner = srv.scheduler.runner(info.model_path)
            engine = srv.engines.engines["tiny:latest"]
            completed = engine.completed_streams
        raw = {
            "front door": request(host, b"/api/generate", ENDLESS, version=b"HTTP/1.1"),
            "HTTP/1.0": request(host, b"/api/generate", ENDLESS),
            "hypercorn": request(host, b"/api/generate", ENDLESS, line_end=b"\n"),
        }[path]
        stream = await not_reading(srv.url, raw)
        async with stream:
            with trio.fail_after(10):
                await runner.wait_until(lambda: runner.refs == 1)
            started = trio.current_time()
            with trio.fail_after(SEND_TIMEOUT + 5):
                await runner.wait_until(lambda: runner.refs == 0)
            assert trio.current_time() - started >= SEND_TIMEOUT
            assert engine.completed_streams == completed  # cut, not run to its end
            assert engine.active_streams == 0
