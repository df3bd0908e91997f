"""The front door's request-head decision (``http/http1.py``) against h11's, over generated
heads: serve here (and where the body ends), hand the connection to hypercorn, or refuse
with 400; and for a chunked body the front door serves, its decoding (``ChunkedDecoder``):
the same data, ending at the same byte, or refused where h11 refuses it.

Hypercorn is h11, so a hand-off is always safe.  What must never happen is that the front
door serves a request h11 would refuse or read differently: another method, target or
headers, another body length (the next request would start at another byte), another
keep-alive or ``Expect`` decision; nor that the front door waits for more bytes where h11
would already answer (a client would wait for the head timeout).

The heads are built from pieces that go wrong in the ways request smuggling and lax parsers
do: Content-Length and Transfer-Encoding in every combination (duplicates, signs, spaces,
leading zeros, huge numbers, comma lists, ``chunked`` spelled otherwise), obsolete line
folding, bare LF and CR line ends, control bytes and NUL in names and values, odd request
lines, heads around the size and header-count limits, bodies cut short and bytes pipelined
behind, the bytes arriving in pieces.  The runs are derandomized: the same examples every
time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import h11
import pytest
from helpers import chunked
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ollamatrio.http import http1
from ollamatrio.http.http1 import HANDOFF, MAX_HEAD, MAX_HEADERS, BadRequest, Head
from ollamatrio.http1.framing import FramingError

EXAMPLES = 5_000  # per test; the two head tests below make 10,000
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
T = TypeVar("T")
SENTINEL = b"GET /sentinel HTTP/1.1\r\nHost: s\r\n\r\n"


# -- the two parsers -------------------------------------------------------------------


@dataclass
class Serve:
    head: Head
    end: int  # where the head ends (past its blank line) in the bytes


class HandOff:
    pass


class Refuse:
    pass


class Incomplete:
    pass


Decision = Serve | HandOff | Refuse | Incomplete


def front_door(pieces: list[bytes]) -> Decision:
    """What ``front._Connection`` decides for a connection's first request, its bytes
    arriving as ``pieces`` (its ``_read_until_head`` and ``_next_head``)."""
    buffer = bytearray()
    start = 0
    for piece in pieces:
        buffer += piece
        end = http1.head_end(buffer, start)
        if end is None:
            start = max(0, len(buffer) - 2)
            continue
        if end == HANDOFF:
            return HandOff()
        try:
            head = http1.parse_request(buffer, end)
        except BadRequest:
            return Refuse()
        return HandOff() if head is None else Serve(head, end)
    return Incomplete()


def h11_server() -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)  # as hypercorn


def h11_first_event(data: bytes) -> tuple[h11.Connection, object]:
    """h11's first event for ``data``: a ``Request``, ``NEED_DATA``, or the error."""
    conn = h11_server()
    conn.receive_data(data)
    try:
        return conn, conn.next_event()
    except h11.RemoteProtocolError as error:
        return conn, error


def h11_body(conn: h11.Connection) -> tuple[int, bool]:
    """The body h11 reads after the request: its length, and whether it ended."""
    size = 0
    while True:
        item = conn.next_event()
        if isinstance(item, h11.Data):
            size += len(item.data)
        elif isinstance(item, h11.EndOfMessage):
            return size, True
        else:
            assert item is h11.NEED_DATA, item
            return size, False


# -- the property ----------------------------------------------------------------------


def check(pieces: list[bytes]) -> Decision:
    """Compares the two parsers on a connection's first bytes; the front door's decision."""
    ours = front_door(pieces)
    compare(ours, b"".join(pieces), len(pieces[0]))
    return ours


def compare(ours: Decision, data: bytes, cut: int = 0) -> None:
    conn, first = h11_first_event(data)
    if isinstance(ours, Incomplete):
        # h11 must not have had enough either (nor have refused: the client would wait).
        assert first is h11.NEED_DATA, f"we wait for more, h11 says {first!r}"
        return
    if isinstance(ours, HandOff):
        return  # hypercorn (h11) decides
    if isinstance(ours, Refuse):
        # Only ambiguous framing is refused; h11 refuses it too, or it has a length.
        if isinstance(first, h11.Request):
            assert any(name == b"content-length" for name, _ in first.headers), first
        return
    head, end = ours.head, ours.end
    assert isinstance(first, h11.Request), f"we serve, h11 says {first!r}"
    assert first.http_version == head.version.encode()
    assert first.method.decode("ascii").upper() == head.method  # as hypercorn gives it
    assert first.target == head.target
    assert list(first.headers) == head.headers
    assert conn.they_are_waiting_for_100_continue == head.expect_continue
    assert conn.their_http_version == head.version.encode()
    if head.chunked:
        compare_chunked(data, end, cut)
        return
    # Where the body ends: h11 reads the same head and body from the same bytes, and then
    # the next request from the next byte.
    body_end = end + head.content_length
    if len(data) < body_end and head.content_length > 1 << 20:
        return  # a body too long to send here: the headers decide its length, and agree
    request = data[:body_end] + bytes(max(0, body_end - len(data)))
    conn = h11_server()
    conn.receive_data(request + (b"" if head.close else SENTINEL))
    assert isinstance(conn.next_event(), h11.Request)
    assert h11_body(conn) == (head.content_length, True)
    if head.close:
        assert conn.their_state is h11.MUST_CLOSE
        assert conn.next_event() is h11.NEED_DATA  # nothing left over
        return
    assert conn.their_state is h11.DONE
    conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
    conn.send(h11.EndOfMessage())
    conn.start_next_cycle()
    following = conn.next_event()
    assert isinstance(following, h11.Request), following
    assert following.target == b"/sentinel"
    assert h11_body(conn) == (0, True)


def body_pieces(data: bytes, end: int, cut: int) -> list[bytes]:
    """The bytes after the head that ends at ``end``, arriving in two pieces (split at
    ``cut`` if that is past the head)."""
    split = max(end, cut)
    return [data[end:split], data[split:]]


def compare_chunked(data: bytes, end: int, cut: int) -> None:
    """The front door decodes a chunked body as h11 does: the same data, the same end (the
    next request starts at the same byte), the same wait for more; it refuses what h11
    refuses (and, stricter, a trailer with bare LF or folded lines)."""
    chunked.compare(body_pieces(data, end, cut))


# -- the heads -------------------------------------------------------------------------
#
# A plain request (as the official clients and curl send them), then none, one or a few of
# the mutations below: most examples stay close to what the front door serves, the rest go
# wrong in one or two ways at a time.


def some(*items: T, common: T | None = None, weight: int = 6) -> st.SearchStrategy[T]:
    """One of ``items``; ``common`` (if given) ``weight`` times as often as each other."""
    return st.sampled_from(([common] * weight if common is not None else []) + list(items))


CONTROL = some(*(bytes([b]) for b in b"\x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f\x80\xff :,"))
METHOD = some(
    b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"get", b"Post", b"M-SEARCH",
    b"G@T", b"", b"GET\x00", b"G\tT", b"\xc3\xa9", b"CONNECT", b"connect", b"PRI", b"G:T",
)  # fmt: skip
TARGET = some(
    b"/api/generate", b"/api/chat?x=1", b"/a%20b", b"/v1/chat/completions", b"/", b"//", b"/?",
    b"/#f", b"/~x!$&'()*+,;=:@", b"*", b"http://h/x", b"/a b", b"/\x7f", b"", b"/\xc3\xa9",
    b"x", b"/\x00", b"/a\tb", b"/\r", b"/\n",
)  # fmt: skip
ODD_VERSION = some(
    b"HTTP/1.0", b"HTTP/2.0", b"http/1.1", b"HTTP/1.10", b"HTTP/1", b"HTTP/1.1 ", b"HTTP/0.9",
    b"HTTP/9.9", b"HTTP/1.1\x00", b" HTTP/1.1", b"HTTP/1.1\r",
)  # fmt: skip
ODD_SPACE = some(b"  ", b"\t", b"", b" \t", b"\x0b")
ODD_EOL = some(b"\n", b"\r", b"\r\r\n", b"\n\r", b"\r\n\r", b"\r\n\n", b" \r\n", b"\x00\r\n")
ODD_SEPARATOR = some(b" :", b"\t:", b"::", b": \r\n ", b":\r\n\t", b"", b":\x00", b"\x0b:")
OWS = some(b" ", b"\t", b"  ", b" \t ", b"\x0b", b"\x0c", b"\x00", b"\r")

DIGITS = st.integers(0, 40).map(lambda n: b"%d" % n)
ODD_LENGTH = some(
    b"9" * 18, b"9" * 19, b"1" + b"0" * 19, b"9" * 20, b"9" * 21, b"18446744073709551616",
    b"+5", b"-0", b"-5", b"5 5", b"5,5", b"5, 5", b"5,6", b",5", b"5,", b"0x5", b"5.0",
    b"1e1", b"", b"\x005", "\uff15".encode(), b"5\x0b", b"5\x00", b"\xb5", b"5\t", b"05",
    b"005", b"0", b"3", b"00000000000000000003", b"5, 5, 5", b"5,,5",
)  # fmt: skip
LENGTH = st.one_of(DIGITS, ODD_LENGTH)
CODING = some(
    b"Chunked", b"CHUNKED", b" chunked", b"chunked ", b"chunked, chunked", b"gzip, chunked",
    b"chunked, gzip", b"identity", b"", b"chunked\x00", b"xchunked", b"chunked;q=1",
    b"\tchunked", common=b"chunked",
)  # fmt: skip
CONNECTION = some(
    b"keep-alive", b"Close", b"keep-alive, close", b"upgrade", b"Upgrade, HTTP2-Settings",
    b"", b"clos e", b"close,", b",close", b" close ", b"CLOSE", b"closed", b"te", common=b"close",
)  # fmt: skip
EXPECT = some(b"100-Continue", b"200-ok", b"100-continue, foo", b"", b"100-continue ",
              common=b"100-continue")  # fmt: skip
HOST = some(b"127.0.0.1:11434", b"", b"a b", b"h\x01", b"[::1]", b"x, y", common=b"localhost")
TEXT = st.one_of(
    st.binary(max_size=8),
    some(b"", b"a", b"a b", b"a\tb", b"\xc3\xa9", b"a,b", b'"q"', b"=", b"x" * 40),
)
VALUES = {
    b"Content-Length": LENGTH,
    b"Transfer-Encoding": CODING,
    b"Connection": CONNECTION,
    b"Expect": EXPECT,
    b"Host": HOST,
    b"Upgrade": some(b"h2c", b"", common=b"websocket"),
    b"HTTP2-Settings": some(b"AAMAAABkAAQAAP__"),
    b"Keep-Alive": some(b"timeout=5"),
    b"X-Thing": TEXT,
}
# Heads as the official clients send them (captured from ollama-python 0.6 and openai-python
# against a socket; curl's as curl 7.88 sends a ``-d`` request), and a few plain ones.
CLIENT_HEADS = [
    b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:11434\r\nAccept-Encoding: gzip, deflate\r\n"
    b"Connection: keep-alive\r\ncontent-type: application/json\r\naccept: application/json\r\n"
    b"user-agent: ollama-python/0.6.3 (x86_64 linux) Python/3.11.7\r\nContent-Length: %d\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:11434\r\n"
    b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nauthorization: Bearer ollama"
    b"\r\naccept: application/json\r\ncontent-type: application/json\r\n"
    b"user-agent: OpenAI/Python 1.99.9\r\nx-stainless-lang: python\r\n"
    b"x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\nContent-Length: %d\r\n",
    b"POST /api/generate HTTP/1.1\r\nHost: localhost:11434\r\nUser-Agent: curl/7.88.1\r\n"
    b"Accept: */*\r\nContent-Length: %d\r\nContent-Type: application/x-www-form-urlencoded\r\n",
    b"GET /api/tags HTTP/1.1\r\nHost: localhost:11434\r\nUser-Agent: curl/7.88.1\r\n"
    b"Accept: */*\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n",
    b"HEAD /api/blobs/sha256:00 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n",
    b"PUT /x?y=%d HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n",
    b"DELETE /api/delete HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n",
]


class Request:
    """A request head in pieces: the request line, header lines, the blank line."""

    def __init__(self, head: bytes) -> None:
        line, *headers = head.split(b"\r\n")[:-1]
        self.start = b""  # before the request line
        method, target, version = line.split(b" ")
        self.line = [method, b" ", target, b" ", version, b"\r\n"]
        self.headers = [[*h.partition(b": "), b"\r\n"] for h in headers]
        # [name, separator, value, line end]
        self.blank = b"\r\n"
        self.extra = b""  # bytes that go in anywhere, at extra_at
        self.extra_at = -1

    def add(self, at: int, name: bytes, value: bytes) -> None:
        self.headers.insert(at % (len(self.headers) + 1), [name, b": ", value, b"\r\n"])

    def header(self, at: int) -> list[bytes]:
        if not self.headers:
            self.add(0, b"X-Thing", b"x")
        return self.headers[at % len(self.headers)]

    def bytes(self) -> bytes:
        head = self.start + b"".join(self.line)
        head += b"".join(b"".join(h) for h in self.headers) + self.blank
        if self.extra_at >= 0:
            at = self.extra_at % (len(head) + 1)
            head = head[:at] + self.extra + head[at:]
        return head

    def declared(self) -> int | None:
        """The first plain Content-Length: how long a body to send."""
        for name, _, value, _ in self.headers:
            if name.lower() == b"content-length" and value.strip().isdigit():
                return int(value.strip())
        return None


def insert(value: bytes, at: int, piece: bytes) -> bytes:
    at %= len(value) + 1
    return value[:at] + piece + value[at:]


INDEX = st.integers(0, 200)
FRAMING_KINDS = st.integers(0, 4)
FRAMING_NAME = some(b"Transfer-Encoding", b"Host", common=b"Content-Length", weight=3)
NOT_A_HEADER = some(b"X-Thing", b":", b": x", b"\x00", b"GET / HTTP/1.1")
ANY_NAME = st.sampled_from(list(VALUES))
START = some(b"\r\n", b"\n", b" ", b"\x00", b"\x16\x03\x01")
ALL_KINDS = st.integers(0, 18)
NAME_OR_VALUE = st.sampled_from([0, 2])


def mutate(draw: st.DrawFn, request: Request, framing_only: bool) -> None:
    """Changes ``request`` in one way that parsers tend to read differently."""
    kind = draw(FRAMING_KINDS if framing_only else ALL_KINDS)
    at = draw(INDEX)
    if kind == 0:  # another framing header
        name = draw(FRAMING_NAME)
        spelling = (name, name, name.lower(), name.upper())[at % 4]
        request.add(at // 4, spelling, draw(VALUES[name]))
    elif kind == 1:  # an odd Content-Length
        lengths = [h for h in request.headers if h[0].lower() == b"content-length"]
        if lengths:
            lengths[at % len(lengths)][2] = draw(LENGTH)
        else:
            request.add(at, b"Content-Length", draw(LENGTH))
    elif kind == 2:  # an odd line end
        if at % 4 == 0:
            request.line[5] = draw(ODD_EOL)
        elif at % 4 == 1:
            request.blank = draw(ODD_EOL)
        else:
            request.header(at)[3] = draw(ODD_EOL)
    elif kind == 3:  # a control byte (or SP, HT, ":" ...) in a name or a value
        line = request.header(at)
        where = draw(NAME_OR_VALUE)
        line[where] = insert(line[where], draw(INDEX), draw(CONTROL))
    elif kind == 4:  # odd whitespace around a value
        line = request.header(at)
        value = b"" if at % 5 == 0 else line[2]
        line[2] = draw(OWS) + value + draw(OWS) if at % 2 else value + draw(OWS)
    elif kind == 5:
        request.line[0] = draw(METHOD)
    elif kind == 6:
        request.line[2] = draw(TARGET)
    elif kind == 7:
        request.line[4] = draw(ODD_VERSION)
    elif kind == 8:
        request.line[1 + 2 * (at % 2)] = draw(ODD_SPACE)
    elif kind == 9:  # obsolete line folding: a continuation line
        fold = (b" ", b"\t", b"  ")[at % 3] + draw(TEXT)
        request.headers.insert(at % (len(request.headers) + 1), [fold, b"", b"", b"\r\n"])
    elif kind == 10:
        request.header(at)[1] = draw(ODD_SEPARATOR)
    elif kind == 11:  # a line that is not a header
        text = draw(NOT_A_HEADER)
        request.headers.insert(at % (len(request.headers) + 1), [text, b"", b"", b"\r\n"])
    elif kind == 12:
        name = draw(ANY_NAME)
        request.add(at, name, draw(VALUES[name]))
    elif kind == 13:  # a byte anywhere
        request.extra, request.extra_at = draw(CONTROL), draw(INDEX)
    elif kind == 14:
        request.start = draw(START)
    elif kind == 15:  # around the header count limit
        count = MAX_HEADERS + at % 6 - 3 - len(request.headers)
        request.headers += [[b"X-Filler-%d" % i, b": ", b"x", b"\r\n"] for i in range(count)]
    elif kind == 16:  # around the size limit
        size = MAX_HEAD + at % 12 - 6 - len(request.bytes()) - len(b"X-Big: \r\n")
        request.add(at, b"X-Big", b"b" * max(0, size))
    elif kind == 17:  # no Host
        request.headers = [h for h in request.headers if h[0].lower() != b"host"]
    else:  # a header's name in another case
        line = request.header(at)
        line[0] = (line[0].lower(), line[0].upper(), line[0].swapcase())[at % 3]


@st.composite
def chunked_bodies(draw: st.DrawFn) -> bytes:
    """A chunked body as clients send it, or gone wrong in the ways chunk parsers differ:
    size spellings, extensions, line ends, footers, the last chunk, trailers."""
    out = b""
    for data in draw(st.lists(st.binary(min_size=1, max_size=12), max_size=3)):
        size = b"%x" % len(data)
        size = draw(some(
            size.upper(), b"0" + size, size + b";ext=1", size + b" ", size + b"\t;x",
            size + b";\r", size + b"; x\x00", b"+" + size, b"0x" + size, b" " + size,
            b"%x" % (len(data) + 1), b"", b"g", common=size, weight=60,
        ))  # fmt: skip
        line_end = draw(some(b"\n", b"\r", b"\r\r\n", common=b"\r\n", weight=60))
        footer = draw(some(b"\n", b"", b"x\r\n", b"\r\r\n", b"\r", common=b"\r\n", weight=60))
        out += size + line_end + data + footer
    last = draw(some(b"00", b"0;x", b"0" * 20, b"0" * 21, b"0 ", common=b"0", weight=12))
    trailer = draw(some(
        b"X: y\r\n", b"X: y\n", b"X: y\r\n folded\r\n", b"bad\r\n", b"X:\x00\r\n",
        b"X: y\r\nZ: w\r\n", common=b"", weight=12,
    ))  # fmt: skip
    end = draw(some(b"\n", b"", common=b"\r\n", weight=12))
    return out + last + b"\r\n" + trailer + end


PIPELINED = some(
    SENTINEL, SENTINEL[:10], b"0\r\n\r\n", b"\r\n", b"x", SENTINEL.replace(b"\r\n", b"\n"),
    common=b"", weight=12,
)  # fmt: skip


GIVE_OR_TAKE = some(-1, 1, 5, common=0, weight=8)
MUTATIONS = st.integers(0, 3)
LENGTHS = st.integers(0, 40)
CUT = st.integers(0, 1000)
BODY = b'{"model":"tiny","prompt":"hi"}' * 3


@st.composite
def connections(draw: st.DrawFn, framing_only: bool = False) -> list[bytes]:
    """A connection's first bytes (a request, maybe more behind it), in the pieces they
    arrive in."""
    head = draw(st.sampled_from(CLIENT_HEADS))
    request = Request(head.replace(b"%d", b"%d" % draw(LENGTHS)))
    for _ in range(draw(MUTATIONS)):
        mutate(draw, request, framing_only)
    head = request.bytes()
    # The body: as long as the first plain length says (give or take), else a few bytes.
    declared = request.declared()
    size = draw(GIVE_OR_TAKE)
    if declared is not None and declared <= 64:
        size = max(0, declared + size)
    body = BODY[: max(0, size)]
    if any(h[0].lower() == b"transfer-encoding" for h in request.headers):
        body = draw(chunked_bodies())
    data = head + body + draw(PIPELINED)
    cut = draw(CUT) % (len(data) + 1)  # the bytes come in two pieces
    return [data[:cut], data[cut:]]


@SETTINGS
@given(connections())
def test_the_front_door_reads_requests_as_h11_does(pieces: list[bytes]) -> None:
    event(name(check(pieces)))


@SETTINGS
@given(connections(framing_only=True))
def test_the_front_door_frames_bodies_as_h11_does(pieces: list[bytes]) -> None:
    """Content-Length and Transfer-Encoding, line ends, bytes in names and values only."""
    event(name(check(pieces)))


@st.composite
def chunked_requests(draw: st.DrawFn) -> list[bytes]:
    """A chunked request (as curl sends one with ``-H 'Transfer-Encoding: chunked'``), its
    body generated to go wrong, maybe more bytes behind, arriving in two pieces."""
    head = draw(some(
        b"POST /api/generate HTTP/1.1\r\nHost: localhost:11434\r\nUser-Agent: curl/7.88.1\r\n"
        b"Accept: */*\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n",
        b"POST /api/blobs/sha256:00 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Expect: 100-continue\r\n\r\n",
        b"POST /api/chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Transfer-Encoding: CHUNKED\r\n\r\n",
    ))  # fmt: skip
    data = head + draw(chunked_bodies()) + draw(PIPELINED)
    cut = draw(CUT) % (len(data) + 1)
    return [data[:cut], data[cut:]]


@settings(SETTINGS, max_examples=2_000)
@given(chunked_requests())
def test_the_front_door_decodes_chunked_bodies_as_h11_does(pieces: list[bytes]) -> None:
    decision = check(pieces)
    assert isinstance(decision, Serve)
    ours = chunked.ours(body_pieces(b"".join(pieces), decision.end, len(pieces[0])))
    event("refused" if isinstance(ours, FramingError) else "ended" if ours[1] else "incomplete")


def name(decision: Decision) -> str:
    """The decision, and for a chunked body served here how its decoding ended."""
    if isinstance(decision, Serve) and decision.head.chunked:
        return "Serve chunked"
    return type(decision).__name__


# -- the cases the generated ones grew from ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "decision"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Serve),
        (b"GET / HTTP/1.1\nHost: x\n\n", HandOff),  # bare LF: h11 reads it, at once
        (b"GET / HTTP/1.1\r\nHost: x\r\n\n", HandOff),
        (b"GET / HTTP/1.1\r\nHost: x\n\r\n", HandOff),
        (b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", HandOff),  # h11: 400
        (b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", HandOff),
        (b"CONNECT /x HTTP/1.1\r\nHost: x\r\n\r\n", HandOff),  # h11: a tunnel after 2xx
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nab", HandOff),  # pipelined
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5,5\r\n\r\n", Refuse),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: x\r\n\r\n",
            Refuse,
        ),
        (b"GET / HTTP/1.1\r\nHost: x\r\n", Incomplete),
        (b"GET / HTTP/1.0\r\n\r\n", Serve),  # no Host needed; never kept alive
        (b"POST / HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", Serve),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", HandOff),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            Serve,
        ),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked \r\n\r\n0\r\n\r\n", Serve),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", HandOff),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            HandOff,
        ),
    ],
)
def test_known_heads(raw: bytes, decision: type) -> None:
    assert isinstance(check([raw]), decision)
