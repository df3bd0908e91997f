"""The slice of HTTP/1.1 the front door speaks itself: strict request heads (HTTP/1.1, and
HTTP/1.0 as h11 reads it: never kept alive), chunked request bodies, response heads and chunk
framing.

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

MAX_HEAD = 16 * 1024  # bytes, as hypercorn's h11_max_incomplete_size
MAX_HEADERS = 100
_MAX_LENGTH_DIGITS = 18  # a Content-Length longer than this is no body we would read

# Where h11 ends a head: the first blank line, CRLF or bare LF line ends alike.
_BLANK_LINE = re.compile(rb"\n\r?\n")
HANDOFF = -1  # head_end(): the connection is hypercorn's
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_VERSIONS = frozenset((b"HTTP/1.1", b"HTTP/1.0"))
_TARGET = re.compile(rb"/[\x21-\x7e]*")  # origin form, printable ASCII (hypercorn decodes it)
# The bytes a request can start with (a method): anything else (TLS, an h2 preface is caught
# later) is not HTTP/1.1 as the front door speaks it.
TOKEN_BYTES = frozenset(b"!#$%&'*+-.^_`|~0123456789" + bytes(range(65, 91)) + bytes(range(97, 123)))


class BadRequest(Exception):
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
    match = _BLANK_LINE.search(buffer, start)
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
    if version not in _VERSIONS or not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
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
        if not colon or not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
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


# A chunk's size line as h11 reads it: 1 to 20 hex digits, any extension (ignored), CRLF.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*\r\n")
MAX_CHUNK_LINE = MAX_HEAD  # a size line (or the trailer) longer than this is refused


class ChunkedBody:
    """A chunked request body, decoded from the connection's buffer as its bytes arrive, as
    h11 decodes it: the same data, ending at the same byte (so the next request starts where
    h11 would start it).  Chunk extensions and trailer fields are read and dropped; a trailer
    is refused where its lines are not plain CRLF header lines (h11 would also take bare LF
    and obsolete folding there)."""

    def __init__(self) -> None:
        self._left = 0  # bytes of the current chunk's data still to come
        self._footer = b""  # what must still follow the current chunk's data
        self._trailer = False  # the last chunk was read: the trailer (or blank line) is next
        self.done = False  # the whole body was read

    def take(self, buffer: bytearray) -> bytes:
        """The body bytes that the start of ``buffer`` holds, consumed from it (everything
        past the body's end stays); ``b""`` when more bytes are needed or the body is done.

        Raises:
            BadRequest: malformed chunk framing.
        """
        out = bytearray()
        while not self.done:
            if self._trailer:
                self._take_trailer(buffer)
                break
            if self._footer:
                seen = bytes(buffer[: len(self._footer)])
                if seen != self._footer[: len(seen)]:
                    raise BadRequest("malformed chunk: no CRLF after its data")
                del buffer[: len(seen)]
                self._footer = self._footer[len(seen) :]
                if self._footer:
                    break
            if not self._left:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_CHUNK_LINE:
                        raise BadRequest("chunk size line too long")
                    break
                match = _CHUNK_SIZE.fullmatch(buffer, 0, end + 2)
                if match is None:
                    raise BadRequest("malformed chunk size line")
                self._left = int(match.group(1), 16)
                del buffer[: end + 2]
                if not self._left:
                    self._trailer = True
                    continue
            piece = buffer[: self._left]
            if not piece:
                break
            out += piece
            del buffer[: len(piece)]
            self._left -= len(piece)
            if not self._left:
                self._footer = b"\r\n"
        return bytes(out)

    def _take_trailer(self, buffer: bytearray) -> None:
        """The trailer after the last chunk: a blank line, or header lines and a blank line
        (h11 ends it at the first blank line, CRLF or bare LF)."""
        if buffer[:1] == b"\n" or buffer[:2] == b"\r\n":  # no trailer fields: h11 takes both
            del buffer[: 1 if buffer[:1] == b"\n" else 2]
            self.done = True
            return
        match = _BLANK_LINE.search(buffer)
        if match is None:
            if len(buffer) > MAX_CHUNK_LINE:
                raise BadRequest("chunked trailer too long")
            return
        blank = match.start() - 1
        if match.end() - blank != 4 or buffer[blank] != 0x0D:
            raise BadRequest("a chunked trailer with bare LF line ends")
        for line in bytes(buffer[:blank]).split(b"\r\n"):
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
                raise BadRequest("malformed chunked trailer")
        del buffer[: match.end()]
        self.done = True


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
