"""A hostile client's tools: raw bytes to a server over loopback, and what comes back."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import trio


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


async def connect(url: str) -> trio.SocketStream:
    return await trio.open_tcp_stream(*address(url))


def request(
    path: str, body: Any = None, *, method: str = "POST", host: bytes = b"127.0.0.1",
    version: bytes = b"HTTP/1.1", extra: bytes = b"",
) -> bytes:  # fmt: skip
    """One request's bytes, with a JSON body (``Content-Length``) if ``body`` is given."""
    data = b"" if body is None else json.dumps(body).encode()
    length = b"" if body is None else b"Content-Length: %d\r\n" % len(data)
    return b"%s %s %s\r\nHost: %s\r\n%s%s\r\n%s" % (
        method.encode(), path.encode(), version, host, length, extra, data,
    )  # fmt: skip


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes (a reset counts as a close)."""
    data = bytearray()
    while True:
        try:
            chunk = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


async def read_response(stream: trio.SocketStream) -> bytes:
    """One response: its head and its body (``Content-Length`` or chunked; else until the
    server closes the connection); b"" if it closes first."""
    data = bytearray()

    async def more() -> bool:
        try:
            chunk = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            chunk = b""
        data.extend(chunk)
        return bool(chunk)

    while b"\r\n\r\n" not in data:
        if not await more():
            return bytes(data)
    head, _, _ = bytes(data).partition(b"\r\n\r\n")
    fields = dict(
        (name.strip().lower(), value.strip())
        for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    )
    end = len(head) + 4
    if b"content-length" in fields:
        end += int(fields[b"content-length"])
        while len(data) < end and await more():
            pass
        return bytes(data)
    if fields.get(b"transfer-encoding") == b"chunked":
        while not data.endswith(b"0\r\n\r\n") and await more():
            pass
        return bytes(data)
    while await more():
        pass
    return bytes(data)


async def exchange(
    url: str, data: bytes, *, half_close: bool = False, to_eof: bool = True
) -> bytes:
    """Send ``data`` on a new connection (then shut our side down if ``half_close``) and
    read until the server closes it, or (``to_eof`` false) one response."""
    stream = await connect(url)
    async with stream:
        await stream.send_all(data)
        if half_close:
            await stream.send_eof()
        return await (read_to_eof(stream) if to_eof else read_response(stream))


def status_of(response: bytes) -> int:
    """The status code of the first response in ``response``."""
    assert response.startswith(b"HTTP/1."), response[:200]
    return int(response.split(b" ", 2)[1])
