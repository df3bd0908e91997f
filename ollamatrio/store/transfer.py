"""What pulls and pushes share: following one blob's transfer as progress events, turning a
nursery's errors into one, and running a transfer whose failure is its stream's last event."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

import trio

from ..errors import OllamatrioError
from .manifest import Layer, os_reason
from .names import ModelName

log = logging.getLogger("ollamatrio.store.transfer")

Event = dict[str, Any]


class TransferError(OllamatrioError):
    """Several transfers failed at once; the message lists them."""


class Watched(Protocol):
    """A blob's transfer that progress can be read from."""

    @property
    def changed(self) -> trio.Event:
        """Set at the next change of progress or state (take it before awaiting anything)."""
        ...

    def progress(self) -> Event: ...


W = TypeVar("W", bound=Watched)


async def report_until(
    task: W, send: trio.MemorySendChannel[Event], done: Callable[[W], bool], heartbeat: float
) -> None:
    """Send ``task``'s progress on every change, up to the state where ``done(task)``.

    A slow reader gets the latest numbers, never a backlog: the transfer goes on while
    this waits on ``send``.  While nothing changes the numbers are repeated every
    ``heartbeat`` seconds (Ollama repeats them every 60 ms), so a closed channel is seen.
    """
    last: Event | None = None
    while True:
        # Both read before any await: a change during the send sets ``changed``, and the
        # event sent last is the one read after ``done`` became true.
        changed, finished = task.changed, done(task)
        event = task.progress()
        if event != last:
            await send.send(event)
            last = event
        if finished:
            return
        with trio.move_on_after(heartbeat) as idle:
            await changed.wait()
        if idle.cancelled_caught:
            last = None


def unique_layers(layers: Iterable[Layer]) -> Iterator[Layer]:
    seen: set[str] = set()
    for layer in layers:
        if layer.digest not in seen:
            seen.add(layer.digest)
            yield layer


async def report_failure(
    send: trio.MemorySendChannel[Event],
    verb: str,
    model: ModelName,
    transfer: Callable[[], Awaitable[None]],
) -> None:
    """Run ``transfer`` (a pull or push sending to ``send``), closing ``send`` after it; a
    failure arrives as a last ``{"error": message}`` event (Ollama's stream shape).  Nothing
    escapes: a transfer must never take the app's nursery down with it."""
    with send:
        error: str | None = None
        try:
            await transfer()
        except trio.BrokenResourceError:
            log.info("%s of %s stopped: nobody is listening", verb, model.display_shortest)
        except OllamatrioError as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("%s of %s failed", verb, model.display_shortest)
            # An OS error's file names are the server's paths: the log has them, not the client.
            error = (
                f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, OSError)
                else f"{verb} {model.display_shortest}: {os_reason(exc)}"
            )
        if error is not None:
            log.info("%s of %s failed: %s", verb, model.display_shortest, error)
            with contextlib.suppress(trio.BrokenResourceError):
                await send.send({"error": error})


@contextlib.contextmanager
def single_error(error: type[OllamatrioError] = TransferError) -> Iterator[None]:
    """Turn a nursery's group of ordinary errors into one error a caller can catch.

    A lone error is re-raised as itself; several become one ``error`` listing them.
    Groups holding ``Cancelled`` or ``KeyboardInterrupt`` pass through untouched.
    A ``GeneratorExit`` beside errors is dropped: a generator closed while its transfers
    failed reports the failure (``trio.as_safe_channel`` expects exactly that).
    """
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = [leaf for leaf in _leaves(group) if not isinstance(leaf, GeneratorExit)]
        if not leaves or not all(isinstance(leaf, Exception) for leaf in leaves):
            raise
        if len(leaves) == 1:
            raise leaves[0] from None
        raise error("; ".join(dict.fromkeys(str(leaf) for leaf in leaves))) from group


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
