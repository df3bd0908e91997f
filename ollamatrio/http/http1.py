"""The slice of HTTP/1.1 the front door speaks itself: strict request heads (HTTP/1.1, and
HTTP/1.0 as h11 reads it: never kept alive), response heads and chunk framing.  Chunked
request bodies are decoded by :class:`~ollamatrio.http1.framing.ChunkedDecoder`, which the
clients share.

Strict means that anything unusual is *not ours*: :func:`head_end` or :func:`parse_request`
says so and the connection goes to hypercorn, which knows the whole protocol (h11, and its
error answers).  Only two things are refused here, because handing them on could make two
parsers disagree about where a request ends: a ``Content-Length`` that is not one plain
number, and a ``Content-Length`` together with a ``Transfer-Encoding``.

Whatever the front door serves, h11 would have read the same way: the same method, target and
headers, and the same body length, so the next request starts at the same byte (a
property-based test compares the two over generated heads, ``tests/test_http1_differential.py``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus

from ..http1.framing import BAD_VALUE, BLANK_LINE, TOKEN, FramingError

MAX_HEAD = 16 * 1024  # bytes, as hypercorn's h11_max_incomplete_size
MAX_HEADERS = 100
_MAX_LENGTH_DIGITS = 18  # a Content-Length longer than this is no body we would read

HANDOFF = -1  # head_end(): the connection is hypercorn's
_VERSIONS = frozenset((b"HTTP/1.1", b"HTTP/1.0"))
_TARGET = re.compile(rb"/[\x21-\x7e]*")  # origin form, printable ASCII (hypercorn decodes it)
# The bytes a request can start with (a method): anything else (TLS, an h2 preface is caught
# later) is not HTTP/1.1 as the front door speaks it.
TOKEN_BYTES = frozenset(b"!#$%&'*+-.^_`|~0123456789" + bytes(range(65, 91)) + bytes(range(97, 123)))


class BadRequest(FramingError):
    """A request whose framing is ambiguous: answered 400, and the connection closed."""


@dataclass
class Head:
    """A request head the front door serves itself."""

    method: str  # upper case, as hypercorn gives it
    target: bytes  # the path and query as sent (origin form: starts with "/")
    headers: list[tuple[bytes, bytes]]  # names lower-cased, values stripped
    content_length: int  # 0 for a chunked body
    close: bool  # the client asked to close after this exchange (always so for HTTP/1.0)
    expect_continue: bool  # the client waits for "100 Continue" before it sends the body
    chunked: bool = False  # the body comes in chunks (Transfer-Encoding: chunked)
    version: str = "1.1"  # "1.0": the answer's body ends with the connection if its length
    # is not known in advance (such a client cannot read chunks)


def head_end(buffer: bytes | bytearray, start: int = 0) -> int | None:
    """Where the request head at the start of ``buffer`` ends, as h11 would find it: the index
    just past its blank line; None while it is incomplete (search again from ``start``, two
    bytes before the old end, when more has come); :data:`HANDOFF` if the connection is not
    ours: not a request line (TLS, a blank line first), a head over :data:`MAX_HEAD`, or
    bare-LF line ends (h11 reads them; hypercorn answers at once)."""
    if buffer and buffer[0] not in TOKEN_BYTES:
        return HANDOFF
    match = BLANK_LINE.search(buffer, start)
    if match is None:
        return HANDOFF if len(buffer) > MAX_HEAD else None
    blank = match.start() - 1  # where "\r\n\r\n" starts, if that is what it is
    if blank > MAX_HEAD or match.end() - blank != 4 or buffer[blank] != 0x0D:
        return HANDOFF
    return match.end()


def parse_request(buffer: bytes | bytearray, end: int) -> Head | None:
    """The request whose head ends at ``end`` (:func:`head_end`) in ``buffer`` if the front
    door serves it; None if it is hypercorn's: not simple (:func:`parse_head`), or more bytes
    behind it than its body (pipelined requests).

    Raises:
        BadRequest: as :func:`parse_head`.
    """
    head = parse_head(bytes(buffer[: end - 4]))
    if head is not None and not head.chunked and len(buffer) > end + head.content_length:
        return None
    return head


def parse_head(raw: bytes) -> Head | None:
    """``raw`` (up to, not including, the blank line) as a request over HTTP/1.1 or HTTP/1.0
    with an origin-form target and a ``Content-Length`` body (or none), or over HTTP/1.1 with
    a chunked body; None for anything else.

    Raises:
        BadRequest: a broken or doubled ``Content-Length``, or one with ``Transfer-Encoding``.
    """
    lines = raw.split(b"\r\n")
    request_line = lines[0].split(b" ")
    if len(request_line) != 3 or len(lines) > MAX_HEADERS + 1:
        return None
    method, target, version = request_line
    if version not in _VERSIONS or not TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
        return None
    http10 = version == b"HTTP/1.0"
    method = method.upper()
    if method == b"CONNECT":
        return None  # h11 waits for the answer: a tunnel after a 2xx
    headers = []
    length: bytes | None = None
    codings: list[bytes] = []
    close = host = expect_continue = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not TOKEN.fullmatch(name) or BAD_VALUE.search(value):
            return None  # also obsolete line folding: a name cannot start with a space
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
                raise BadRequest("bad Content-Length")
            length = value
        elif name == b"transfer-encoding":
            value = value.lower()  # as h11 gives it
            codings.append(value)
        elif name == b"expect":
            if value.lower() != b"100-continue":
                return None  # hypercorn answers 417
            expect_continue = True
        elif name == b"upgrade":
            return None
        elif name == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            if b"upgrade" in tokens:
                return None
            close = close or b"close" in tokens
        elif name == b"host":
            if host:
                return None  # h11 refuses two: hypercorn answers 400
            host = True
        headers.append((name, value))
    chunked = False
    if codings:
        if length is not None:
            raise BadRequest("both Content-Length and Transfer-Encoding")
        if http10 or codings != [b"chunked"]:
            return None  # h11 refuses other codings (hypercorn answers 501)
        chunked = True
    if http10:
        # h11 keeps no HTTP/1.0 connection alive, and no such client waits for a 100.
        return Head(method.decode("ascii"), target, headers, int(length or 0), True, False,
                    version="1.0")  # fmt: skip
    if not host:
        return None  # HTTP/1.1 requires it; hypercorn says so
    return Head(
        method.decode("ascii"), target, headers, int(length or 0), close, expect_continue, chunked
    )


class _Date:
    """The ``date`` header line, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


_date = _Date()
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}


def response_head(
    status: int, headers: list[tuple[bytes, bytes]], framing: bytes, *, close: bool
) -> bytes:
    """A response head: ``framing`` is its ``content-length``/``transfer-encoding`` line."""
    out = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status, _date.line(), framing]
    out += [name + b": " + value + b"\r\n" for name, value in headers]
    if close:
        out.append(b"connection: close\r\n")
    out.append(b"\r\n")
    return b"".join(out)


CHUNKED = b"transfer-encoding: chunked\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def content_length(size: int) -> bytes:
    return b"content-length: %d\r\n" % size


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (never empty: that would end the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data)
