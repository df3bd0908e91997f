"""``ollamatrio push`` driven as a user drives it: ``python -m ollamatrio`` subprocesses
against a real server (simulated engine) and a fake registry on 127.0.0.1."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio
from conftest import import_model
from test_cli import CLI_TIMEOUT, cli, cli_env, text

from ollamatrio.cli.humanize import human_bytes
from ollamatrio.testing.fake_registry import FakeRegistry, Stall

if TYPE_CHECKING:
    from conftest import ServerFactory

TinyGGUF = Callable[..., Path]
REPO = "library/mine:latest"
TRANSFER_LOG = "ollamatrio.store.transfer"


class LogSeen(logging.Handler):
    """Sets ``event`` when a record holding ``text`` is logged (in the server's Trio run)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.event = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


@pytest.fixture
def push_stopped(caplog: pytest.LogCaptureFixture) -> Iterator[trio.Event]:
    """Set when the server logs that a push stopped because its client went."""
    caplog.set_level(logging.INFO, logger=TRANSFER_LOG)
    seen = LogSeen("stopped: nobody is listening")
    logger = logging.getLogger(TRANSFER_LOG)
    logger.addHandler(seen)
    yield seen.event
    logger.removeHandler(seen)


@pytest.fixture
async def registry(nursery: trio.Nursery) -> FakeRegistry:
    fake = FakeRegistry()
    await nursery.start(fake.serve)
    return fake


async def test_push_prints_a_line_per_layer_then_where_the_model_is(
    api_server: ServerFactory, registry: FakeRegistry, tiny_gguf: TinyGGUF
) -> None:
    name = registry.model_name(REPO)
    async with api_server() as srv:
        await trio.to_thread.run_sync(import_model, srv.store, name, tiny_gguf())
        manifest = srv.store.read_manifest(name)
        result = await cli(srv.url, "push", "--insecure", name)
    out, err = text(result)
    assert result.returncode == 0, err
    lines = err.splitlines()
    assert lines[0] == "retrieving manifest"
    weights = manifest.layers[0]
    assert lines[1] == f"pushing {weights.digest[7:19]}: 100% {human_bytes(weights.size)}"
    assert lines[-2:] == ["pushing manifest", "success"]
    assert out == f"\nYou can find your model at:\n\n\t{name}\n"
    assert REPO in registry.manifests


async def test_an_interrupted_push_resumes_where_the_registry_stands(
    api_server: ServerFactory,
    registry: FakeRegistry,
    tiny_gguf: TinyGGUF,
    nursery: trio.Nursery,
    push_stopped: trio.Event,
) -> None:
    name = registry.model_name(REPO)
    stall = registry.upload_stall = Stall(after=200_000, seconds=600)  # then the network hangs
    async with api_server() as srv:
        await trio.to_thread.run_sync(import_model, srv.store, name, tiny_gguf(layers=3))
        size = srv.store.read_manifest(name).size
        first = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-m", "ollamatrio", "push", "--insecure", name],
                env=cli_env(srv.url),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        )
        with trio.fail_after(CLI_TIMEOUT):
            await stall.began.wait()
            first.send_signal(signal.SIGINT)  # the user gives up: Ctrl-C
            assert await first.wait() != 0
            # The server stops the push at its next progress update (a heartbeat away),
            # leaving the upload's location for the next push: wait for that.
            await push_stopped.wait()
        assert REPO not in registry.manifests  # nothing half-pushed is ever published
        second = await cli(srv.url, "push", "--insecure", name)
    assert second.returncode == 0, second.stderr
    assert REPO in registry.manifests
    # The weights went on from the registry's Range: nothing was sent twice.
    chunks = [r.range or "" for r in registry.requests if r.method == "PATCH"]
    assert [c for c in chunks if c.startswith("200000-")]
    assert registry.bytes_received == size


async def test_a_registry_refusing_the_push_says_so(
    api_server: ServerFactory, registry: FakeRegistry, tiny_gguf: TinyGGUF
) -> None:
    registry.token, registry.token_realm = "s3cret", False
    name = registry.model_name(REPO)
    async with api_server() as srv:
        await trio.to_thread.run_sync(import_model, srv.store, name, tiny_gguf())
        result = await cli(srv.url, "push", "--insecure", name)
    out, err = text(result)
    assert result.returncode == 1
    assert err.splitlines()[-1] == (
        "Error: you are not authorized to push to this namespace, create the model under a "
        "namespace you own"
    )
    assert out == ""


async def test_push_of_a_model_not_here(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        result = await cli(srv.url, "push", "nope")
    assert result.returncode == 1
    assert text(result)[1].splitlines()[-1] == (
        'Error: model "nope" not found, try pulling it first'
    )
