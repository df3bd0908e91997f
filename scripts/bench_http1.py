#!/usr/bin/env python3
"""Benchmark the front door's request-head parsing (``http/http1.py``) against h11's.

For each head (as the official ``ollama`` and ``openai`` Python clients and curl send them,
captured from the wire), the time to go from the bytes read to what the front door needs to
serve the request (method, target, headers, body length, keep-alive, ``Expect``):

- ``http1``: ``head_end`` + ``parse_request``, as ``http/front.py`` calls them per request;
- ``h11 new``: a fresh ``h11.Connection`` per head, ``receive_data`` + ``next_event`` (the
  ``Request``), and the same fields read from its headers;
- ``h11 kept``: one ``h11.Connection`` for a keep-alive connection's requests, so per
  request also the body events, an empty response through h11 and ``start_next_cycle``
  (what serving a keep-alive connection with h11 would take; the response part is the
  front door's own work otherwise).

Best of ``--repeat`` runs of ``--number`` heads each, in microseconds per head.

    .venv/bin/python scripts/bench_http1.py [--number 20000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import h11

from ollamatrio.http.http1 import MAX_HEAD, head_end, parse_request

BODY = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'
HEADS = {
    "ollama chat": (
        b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:11434\r\nAccept-Encoding: gzip, deflate\r\n"
        b"Connection: keep-alive\r\ncontent-type: application/json\r\naccept: application/json"
        b"\r\nuser-agent: ollama-python/0.6.3 (x86_64 linux) Python/3.11.7\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY)
    ),
    "openai chat": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:11434\r\n"
        b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
        b"authorization: Bearer ollama\r\naccept: application/json\r\n"
        b"content-type: application/json\r\nuser-agent: OpenAI/Python 1.99.9\r\n"
        b"x-stainless-lang: python\r\nx-stainless-package-version: 1.99.9\r\n"
        b"x-stainless-os: Linux\r\nx-stainless-arch: x64\r\nx-stainless-runtime: CPython\r\n"
        b"x-stainless-runtime-version: 3.11.7\r\nx-stainless-async: false\r\n"
        b"x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY)
    ),
    "curl POST": (
        b"POST /api/generate HTTP/1.1\r\nHost: localhost:11434\r\nUser-Agent: curl/7.88.1\r\n"
        b"Accept: */*\r\nContent-Length: %d\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n\r\n" % len(BODY)
    ),
    "curl GET": (
        b"GET /api/tags HTTP/1.1\r\nHost: localhost:11434\r\nUser-Agent: curl/7.88.1\r\n"
        b"Accept: */*\r\n\r\n"
    ),
}


def ours(raw: bytes) -> object:
    end = head_end(raw)
    assert end is not None
    assert end > 0
    head = parse_request(raw, end)
    assert head is not None
    return head


def fields(request: h11.Request) -> tuple[object, ...]:
    """What the front door reads off a head, from h11's parse."""
    length = 0
    close = expect = False
    for name, value in request.headers:
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            close = close or b"close" in {t.strip().lower() for t in value.split(b",")}
        elif name == b"expect":
            expect = value.lower() == b"100-continue"
    method = request.method.decode("ascii").upper()
    return method, request.target, list(request.headers), length, close, expect


def h11_new(raw: bytes) -> object:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(raw)
    request = conn.next_event()
    assert isinstance(request, h11.Request)
    return fields(request)


def h11_kept() -> Callable[[bytes], object]:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    response = h11.Response(status_code=200, headers=[(b"content-length", b"0")])

    def parse(raw: bytes) -> object:
        conn.receive_data(raw)
        request = conn.next_event()
        assert isinstance(request, h11.Request)
        result = fields(request)
        while not isinstance(conn.next_event(), h11.EndOfMessage):
            pass
        conn.send(response)
        conn.send(h11.EndOfMessage())
        conn.start_next_cycle()
        return result

    return parse


def best(parse: Callable[[bytes], object], raw: bytes, number: int, repeat: int) -> float:
    """Microseconds per head, best of ``repeat``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            parse(raw)
        times.append(time.perf_counter() - start)
    return min(times) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"{'head':12} {'bytes':>6} {'http1 µs':>9} {'h11 new µs':>11} {'h11 kept µs':>12}"
          f" {'new/http1':>10} {'kept/http1':>11}")  # fmt: skip
    for name, head in HEADS.items():
        body = BODY if head.startswith(b"POST") else b""
        mine = best(ours, head + body, args.number, args.repeat)
        new = best(h11_new, head + body, args.number, args.repeat)
        kept = best(h11_kept(), head + body, args.number, args.repeat)
        print(f"{name:12} {len(head):6d} {mine:9.2f} {new:11.2f} {kept:12.2f}"
              f" {new / mine:9.1f}x {kept / mine:10.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
