"""HTTP/1.1 framing that the server and the clients share: the grammar of header lines, a
response head, and ``Transfer-Encoding: chunked`` bodies.

:class:`ChunkedDecoder` reads a chunked body as h11 reads it: the same data, ending at the
same byte (so whatever follows on the connection starts where h11 would start it), refusing
what h11 refuses.  The front door decodes request bodies with it, the clients decode the
runner's and the hosts' answers with it (``tests/test_http1_chunked.py`` holds it to h11).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# Where h11 ends a head: the first blank line, CRLF or bare LF line ends alike.
BLANK_LINE: Final = re.compile(rb"\n\r?\n")
TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name, a method
BAD_VALUE: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # never in a header value

# A chunk's size line as h11 reads it: 1 to 20 hex digits, any extension (ignored), CRLF.
_CHUNK_SIZE: Final = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*\r\n")
_HEX_DIGITS: Final = b"0123456789abcdefABCDEF"
MAX_CHUNK_LINE: Final = 16 * 1024  # a size line (or the trailer) longer than this is refused


class FramingError(ValueError):
    """Bytes that are not HTTP/1.1 framing as h11 reads it."""


class ChunkedDecoder:
    """A chunked body, decoded from a connection's buffer as its bytes arrive, as h11 decodes
    it.  Chunk extensions and trailer fields are read and dropped; a trailer is refused where
    its lines are not plain CRLF header lines (h11 would also take bare LF and obsolete
    folding there)."""

    def __init__(self) -> None:
        self._left = 0  # bytes of the current chunk's data still to come
        self._footer = b""  # what must still follow the current chunk's data
        self._trailer = False  # the last chunk was read: the trailer (or blank line) is next
        self.done = False  # the whole body was read

    def take(self, buffer: bytearray) -> bytes:
        """The body bytes that the start of ``buffer`` holds, consumed from it (everything
        past the body's end stays); ``b""`` when more bytes are needed or the body is done.

        Raises:
            FramingError: malformed chunk framing.
        """
        if not (self._left or self._footer or self._trailer):
            # The common case while streaming: the buffer holds exactly one whole chunk with
            # no extension (llama.cpp writes an event a chunk, and a read takes what one
            # write sent).
            eol = buffer.find(b"\r\n", 0, 10)
            if eol > 0 and not buffer[:eol].strip(_HEX_DIGITS):
                end = eol + 2 + int(buffer[:eol], 16)
                if end > eol + 2 and len(buffer) == end + 2 and buffer.endswith(b"\r\n"):
                    data = bytes(buffer[eol + 2 : end])
                    buffer.clear()
                    return data
        out = bytearray()
        while not self.done:
            if self._trailer:
                self._take_trailer(buffer)
                break
            if self._footer:
                seen = bytes(buffer[: len(self._footer)])
                if seen != self._footer[: len(seen)]:
                    raise FramingError("malformed chunk: no CRLF after its data")
                del buffer[: len(seen)]
                self._footer = self._footer[len(seen) :]
                if self._footer:
                    break
            if not self._left:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_CHUNK_LINE:
                        raise FramingError("chunk size line too long")
                    break
                match = _CHUNK_SIZE.fullmatch(buffer, 0, end + 2)
                if match is None:
                    raise FramingError("bad chunk size line")
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
        match = BLANK_LINE.search(buffer)
        if match is None:
            if len(buffer) > MAX_CHUNK_LINE:
                raise FramingError("chunked trailer too long")
            return
        blank = match.start() - 1
        if match.end() - blank != 4 or buffer[blank] != 0x0D:
            raise FramingError("a chunked trailer with bare LF line ends")
        for line in bytes(buffer[:blank]).split(b"\r\n"):
            name, colon, value = line.partition(b":")
            if not colon or not TOKEN.fullmatch(name) or BAD_VALUE.search(value):
                raise FramingError("malformed chunked trailer")
        del buffer[: match.end()]
        self.done = True


@dataclass(frozen=True)
class ResponseHead:
    """A response's status line and headers, and how its body is framed."""

    status: int
    headers: list[tuple[bytes, bytes]]  # names lower-cased, values stripped, in order
    length: int | None  # Content-Length, if given
    chunked: bool
    close: bool  # the peer closes the connection after this response

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


def parse_response_head(raw: bytes) -> ResponseHead:
    """``raw`` (up to, not including, the blank line) as a response head.  Read leniently:
    the peers are the project's own servers and llama.cpp's.

    Raises:
        FramingError: no status code in the status line.
    """
    status_line, *lines = raw.split(b"\r\n")
    try:
        status = int(status_line.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise FramingError(f"bad status line {status_line!r}") from None
    headers = []
    for line in lines:
        name, _, value = line.partition(b":")
        headers.append((name.strip().lower(), value.strip()))
    fields = dict(headers)
    length = fields.get(b"content-length")
    return ResponseHead(
        status,
        headers,
        int(length) if length is not None and length.isdigit() else None,
        fields.get(b"transfer-encoding", b"").lower() == b"chunked",
        b"close" in fields.get(b"connection", b"").lower(),
    )
