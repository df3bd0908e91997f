"""The spare runner (``engines/spare.py``): a real runner process started ahead of need takes
the next cold load, skipping the interpreter and the engine's import; the next spare starts
once that runner's first request is over; an unused spare ends with the keeper, its folder
removed."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.engines.spare import Spare, SpareKeeper
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
