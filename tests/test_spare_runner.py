"""The spare runner (``engines/spare.py``): a real runner process started ahead of need takes
the next cold load, skipping the interpreter and the engine's import; the next spare starts
once that runner's first request is over; an unused spare ends with the keeper, its folder
removed, also when the server is killed outright."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
from conftest import import_model

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.engines.spare import Spare, SpareKeeper
from ollamatrio.runner.folders import PREFIX
from ollamatrio.store import ModelStore
from ollamatrio.types import CompletionRequest, LoadSpec


@asynccontextmanager
async def keeping_spares(tiny_gguf) -> AsyncIterator[tuple[ProcessEngineFactory, LoadSpec, Spare]]:
    """A factory keeping spares (until the block ends), a load for it, its first spare."""
    factory = ProcessEngineFactory(load_timeout=60, spare_runner=True)
    assert factory.spares is not None
    spec = LoadSpec(model_path=str(tiny_gguf()), name="tiny", num_ctx=256)
    async with trio.open_nursery() as nursery:
        await nursery.start(factory.keep_spare)
        yield factory, spec, await factory.spares.wait_spare()
        nursery.cancel_scope.cancel()


async def test_a_cold_load_takes_the_spare_and_a_new_one_follows(tiny_gguf) -> None:
    with trio.fail_after(120):
        async with keeping_spares(tiny_gguf) as (factory, spec, first):
            assert factory.spares is not None
            async with factory.open(spec) as engine:
                assert engine.pid == first.process.pid
                assert engine.load_phases["interpreter"] == 0
                assert engine.load_phases["engine_import"] == 0
                assert await engine.tokenize("hello")
                assert factory.spares.spare is None  # not during the load nor before a prompt
                request = CompletionRequest(prompt="hi", options={"num_predict": 2})
                async with engine.complete(request) as chunks:
                    assert [chunk async for chunk in chunks]
                second = await factory.spares.wait_spare()  # once the first request ended
                assert second.process.pid != first.process.pid
            assert first.process.returncode is not None  # ended with its engine
            assert not await trio.Path(first.socket_dir).exists()
    assert second.process.returncode is not None  # the unused spare ended with the keeper
    assert not await trio.Path(second.socket_dir).exists()


async def test_a_load_with_another_environment_starts_its_own_runner(tiny_gguf) -> None:
    with trio.fail_after(120):
        async with keeping_spares(tiny_gguf) as (factory, spec, spare):
            assert factory.spares is not None
            assert factory.spares.take({**spare.env, "CUDA_VISIBLE_DEVICES": "0"}) is None
            factory.env["OLLAMATRIO_TEST_MARK"] = "other"  # this load's environment differs
            async with factory.open(spec) as engine:
                assert engine.pid != spare.process.pid
                assert engine.load_phases["interpreter"] > 0
            assert factory.spares.spare is spare  # still waiting
    assert spare.process.returncode is not None


async def test_a_spare_that_dies_while_waiting_ends_the_keeping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keeper = SpareKeeper([sys.executable, "-c", "pass"], dict(os.environ))
    with trio.fail_after(30):
        await keeper.run()  # returns: the process exited at once
    assert keeper.spare is None
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "the spare runner exited while waiting" in record.getMessage()


def test_no_spare_without_settings_that_ask_for_one() -> None:
    assert ProcessEngineFactory().spares is None


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private temporary directory shallow enough for runner sockets."""
    temp = Path(tempfile.mkdtemp(prefix="ot-", dir="/tmp"))
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


async def runner_folders(temp: Path) -> list[str]:
    names = await trio.to_thread.run_sync(os.listdir, temp)
    return [name for name in names if name.startswith(PREFIX)]


class ServerLog:
    """A server's stderr, drained: its address, and how many spare runners said ready."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self.text = b""
        self.listening: str | None = None
        self.spares_ready = 0
        self._changed = trio.Event()

    async def drain(self) -> None:
        while data := await self._stream.receive_some():
            self.text += data
            if self.listening is None and (
                url := re.search(rb"Listening on (http://\S+)\s", self.text)
            ):
                self.listening = url.group(1).decode()
            self.spares_ready = len(re.findall(rb"spare runner \d+ ready", self.text))
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, seen: Callable[[], object]) -> None:
        while not seen():
            await self._changed.wait()


async def test_a_server_killed_outright_leaves_no_runner_folder(
    tiny_gguf, tmp_path: Path, short_tmp: Path
) -> None:
    """SIGKILL the server while a model is loaded and the next spare waits: the model's
    runner and the spare each remove their own folder (stdin EOF) within seconds."""
    models = tmp_path / "models"
    await trio.to_thread.run_sync(import_model, ModelStore(models), "tiny", tiny_gguf())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA", "CUDA"))}
    env |= {
        "OLLAMA_HOST": "127.0.0.1:0",
        "OLLAMA_MODELS": str(models),
        "OLLAMA_DEBUG": "1",  # the keeper's "spare runner N ready" lines
        "OLLAMATRIO_SPARE_RUNNER": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "TMPDIR": str(short_tmp),
    }
    server = await trio.lowlevel.open_process(
        [sys.executable, "-m", "ollamatrio", "serve"], env=env, stderr=subprocess.PIPE
    )
    assert server.stderr is not None
    log = ServerLog(server.stderr)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log.drain)  # until the killed server's stderr closes
            with trio.fail_after(120):
                await log.wait_for(lambda: log.listening and log.spares_ready == 1)
                async with httpx.AsyncClient(base_url=log.listening, timeout=None) as client:
                    body = {"model": "tiny", "prompt": "hi", "options": {"num_predict": 2}}
                    answer = await client.post("/api/generate", json={**body, "stream": False})
                    assert answer.status_code == 200, answer.text
                    # The load took the spare; once its first request ended, the next one.
                    await log.wait_for(lambda: log.spares_ready == 2)
                    assert len(await runner_folders(short_tmp)) == 2  # the runner's, the spare's
            server.kill()
            await server.wait()
        # The runner and the spare are other processes, with no event to wait on here:
        # poll their folders, within a bound.
        with trio.move_on_after(3):
            while await runner_folders(short_tmp):  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert await runner_folders(short_tmp) == []
    finally:
        if server.returncode is None:
            server.kill()
        with trio.CancelScope(shield=True):
            await server.wait()
            await server.stderr.aclose()
