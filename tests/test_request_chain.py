"""The request chain (api/chain.py) holds for every request whatever serves it and whatever
transport brought it: the front door or hypercorn, a liveness answer, a Quart view, a
streamed route or the event stream.  Each concern applies once: one CORS header, one
access line, one refusal."""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio
import trio.testing

ALLOWED = b"https://app.example"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}

# One request for each way a route is served (api/table.py Way).
REQUESTS = {
    "liveness": ("GET", "/", None),
    "view": ("GET", "/api/tags", None),
    "stream": ("POST", "/api/chat", CHAT),
    "events": ("GET", "/api/events", None),
}


def raw_request(method: str, path: str, body: Any, host: bytes, origin: bytes | None) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    extra = b"Origin: %s\r\n" % origin if origin else b""
    return b"%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n%s" % (
        method.encode(), path.encode(), host, extra, len(data), data,
    )  # fmt: skip


# A head longer than the front door reads itself: hypercorn serves the connection.
FILLER = b"X-Filler: %s\r\n" % (b"a" * 20000)


async def exchange(url: str, request: bytes, *, hypercorn: bool) -> tuple[int, list[bytes], bytes]:
    """Send ``request`` (with a filler header that hands the connection to hypercorn, if
    asked) and read the response: its status, header lines and body (none for an endless
    stream)."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    async with stream:
        if hypercorn:
            request = request.replace(b"\r\n", b"\r\n" + FILLER, 1)
        await stream.send_all(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *headers = head.split(b"\r\n")
        length = [int(h.split(b":")[1]) for h in headers if h.lower().startswith(b"content-length")]
        if length:
            while len(body) < length[0]:
                body += await stream.receive_some(65536)
        elif b"text/event-stream" not in head.lower():
            while b"0\r\n\r\n" not in body:  # a chunked answer, to its end
                body += await stream.receive_some(65536)
        return int(status_line.split()[1]), headers, body


def by_hypercorn(headers: list[bytes]) -> bool:
    return any(h.lower().startswith(b"server:") for h in headers)


def access_lines(caplog: pytest.LogCaptureFixture, method: str, path: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ollamatrio.api.chain" and r.getMessage().startswith(f"{method} {path} ")
    ]


@pytest.mark.parametrize("hypercorn", [False, True], ids=["front-door", "hypercorn"])
@pytest.mark.parametrize("way", list(REQUESTS))
async def test_each_concern_once_whatever_the_way(
    api_server: Any, caplog: pytest.LogCaptureFixture, way: str, hypercorn: bool
) -> None:
    caplog.set_level(logging.INFO, logger="ollamatrio.api.chain")
    method, path, body = REQUESTS[way]
    with trio.fail_after(30):
        async with api_server(origins=(ALLOWED.decode(),)) as srv:
            host = urlsplit(srv.url).netloc.encode()
            # An allowed origin: the route answers, with one CORS header.
            status, headers, _ = await exchange(
                srv.url, raw_request(method, path, body, host, ALLOWED), hypercorn=hypercorn
            )
            assert status == 200
            assert by_hypercorn(headers) == hypercorn
            cors = [h for h in headers if h.lower().startswith(b"access-control-allow-origin")]
            assert cors == [b"Access-Control-Allow-Origin: " + ALLOWED] or cors == [
                b"access-control-allow-origin: " + ALLOWED
            ]
            # A foreign origin, a foreign Host: refused before the route, in one place.
            for request in (
                raw_request(method, path, body, host, b"https://evil.example"),
                raw_request(method, path, body, b"evil.example", None),
            ):
                status, headers, body_bytes = await exchange(srv.url, request, hypercorn=hypercorn)
                assert (status, body_bytes) == (403, b"")
                assert not [h for h in headers if h.lower().startswith(b"access-control")]
            await trio.testing.wait_all_tasks_blocked()
            lines = access_lines(caplog, method, path)
            # One line per request.
            if way != "events":  # an event stream's line comes when its client leaves
                assert len([line for line in lines if " 200 " in line]) == 1, lines
            assert len([line for line in lines if " 403 " in line]) == 2, lines


async def test_a_preflight_is_answered_by_the_chain(api_server: Any) -> None:
    async with api_server(origins=(ALLOWED.decode(),)) as srv:
        host = urlsplit(srv.url).netloc.encode()
        request = raw_request("OPTIONS", "/api/chat", None, host, ALLOWED)
        status, headers, _ = await exchange(srv.url, request, hypercorn=False)
        assert status == 204
        assert b"allow: post" in [h.lower() for h in headers]


async def test_an_error_takes_the_dialect_of_its_route(api_server: Any) -> None:
    """A model that does not exist, asked on three dialects' streamed routes: 404 each time,
    in each one's error shape."""
    async with api_server() as srv:
        host = urlsplit(srv.url).netloc.encode()
        bodies = {}
        for path, body in (
            ("/api/chat", {**CHAT, "model": "missing"}),
            ("/v1/chat/completions", {**CHAT, "model": "missing"}),
            ("/v1/messages", {**CHAT, "model": "missing", "max_tokens": 8}),
        ):
            status, _, data = await exchange(
                srv.url, raw_request("POST", path, body, host, None), hypercorn=False
            )
            assert status == 404
            bodies[path] = json.loads(data)
        assert isinstance(bodies["/api/chat"]["error"], str)
        assert bodies["/v1/chat/completions"]["error"]["type"] == "not_found_error"
        assert bodies["/v1/messages"]["type"] == "error"
