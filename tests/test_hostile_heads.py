"""Hostile request heads, over raw sockets: one view of the head for every route.

A second ``Host`` or ``Origin`` (routes would read different copies) and a ``Host`` that is
no host name (werkzeug's routing raised on it: a 500 and a traceback per request) are answered
400 with one log line, before any route, on the front door's own path (HTTP/1.1) and on
hypercorn's (HTTP/1.0, a chunked body)."""

from __future__ import annotations

import contextlib
import logging

import pytest
import trio
from helpers.hostile_raw import connect, exchange, read_to_eof, request, status_of

GENERATE = {"model": "tiny", "prompt": "hi", "options": {"num_predict": 2}, "stream": False}

# (method, path, body): a Quart view, a streamed route, the events stream.
ROUTES = [
    ("GET", "/api/tags", None),
    ("POST", "/api/show", {"model": "tiny"}),
    ("POST", "/api/generate", GENERATE),
    ("GET", "/api/events", None),
]
# The front door serves HTTP/1.1 itself; HTTP/1.0 goes to hypercorn.
VERSIONS = {"front door": b"HTTP/1.1", "hypercorn": b"HTTP/1.0"}

MALFORMED_HOSTS = [
    b"a..localhost",
    b"127..0.1",
    b".",
    b"..",
    b".localhost",
    b"a" * 64 + b".localhost",  # a label over 63 bytes
    b"a" * 64,
    b"localhost:11434:1",
    b"localhost:abc",
    b"[::1",
    b"[::1]x",
    b"[127.0.0.1]",
    b"ho st",
    b"local/host",
    b"user@localhost",
    "h\u00e9.localhost".encode(),
]


def ask(
    method: str, path: str, body: object, version: bytes, host: bytes, extra: bytes = b""
) -> bytes:
    close = b"Connection: close\r\n" if version == b"HTTP/1.1" else b""
    return request(path, body, method=method, host=host, version=version, extra=close + extra)


def refusals(caplog: pytest.LogCaptureFixture, reason: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if reason in r.getMessage()]


@pytest.mark.parametrize("path_kind", list(VERSIONS))
async def test_a_host_that_is_no_host_name_is_400_with_one_line(
    api_server, caplog: pytest.LogCaptureFixture, path_kind: str
) -> None:
    caplog.set_level(logging.INFO)
    version = VERSIONS[path_kind]
    with trio.fail_after(60):
        async with api_server() as srv:
            for method, path, body in ROUTES:
                for host in MALFORMED_HOSTS:
                    caplog.clear()
                    response = await exchange(srv.url, ask(method, path, body, version, host))
                    assert status_of(response) == 400, (path, host, response[:300])
                    assert response.endswith(b"malformed Host header"), response
                    lines = refusals(caplog, "malformed Host header")
                    assert len(lines) == 1, (path, host, [r.getMessage() for r in caplog.records])
                    assert lines[0].exc_info is None
                    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("path_kind", list(VERSIONS))
async def test_hosts_that_parse_are_not_refused(api_server, path_kind: str) -> None:
    version = VERSIONS[path_kind]
    allowed = [b"127.0.0.1", b"localhost:11434", b"[::1]:11434", b"[::1]", b"ollama.local",
               b"localhost:", b"::1", b"10.1.2.3:80"]  # fmt: skip
    with trio.fail_after(60):
        async with api_server() as srv:
            for host in allowed:
                data = ask("GET", "/api/tags", None, version, host)
                response = await exchange(srv.url, data, to_eof=False)
                assert status_of(response) == 200, (host, response[:300])
            # A name is no rebinding target if it is local; others pass the head check and
            # meet the guard (403), as Ollama answers them.
            for host in (b"my_box", b"evil.example.com", b"a" * 63 + b".example.com",
                         b"ollama.local."):  # fmt: skip
                data = ask("GET", "/api/tags", None, version, host)
                response = await exchange(srv.url, data, to_eof=False)
                assert status_of(response) == 403, (host, response[:300])


@pytest.mark.parametrize("path_kind", list(VERSIONS))
async def test_a_second_host_is_400_whatever_the_order(api_server, path_kind: str) -> None:
    """Every route would read another copy (generation routes the last, Quart the first):
    ``evil.com`` + ``127.0.0.1`` must not pass the guard on any of them."""
    version = VERSIONS[path_kind]
    with trio.fail_after(60):
        async with api_server() as srv:
            for method, path, body in ROUTES:
                for first, second in ((b"evil.com", b"127.0.0.1"), (b"127.0.0.1", b"evil.com")):
                    data = ask(method, path, body, version, first, b"Host: " + second + b"\r\n")
                    response = await exchange(srv.url, data)
                    assert status_of(response) == 400, (path, first, response[:300])


@pytest.mark.parametrize("path_kind", list(VERSIONS))
async def test_a_second_origin_is_400(
    api_server, caplog: pytest.LogCaptureFixture, path_kind: str
) -> None:
    """CORS would read one copy on a route and another on the next: refused everywhere."""
    caplog.set_level(logging.INFO)
    version = VERSIONS[path_kind]
    origins = [
        b"Origin: http://evil.com\r\nOrigin: http://127.0.0.1\r\n",
        b"Origin: http://127.0.0.1\r\nOrigin: http://evil.com\r\n",
        b"Origin: http://127.0.0.1\r\nOrigin: http://127.0.0.1\r\n",
    ]
    with trio.fail_after(60):
        async with api_server() as srv:
            for method, path, body in ROUTES:
                for extra in origins:
                    caplog.clear()
                    data = ask(method, path, body, version, b"127.0.0.1", extra)
                    response = await exchange(srv.url, data)
                    assert status_of(response) == 400, (path, extra, response[:300])
                    assert response.endswith(b"too many Origin headers")
                    assert len(refusals(caplog, "too many Origin headers")) == 1


async def test_a_refused_head_closes_without_reading_the_body(api_server) -> None:
    """The front door refuses at the head: the body is never read, and the connection closes
    after the answer, so bytes in the body are never taken for a request."""
    smuggled = request("/api/generate", GENERATE)
    head = request("/api/show", None, host=b"a..b", extra=b"Content-Length: %d\r\n" % len(smuggled))
    with trio.fail_after(30):
        async with api_server() as srv:
            stream = await connect(srv.url)
            async with stream:
                await stream.send_all(head)
                first = await stream.receive_some(65536)  # the answer comes before the body
                with contextlib.suppress(trio.BrokenResourceError):
                    await stream.send_all(smuggled)
                response = first + await read_to_eof(stream)
    assert status_of(response) == 400
    assert response.count(b"HTTP/1.1 ") == 1, response
