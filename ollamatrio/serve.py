"""Run the server: scheduler + store + HTTP app under hypercorn, on Trio.

``serve`` is embeddable (tests start it with ``nursery.start`` on port 0 and get the bound
URLs back); ``run_server`` is the process entry point, which turns SIGINT/SIGTERM into a
graceful shutdown: stop accepting, let running requests drain, then unload every runner.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from .config import Settings
from .devices import DeviceSource
from .engines.capability import engine_device_source
from .engines.protocol import EngineFactory
from .log import configure_logging
from .runner.folders import remove_stale_runner_folders
from .scheduler import open_scheduler
from .server import create_app
from .server.app import drain_of
from .store import ModelStore

log = logging.getLogger(__name__)

GRACEFUL_TIMEOUT = 10.0  # seconds running requests get to finish at shutdown
CUT_TIMEOUT = 2.0  # seconds, after that, to tell the requests still running why they end
UNLOAD_TIMEOUT = 15.0  # seconds runners get to exit after that


def hypercorn_config(settings: Settings) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [settings.bind]
    # Our own drain cuts what still runs after GRACEFUL_TIMEOUT (server/drain.py);
    # hypercorn waits a little longer, so that those last words are delivered.
    config.graceful_timeout = GRACEFUL_TIMEOUT + CUT_TIMEOUT
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 30.0
    return config


async def serve(
    settings: Settings,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    engines: EngineFactory | None = None,
    devices: DeviceSource | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown_trigger`` returns (or forever); ``started()`` gets the URLs.

    ``engines`` and ``devices`` default to what the settings ask for (embedders and tests
    may pass their own)."""
    store = await trio.to_thread.run_sync(
        lambda: ModelStore(settings.models_dir, noprune=settings.noprune)
    )
    pruned = await trio.to_thread.run_sync(store.prune)
    if pruned.blobs_removed:
        log.info("removed %d unused blobs", pruned.blobs_removed)
    # Runners killed together with an earlier server left their folders behind.
    await trio.to_thread.run_sync(remove_stale_runner_folders)
    if devices is None and engines is None:
        devices = await engine_device_source(settings)  # logs the engine's backends once
    stopping = trio.Event()

    async def trigger() -> None:
        if shutdown_trigger is None:
            await trio.sleep_forever()
        else:
            await shutdown_trigger()
        stopping.set()

    async with open_scheduler(settings, engines=engines, devices=devices) as scheduler:
        app = create_app(scheduler, store, settings)
        try:
            async with trio.open_nursery() as nursery:
                # Requests still running when the grace period ends are told why they end.
                nursery.start_soon(drain_of(app).cut_after, stopping, GRACEFUL_TIMEOUT)
                await hypercorn_serve(
                    app,  # type: ignore[arg-type]
                    hypercorn_config(settings),
                    shutdown_trigger=trigger,
                    task_status=task_status,
                )
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(UNLOAD_TIMEOUT):
                scheduler.unload_all()
                await scheduler.wait_idle()
    log.info("server stopped")


async def _set_on_signal(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            stop.set()
            return


async def _serve_until_signal(settings: Settings) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_on_signal, stop)
        binds = await nursery.start(lambda task_status: serve(
            settings, shutdown_trigger=stop.wait, task_status=task_status
        ))  # fmt: skip
        log.info("Listening on %s (version %s)", ", ".join(binds), _version())
        await stop.wait()
        # serve() returns once drained; the signal task has already finished.


def _version() -> str:
    from ._version import __version__

    return __version__


def run_server(settings: Settings | None = None) -> None:
    """Process entry point: logging from OLLAMA_DEBUG, serve until SIGINT/SIGTERM."""
    settings = settings or Settings.from_env()
    configure_logging(settings)
    trio.run(_serve_until_signal, settings)
