"""The gateway's splice of a chunked body (ollamatrio/fleet/gateway_splice.py): where the
chunks end, read in any pieces; the pump's end, its failures and its stop."""

from __future__ import annotations

import os
import socket

import pytest
import trio

from ollamatrio.fleet.gateway_splice import ChunkFraming, FramingError, pump, splice

FIRST = 52  # the first chunk's bytes: size line, 46 bytes of data, CRLF
BODY = (
    b'2e\r\n{"model":"m0","response":" fox","done":false}\n\r\n'
    b"5;ext=1\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n"
)


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(BODY)])
def test_the_end_of_a_chunked_body_is_found_in_any_pieces(step: int) -> None:
    framing = ChunkFraming()
    ends = []
    for start in range(0, len(BODY) + 8, step):
        piece = (BODY + b"NEXT")[start : start + step]
        if framing.finished or not piece:
            break
        end = framing.feed(piece)
        if end is not None:
            ends.append(start + end)
    assert ends == [len(BODY)]
    assert framing.finished


def test_whole_chunks_are_a_boundary_and_a_bad_size_line_fails() -> None:
    assert BODY[FIRST:].startswith(b"5;ext")
    framing = ChunkFraming()
    assert framing.feed(BODY[:FIRST]) is None  # the first chunk, whole
    assert framing.at_boundary
    assert framing.feed(b"5\r\nhel") is None
    assert not framing.at_boundary
    with pytest.raises(FramingError):
        ChunkFraming().feed(b"zz\r\n")


def pairs() -> tuple[socket.socket, socket.socket, socket.socket, socket.socket]:
    host_side, gateway_in = socket.socketpair()
    gateway_out, client = socket.socketpair()
    for sock in (gateway_in, gateway_out):
        sock.setblocking(False)
    return host_side, gateway_in, gateway_out, client


def test_the_pump_passes_the_body_on_unchanged_and_keeps_what_follows() -> None:
    host, up, down, client = pairs()
    stop_read, stop_write = os.pipe()
    host.sendall(BODY[10:] + b"HTTP/1.1 200")  # the next answer's start: not passed on
    done = pump(BODY[:10], up.fileno(), down.fileno(), stop_read)
    assert done.outcome == "done"
    assert done.leftover == b"HTTP/1.1 200"  # read with the body's end
    assert client.recv(65536) == BODY
    for fd in (stop_read, stop_write):
        os.close(fd)
    for sock in (host, up, down, client):
        sock.close()


def test_the_pump_says_the_host_failed_and_whether_the_client_got_whole_chunks() -> None:
    for cut, whole in ((FIRST, True), (FIRST + 3, False)):
        host, up, down, client = pairs()
        stop_read, stop_write = os.pipe()
        host.sendall(BODY[:cut])
        host.close()
        failed = pump(b"", up.fileno(), down.fileno(), stop_read)
        assert (failed.outcome, failed.at_boundary) == ("host_failed", whole)
        for fd in (stop_read, stop_write):
            os.close(fd)
        for sock in (up, down, client):
            sock.close()


async def test_a_cancelled_splice_stops_its_thread() -> None:
    host, up, down, client = pairs()
    with trio.fail_after(5):
        with trio.move_on_after(0.2) as scope:
            await splice(b"", up.fileno(), down.fileno())  # the host sends nothing
    assert scope.cancelled_caught
    # The thread has returned: the sockets are ours again.
    host.sendall(b"more")
    assert up.recv(10) == b"more"
    for sock in (host, up, down, client):
        sock.close()
