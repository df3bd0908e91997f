"""The one chunked decoder (``http1/framing.py``) and h11 reading the same chunked body:
the front door's request bodies and the clients' response bodies alike."""

from __future__ import annotations

import h11

from ollamatrio.http1.framing import MAX_CHUNK_LINE, ChunkedDecoder, FramingError

Reading = tuple[bytes, bool, bytes]  # the data, whether the body ended, the bytes behind it

REQUEST_HEAD = b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
RESPONSE_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def ours(pieces: list[bytes]) -> Reading | FramingError:
    """The decoder's reading of a body arriving as ``pieces`` (a connection's buffer)."""
    decoder = ChunkedDecoder()
    buffer = bytearray()
    body = bytearray()
    for piece in pieces:
        buffer += piece
        try:
            body += decoder.take(buffer)
        except FramingError as error:
            return error
    return bytes(body), decoder.done, bytes(buffer) if decoder.done else b""


def h11s(pieces: list[bytes], *, side: type[h11.SERVER] | type[h11.CLIENT]) -> Reading | Exception:
    """h11's reading of the same pieces: as a server reads a request body, or as a client
    reads a response's."""
    conn = h11.Connection(side, max_incomplete_event_size=MAX_CHUNK_LINE)
    if side is h11.CLIENT:
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
    conn.receive_data(REQUEST_HEAD if side is h11.SERVER else RESPONSE_HEAD)
    assert isinstance(conn.next_event(), h11.Request | h11.Response)
    body = bytearray()
    for index, piece in enumerate(pieces):
        if not piece:
            continue  # to h11, no bytes is the connection's end
        conn.receive_data(piece)
        while True:
            try:
                item = conn.next_event()
            except h11.RemoteProtocolError as error:
                return error
            if isinstance(item, h11.Data):
                body += item.data
            elif isinstance(item, h11.EndOfMessage):
                return bytes(body), True, conn.trailing_data[0] + b"".join(pieces[index + 1 :])
            else:
                assert item is h11.NEED_DATA, item
                break
    return bytes(body), False, b""


def compare(pieces: list[bytes]) -> Reading | FramingError:
    """The decoder against h11 on both sides; the decoder's reading."""
    mine = ours(pieces)
    for side in (h11.SERVER, h11.CLIENT):
        theirs = h11s(pieces, side=side)
        if isinstance(mine, FramingError):
            # h11 refuses it too, or it is a trailer h11 is laxer about.
            assert isinstance(theirs, Exception) or "trailer" in str(mine), (mine, theirs)
        else:
            assert not isinstance(theirs, Exception), f"we read {mine!r}, h11 says {theirs!r}"
            assert mine == theirs
    return mine
