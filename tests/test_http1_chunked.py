"""The one chunked decoder (``http1/framing.py``) against h11's, on its own: the request
bodies the front door reads and the response bodies the runner and host clients read.

For the same bytes, arriving in any pieces, the decoder gives the same data as h11, ends the
body at the same byte (what follows is the next message), waits for more where h11 does, and
refuses what h11 refuses; it is stricter in one place only: a trailer whose lines are not
plain CRLF header lines.  Generated bodies go wrong in the ways chunk parsers differ (size
spellings, extensions, line ends, the CRLF after the data, the last chunk, trailers); the
table below holds the cases they grew from, each with its expected reading.
"""

from __future__ import annotations

import random

import h11
import pytest
from helpers.chunked import Reading, compare, h11s, ours
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ollamatrio.http1.framing import MAX_CHUNK_LINE, ChunkedDecoder, FramingError

SETTINGS = settings(
    max_examples=2_000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# -- generated bodies ----------------------------------------------------------------------


def some(*items: bytes, common: bytes, weight: int) -> st.SearchStrategy[bytes]:
    return st.sampled_from([common] * weight + list(items))


@st.composite
def bodies(draw: st.DrawFn) -> list[bytes]:
    """A chunked body as the peers write it, or gone wrong in the ways parsers differ: its
    chunks as written, one a piece."""
    out = []
    for data in draw(st.lists(st.binary(min_size=1, max_size=20), max_size=4)):
        size = b"%x" % len(data)
        size = draw(some(
            size.upper(), b"0" + size, b"0" * 19 + size, size + b";ext=1", size + b";a=\"b;c\"",
            size + b" ", size + b"\t;x", size + b";\r", size + b"; x\x00", b"+" + size,
            b"0x" + size, b" " + size, b"-" + size, b"%x" % (len(data) + 1),
            b"%x" % (len(data) - 1), b"", b"g", b"1" * 21, common=size, weight=80,
        ))  # fmt: skip
        line_end = draw(some(b"\n", b"\r", b"\r\r\n", common=b"\r\n", weight=60))
        footer = draw(
            some(b"\n", b"", b"x\r\n", b"\r\r\n", b"\r", b"\n\r", b"xy", common=b"\r\n", weight=60)
        )
        out.append(size + line_end + data + footer)
    last = draw(some(b"00", b"0;x=y", b"0" * 20, b"0" * 21, b"0 ", b"0\t", common=b"0", weight=10))
    trailer = draw(some(
        b"X: y\r\n", b"X: y\n", b"X: y\r\n folded\r\n", b"bad\r\n", b"X:\x00\r\n",
        b"X: y\r\nZ: w\r\n", b"X y: z\r\n", b"X:\r\n", common=b"", weight=10,
    ))  # fmt: skip
    end = draw(some(b"\n", b"", b"\r", common=b"\r\n", weight=10))
    behind = draw(some(b"GET / HTTP/1.1\r\n", b"0\r\n\r\n", b"\r\n", common=b"", weight=6))
    return [*out, last + b"\r\n" + trailer + end + behind]


@SETTINGS
@given(bodies(), st.randoms(use_true_random=False))
def test_the_decoder_reads_chunked_bodies_as_h11_does(
    chunks: list[bytes], rng: random.Random
) -> None:
    """The bytes arrive a chunk a read (as llama.cpp streams), or cut anywhere."""
    pieces = chunks
    if rng.random() < 0.7:
        data = b"".join(chunks)
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 6))))
        pieces = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    mine = compare(pieces)
    event("refused" if isinstance(mine, FramingError) else "ended" if mine[1] else "waits")


def test_one_chunk_a_read_as_a_stream_arrives() -> None:
    """llama.cpp writes an event a chunk and a read takes one write: each read's chunk is
    handed over whole (the decoder's fast path), and the body ends at the last chunk."""
    events = [b'data: {"content": "%d"}\n\n' % n for n in range(30)] + [b"x" * 70000]
    pieces = [b"%x\r\n%b\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]
    decoder = ChunkedDecoder()
    buffer = bytearray()
    for piece, expected in zip(pieces, [*events, b""], strict=True):
        buffer += piece
        assert decoder.take(buffer) == expected
        assert not buffer
    assert decoder.done
    assert compare(pieces) == (b"".join(events), True, b"")


# -- the cases they grew from ----------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reading"),
    [
        (b"3\r\nabc\r\n0\r\n\r\n", (b"abc", True, b"")),
        (b"3\r\nabc\r\n0\r\n\r\nNEXT", (b"abc", True, b"NEXT")),
        (b"3;ext=1\r\nabc\r\n0;last\r\n\r\n", (b"abc", True, b"")),  # extensions: dropped
        (b'3;a="b;c"\r\nabc\r\n0\r\n\r\n', (b"abc", True, b"")),
        (b"A\r\n0123456789\r\n0\r\n\r\n", (b"0123456789", True, b"")),  # upper-case hex
        (b"0003\r\nabc\r\n0\r\n\r\n", (b"abc", True, b"")),  # leading zeros
        (b"3 \r\nabc\r\n0\r\n\r\n", (b"abc", True, b"")),  # whitespace after the size
        (b"3\r\na\r\n\r\n0\r\n\r\n", (b"a\r\n", True, b"")),  # CRLF inside the data
        (b"0\r\nX: y\r\nZ: w\r\n\r\nNEXT", (b"", True, b"NEXT")),  # trailer fields: dropped
        (b"0\r\n\n", (b"", True, b"")),  # h11 ends an empty trailer at a bare LF too
        (b"3\r\nab", (b"ab", False, b"")),  # the rest of the chunk still to come
        (b"3\r\nabc\r\n0\r\n", (b"abc", False, b"")),  # the trailer still to come
        (b"3\r\nabc\r\n0\r\nX: y\r\n", (b"abc", False, b"")),  # a trailer still to come ...
        (b"3\r\nabc", (b"abc", False, b"")),  # ... and the CRLF after the data
        (b"zz\r\nabc\r\n", "bad chunk size line"),
        (b"\r\nabc\r\n", "bad chunk size line"),  # no size at all
        (b"+3\r\nabc\r\n0\r\n\r\n", "bad chunk size line"),
        (b"0x3\r\nabc\r\n0\r\n\r\n", "bad chunk size line"),
        (b" 3\r\nabc\r\n0\r\n\r\n", "bad chunk size line"),
        (b"3\nabc\r\n0\r\n\r\n", "bad chunk size line"),  # a bare LF after the size
        (b"1" * 21 + b"\r\n", "bad chunk size line"),  # h11 reads 20 hex digits at most
        (b"3\r\nabcX\r\n0\r\n\r\n", "no CRLF after its data"),
        (b"0\r\nX: y\r\n folded\r\n\r\n", "malformed chunked trailer"),
        (b"0\r\nbad\r\n\r\n", "malformed chunked trailer"),
        (b"1" * (MAX_CHUNK_LINE + 1), "chunk size line too long"),
    ],
)
def test_known_bodies(data: bytes, reading: Reading | str) -> None:
    for cut in range(len(data) + 1) if len(data) < 64 else (0, len(data) // 2):
        mine = compare([data[:cut], data[cut:]])
        if isinstance(reading, str):
            assert isinstance(mine, FramingError)
            assert reading in str(mine)
        else:
            assert mine == reading


def test_a_bare_lf_trailer_is_refused_where_h11_takes_it() -> None:
    """The one place the decoder is stricter than h11: trailer lines must end in CRLF."""
    data = b"0\r\nX: y\nZ: w\n\n"
    assert isinstance(ours([data]), FramingError)
    assert h11s([data], side=h11.CLIENT) == (b"", True, b"")
