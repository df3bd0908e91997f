"""The accept loop (http/accept.py): out of descriptors, one warning line a second at most
with a count, a back-off between tries (cut short when a connection closes), no traceback;
other accept errors are raised, and the listener is closed when the loop ends."""

from __future__ import annotations

import errno
import logging
from typing import Any

import pytest
import trio

from ollamatrio.http import accept
from ollamatrio.http.accept import accept_loop


class FailingListener:
    """A listener whose accept fails with ``error`` until ``fail_until`` (trio time), then
    hands out ``streams``; counts its tries."""

    def __init__(self, error: int, fail_until: float, streams: int = 1) -> None:
        self.error = error
        self.fail_until = fail_until
        self.streams = streams
        self.tries = 0
        self.closed = False

    async def accept(self) -> Any:
        await trio.lowlevel.checkpoint()
        self.tries += 1
        if trio.current_time() < self.fail_until:
            raise OSError(self.error, "Too many open files")
        if self.streams:
            self.streams -= 1
            return object()
        await trio.sleep_forever()

    async def __aenter__(self) -> FailingListener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True


async def test_running_out_of_descriptors_is_one_line_a_second(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    listener = FailingListener(errno.EMFILE, fail_until=20.0)
    handled: list[object] = []

    async def handler(stream: object) -> None:
        handled.append(stream)

    caplog.set_level(logging.INFO, logger=accept.__name__)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_loop, listener, handler, nursery)  # type: ignore[arg-type]
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert len(handled) == 1  # served once descriptors were free again
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    # 20 s of failures: at most a line a second (and some, with the count and the error).
    assert 5 <= len(warnings) <= 21
    assert all(r.exc_info is None for r in caplog.records)  # no tracebacks
    assert "Too many open files" in warnings[0].getMessage()
    assert "1 failed" in warnings[0].getMessage()
    assert any("failed in the last" in w.getMessage() and " 1 failed" not in w.getMessage()
               for w in warnings[1:])  # fmt: skip
    # Backed off: 0.1 s doubling to 1 s, about 24 tries in 20 s rather than 200.
    assert listener.tries < 40
    assert "accepting client connections again" in caplog.text
    assert listener.closed


async def test_a_closing_connection_ends_the_back_off(autojump_clock: Any) -> None:
    listener = FailingListener(errno.ENFILE, fail_until=0.5)
    freed = trio.Event()
    handled = trio.Event()

    async def handler(stream: object) -> None:
        handled.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_loop, listener, handler, nursery, freed.wait)  # type: ignore[arg-type]
        await trio.sleep(0.6)  # failed a few times: backing off up to 0.4 s now
        started = trio.current_time()
        freed.set()  # a connection closed: its descriptor is free
        await handled.wait()
        assert trio.current_time() - started < 0.01
        nursery.cancel_scope.cancel()


async def test_other_accept_errors_are_raised(autojump_clock: Any) -> None:
    listener = FailingListener(errno.EBADF, fail_until=1.0)

    async def handler(stream: object) -> None:
        pass

    with pytest.raises(ExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept_loop, listener, handler, nursery)  # type: ignore[arg-type]
    assert raised.group_contains(OSError)
    assert listener.closed
