"""The hypercorn internals the front door relies on (``http/hypercorn_bridge.py``) are there,
as the bridge uses them, in a hypercorn version ``pyproject.toml`` allows.

A failure here means that this hypercorn changed its internals: re-check
``http/hypercorn_bridge.py`` against its ``trio/run.py`` (``worker_serve``) and
``trio/tcp_server.py`` before widening the pin."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import tomllib
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from packaging.requirements import Requirement
from packaging.version import Version

from ollamatrio.http import hypercorn_bridge
from ollamatrio.http.http1 import MAX_HEAD
from ollamatrio.http.hypercorn_bridge import INTERNALS, Config, Worker

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
VERSION = importlib.metadata.version("hypercorn")


def changed(what: str) -> str:
    return f"hypercorn {VERSION} changed its internals: re-check http/hypercorn_bridge.py ({what})"


def resolve(path: str) -> Any:
    module_name, _, qualname = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        pytest.fail(changed(f"no module {module_name}: {error}"))
    for part in qualname.split("."):
        if not hasattr(found, part):
            pytest.fail(changed(f"{path} is gone"))
        found = getattr(found, part)
    return found


def test_the_installed_hypercorn_is_one_pyproject_allows() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (pin,) = [Requirement(d) for d in dependencies if Requirement(d).name == "hypercorn"]
    assert pin.specifier, "pyproject.toml should pin hypercorn: the bridge uses its internals"
    assert Version(VERSION) in pin.specifier, (
        f"hypercorn {VERSION} is not in pyproject.toml's {pin.specifier}: "
        "re-check http/hypercorn_bridge.py against it (and its test), then widen the pin"
    )


@pytest.mark.parametrize("path", list(INTERNALS))
def test_every_internal_the_bridge_uses_is_there(path: str) -> None:
    found = resolve(path)
    expected = INTERNALS[path]
    if expected is None:
        return
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError) as error:
        pytest.fail(changed(f"{path} has no signature: {error}"))
    names = tuple(name for name in signature.parameters if name != "self")
    assert names == expected, changed(f"{path} takes {names}, the bridge passes {expected}")


def test_the_bridge_imports_only_what_it_lists() -> None:
    """Each hypercorn name the bridge imports is in INTERNALS (or is hypercorn's public
    Config), so that the list above is the whole of what it relies on."""
    listed = {path.partition(":")[2].split(".")[0] for path in INTERNALS} | {"Config"}
    source = inspect.getsource(hypercorn_bridge)
    imported = set()
    for line in source.splitlines():
        if line.startswith("from hypercorn"):
            imported |= {n.strip() for n in line.partition(" import ")[2].split(",")}
    assert imported <= listed, f"not in INTERNALS: {sorted(imported - listed)}"


async def test_the_worker_pieces_have_what_the_bridge_uses() -> None:
    config = Config()
    for name in ("wsgi_max_body_size", "graceful_timeout", "keep_alive_timeout", "backlog",
                 "root_path", "h11_max_incomplete_size", "create_sockets"):  # fmt: skip
        assert hasattr(config, name), changed(f"Config.{name} is gone")
    worker = Worker(_App(), config)
    for event in (worker.context.terminate, worker.context.terminated):
        for method in ("wait", "set", "is_set"):
            assert callable(getattr(event, method, None)), changed(
                f"WorkerContext events: {method}"
            )
    with trio.fail_after(5):
        async with worker.lifespan():
            assert worker.state == {"started": True}  # the lifespan's state, as the app set it
        await worker.terminated()
        assert worker.context.terminated.is_set()


def test_hypercorn_reads_http1_with_h11_and_the_front_doors_limit() -> None:
    """The front door's differential test compares it with h11: hypercorn's HTTP/1.1 must be
    h11, with the head size limit the front door hands off at."""
    protocol = resolve("hypercorn.protocol.h11:h11")
    assert protocol is h11, changed("its HTTP/1.1 is no longer h11")
    assert Config().h11_max_incomplete_size == MAX_HEAD, changed("h11_max_incomplete_size")


class _App:
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        while (message := await receive())["type"] != "lifespan.shutdown":
            assert message["type"] == "lifespan.startup"
            scope["state"]["started"] = True
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})


async def test_the_body_watch_reads_a_running_connections_h11_state() -> None:
    """:class:`BodyWatch` reads ``ATTRIBUTES`` of a real hypercorn connection: waiting for
    a body (and nothing answered yet) while one comes, not once it is read and answered."""
    config = Config()
    worker = Worker(_Echo(), config)
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = await trio.open_tcp_stream(*listener.getsockname())
    server_sock, _ = await listener.accept()
    listener.close()
    stream = _Watched(trio.SocketStream(server_sock))
    with trio.fail_after(10):
        async with client, stream.transport, trio.open_nursery() as nursery:
            nursery.start_soon(
                hypercorn_bridge.serve_connection, worker.wrapped, config, worker.context,
                worker.state, stream,
            )  # fmt: skip
            await client.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
            while stream.watch is None or not stream.watch.reading_body():
                await stream.received.wait()  # hypercorn reads again after each piece
                stream.received = trio.Event()
            assert stream.watch.may_answer(), changed("the h11 state or the send lock")
            await client.send_all(b"cd")
            answer = b""
            while not answer.endswith(b"abcd\r\n0\r\n\r\n"):  # the head, the body's chunks
                answer += await client.receive_some()
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert not stream.watch.reading_body()
            nursery.cancel_scope.cancel()
    for attribute in hypercorn_bridge.ATTRIBUTES:
        assert attribute.split(".")[0] in ("TCPServer", "ProtocolWrapper", "H11Protocol")


class _Watched(hypercorn_bridge.WatchedStream):
    def __init__(self, stream: trio.SocketStream) -> None:
        self.transport = stream
        self.socket = stream.socket
        self.received = trio.Event()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.transport.receive_some(max_bytes)
        self.received.set()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.transport.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.transport.send_eof()

    async def aclose(self) -> None:
        await self.transport.aclose()


class _Echo:
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
