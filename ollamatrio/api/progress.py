"""The progress streams of ``POST /api/pull``, ``/api/push`` and ``/api/create``.

They run on the generation routes' exchange (api/routes.py): the route parses and
checks the body here, then the exchange opens the event source in an ``async with`` for
exactly as long as it writes, one NDJSON line per event.  Leaving the block (the client
went, shutdown cut the stream, an error) closes the source in the request's own scope: a
pull's or push's channel, which stops it at its next progress update; a create's store
iterator, which releases the store's pins.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from ..errors import InvalidRequestError
from ..store import create_model
from ..store.push import start_push
from ..store.registry import start_pull
from ..wire import NDJSON, ndjson_line
from .bodies import get_bool, get_list, get_model, get_str, get_stream, merge_options
from .models import ApiContext

Event = dict[str, Any]


@dataclass
class Progress:
    """A progress stream to serve: ``open()`` owns its source for an ``async with``.

    ``stream`` false answers with the last event; then an ``{"error": ...}`` event answers
    with ``failed_status`` if set (a pull's failure is 500 with its message, as Ollama's).
    """

    open: Callable[[], AbstractAsyncContextManager[AsyncIterator[Event]]]
    stream: bool
    failed_status: int | None = None


class ProgressLines:
    """The last words of a progress stream cut short: an ``{"error": ...}`` line."""

    content_type = NDJSON

    def error(self, message: str, status: int) -> bytes:
        return ndjson_line({"error": message})


class _ThreadSteps:
    """A blocking progress iterator (the store's) driven one step per worker-thread hop.
    Not an async generator, so nothing but its owner's ``async with`` closes it."""

    _DONE = object()

    def __init__(self, steps: Iterator[Event]) -> None:
        self._steps = steps

    def __aiter__(self) -> _ThreadSteps:
        return self

    async def __anext__(self) -> Event:
        step = await trio.to_thread.run_sync(next, self._steps, self._DONE)
        if step is self._DONE:
            raise StopAsyncIteration
        return step  # type: ignore[return-value]


@asynccontextmanager
async def thread_steps(start: Callable[[], Iterator[Event]]) -> AsyncIterator[_ThreadSteps]:
    """Call ``start`` in a worker thread (its validation errors propagate before the first
    event) and drive the iterator it returns for the block, closing it on the way out.

    A cancel waits for the step under way (store steps are short file operations: a
    thread cannot be interrupted, and a generator cannot be closed while it runs); the
    close itself is synchronous and quick (it releases the store's pins), so it needs
    neither a shield nor a deadline."""
    steps = await trio.to_thread.run_sync(start)
    try:
        yield _ThreadSteps(steps)
    finally:
        close = getattr(steps, "close", None)
        if close is not None:
            close()


@asynccontextmanager
async def pull_events(
    nursery: trio.Nursery, ctx: ApiContext, name: str, insecure: bool
) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
    """A pull running in ``nursery`` (the app's: a second pull of the same model follows
    this one's downloads and takes over if it stops); closing the channel on the way out
    stops it at its next progress update.  An invalid name raises before anything starts."""
    with start_pull(nursery, ctx.store, name, insecure=insecure) as events:
        yield events


def pull(ctx: ApiContext, nursery: Callable[[], trio.Nursery], body: dict[str, Any]) -> Progress:
    """Ollama's PullHandler: progress as NDJSON, or (``"stream": false``) the last event,
    a failure being 500 with its message."""
    name = get_model(body)
    stream = get_stream(body)
    insecure = get_bool(body, "insecure", False)
    return Progress(lambda: pull_events(nursery(), ctx, name, insecure), stream, 500)


@asynccontextmanager
async def push_events(
    nursery: trio.Nursery, ctx: ApiContext, name: str, insecure: bool
) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
    """A push running in ``nursery`` (the app's: an upload it leaves unfinished is resumed
    by the next push); closing the channel on the way out stops it at its next progress
    update.  An invalid name raises before anything starts."""
    with start_push(nursery, ctx.store, name, insecure=insecure) as events:
        yield events


def push(ctx: ApiContext, nursery: Callable[[], trio.Nursery], body: dict[str, Any]) -> Progress:
    """Ollama's PushHandler: progress as NDJSON, or (``"stream": false``) the last event,
    a failure being 500 with its message."""
    name = get_model(body)
    stream = get_stream(body)
    insecure = get_bool(body, "insecure", False)
    return Progress(lambda: push_events(nursery(), ctx, name, insecure), stream, 500)


def create(ctx: ApiContext, body: dict[str, Any]) -> Progress:
    """Ollama's CreateHandler: the store validates the request (errors keep their own
    status), then yields progress."""
    name = get_str(body, "model") or get_str(body, "name")
    if not name:
        raise InvalidRequestError("invalid model name")  # Ollama's words: no name is no valid name
    stream = get_stream(body)
    files, adapters, parameters, draft_files = (
        body.get(k) for k in ("files", "adapters", "parameters", "draft_files")
    )
    for key, value in (
        ("files", files),
        ("adapters", adapters),
        ("parameters", parameters),
        ("draft_files", draft_files),
    ):
        if value is not None and not isinstance(value, dict):
            raise InvalidRequestError(f"invalid value for {key!r}: expected an object")
    license_ = body.get("license")
    if license_ is not None and not isinstance(license_, str | list):
        raise InvalidRequestError("license must be a string or a list of strings")

    def start() -> Iterator[Event]:
        return create_model(
            ctx.store,
            name,
            from_model=get_str(body, "from") or None,
            files=files,
            adapters=adapters,
            template=get_str(body, "template") or None,
            system=get_str(body, "system") or None,
            parameters=merge_options(parameters) if parameters else None,
            license=license_,
            messages=get_list(body, "messages") or None,
            quantize=get_str(body, "quantize") or get_str(body, "quantization") or None,
            renderer=get_str(body, "renderer") or None,
            parser=get_str(body, "parser") or None,
            requires=get_str(body, "requires") or None,
            draft_files=draft_files,
            draft=get_str(body, "draft") or None,
        )

    return Progress(lambda: thread_steps(start), stream)
