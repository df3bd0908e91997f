"""Run the server: scheduler + store + HTTP app (our front door, hypercorn behind it), on Trio.

``serve`` is embeddable (tests start it with ``nursery.start`` on port 0 and get the bound
URLs back); ``run_server`` is the process entry point, which turns SIGINT/SIGTERM into a
graceful shutdown: stop accepting, let running requests drain, then unload every runner.
Like Ollama, ``run_server`` listens and opens the model store before anything else, so a
busy port or an unusable ``OLLAMA_MODELS`` is one :class:`StartupError` in Ollama's words.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
from hypercorn.config import Config as HypercornConfig

from .api.lazy import LazyApp
from .config import Settings, join_host_port
from .devices import DeviceSource, device_source
from .engines import default_engine_factory
from .engines.capability import engine_device_source
from .engines.protocol import EngineFactory
from .errors import OllamatrioError
from .http.budget import ConnectionBudget, default_cap, raise_open_file_limit
from .http.front import serve_http
from .http.tls import TLSConfigError, server_context
from .log import configure_logging
from .model_config import ConfigError, ModelConfig, load_model_config
from .runner.folders import remove_stale_runner_folders
from .scheduler import Scheduler, default_cpu_elsewhere, open_scheduler
from .store import ModelStore

log = logging.getLogger(__name__)

GRACEFUL_TIMEOUT = 10.0  # seconds running requests get to finish at shutdown
CUT_TIMEOUT = 2.0  # seconds, after that, to tell the requests still running why they end
UNLOAD_TIMEOUT = 15.0  # seconds runners get to exit after that


class StartupError(OllamatrioError):
    """The server cannot start; the message is one line, in Ollama's words where it has them
    (``listen tcp 127.0.0.1:11434: bind: address already in use``)."""


def _reason(exc: OSError) -> str:
    """The OS's text for ``exc`` as Go prints it (``address already in use``)."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def listen(settings: Settings) -> socket.socket:
    """The listening socket for ``settings.bind``, as Go's ``net.Listen("tcp", …)``.

    Raises:
        StartupError: the address cannot be resolved, bound or listened on.
    """
    address = join_host_port(settings.host, settings.port)  # Go names the address as set
    host = settings.host or "0.0.0.0"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((host, settings.port))
        except socket.gaierror as exc:
            raise StartupError(f"listen tcp: lookup {host}: no such host") from exc
        except OSError as exc:
            raise StartupError(f"listen tcp {address}: bind: {_reason(exc)}") from exc
        try:
            sock.listen(HypercornConfig.backlog)
        except OSError as exc:
            raise StartupError(f"listen tcp {address}: listen: {_reason(exc)}") from exc
    except BaseException:
        sock.close()
        raise
    return sock


def check_models_dir(models_dir: Path) -> None:
    """Create the store's folders and read them, as Ollama does before it serves.

    An existing read-only store passes; only one that cannot be created or read fails.

    Raises:
        StartupError: in Ollama's words (``mkdir …: not a directory: ensure path elements
            are traversable``).
    """
    for sub in ("blobs", "manifests"):
        path = models_dir.expanduser() / sub
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            name = exc.filename or path
            if isinstance(exc, NotADirectoryError):  # Go names the file in the way
                name = next((p for p in path.parents if p.exists() and not p.is_dir()), name)
            raise StartupError(
                f"mkdir {name}: {_reason(exc)}: ensure path elements are traversable"
            ) from exc
        try:
            os.scandir(path).close()
        except OSError as exc:
            raise StartupError(f"open {path}: {_reason(exc)}") from exc


async def sweep_prompt_cache(settings: Settings) -> None:
    """The on-disk prompt cache as the last server left it: saves cut short, states of
    deleted models, and everything over the bound (all of it when the cache is off) go."""
    from .slot_cache import SlotCache  # sqlite3: not imported before the first answer

    cache = SlotCache(settings.prompt_disk_cache_dir, settings.prompt_disk_cache)
    try:
        await trio.to_thread.run_sync(cache.sweep)
    except OSError as exc:
        log.warning("prompt cache: could not tidy %s: %s", cache.folder, exc)


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The HTTPS context ``OLLAMATRIO_TLS_CERT``/``_KEY`` name; None for plain HTTP.

    Raises:
        StartupError: a file is missing or unusable (it names the file and why).
    """
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    try:
        return server_context(settings.tls_cert, settings.tls_key)
    except TLSConfigError as exc:
        raise StartupError(str(exc)) from None


def hypercorn_config(settings: Settings, listener: socket.socket | None = None) -> HypercornConfig:
    """Hypercorn's settings; with ``listener``, it serves that socket instead of binding."""
    config = HypercornConfig()
    # A duplicate of the descriptor: hypercorn closes its copy, the caller keeps its own.
    config.bind = [f"fd://{os.dup(listener.fileno())}" if listener else settings.bind]
    # Our own drain cuts what still runs after GRACEFUL_TIMEOUT (http/drain.py);
    # hypercorn waits a little longer, so that those last words are delivered.
    config.graceful_timeout = GRACEFUL_TIMEOUT + CUT_TIMEOUT
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 30.0
    return config


def connection_cap(settings: Settings) -> int:
    """Raise the open file limit (logged) and decide the connection cap (logged)."""
    limit = raise_open_file_limit().soft
    cap = settings.max_connections or default_cap(limit)
    if cap > limit:
        log.warning(
            "OLLAMATRIO_MAX_CONNECTIONS=%d is above the open file limit (%d): clients can "
            "take every descriptor, and runners then fail to start", cap, limit,
        )  # fmt: skip
    how = "OLLAMATRIO_MAX_CONNECTIONS" if settings.max_connections else "from the limit"
    log.info("up to %d client connections at once (%s; open file limit %d)", cap, how, limit)
    return cap


async def serve(
    settings: Settings,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    engines: EngineFactory | None = None,
    devices: DeviceSource | None = None,
    listener: socket.socket | None = None,
    model_config: ModelConfig | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown_trigger`` returns (or forever); ``started()`` gets the URLs.

    ``engines`` and ``devices`` default to what the settings ask for (embedders and tests
    may pass their own); ``listener`` is a socket already listening (:func:`listen`),
    served instead of binding ``settings.bind``; ``model_config`` defaults to the file
    ``settings.config_path`` names.  Models marked ``preload`` load in the background,
    after the listener is up.

    The soft open file limit is raised to the hard one first (as a Go server's runtime
    does), and the client connections held at once are capped below it
    (``settings.max_connections``, default :func:`~ollamatrio.http.budget.default_cap`).

    Raises:
        ConfigError: ``model_config`` was not given and the file cannot be used.
        StartupError: the TLS certificate or key cannot be used.
    """
    tls = tls_context(settings)
    if model_config is None:
        model_config = await trio.to_thread.run_sync(load_model_config, settings.config_path)
    store = await trio.to_thread.run_sync(
        lambda: ModelStore(settings.models_dir, noprune=settings.noprune)
    )
    pruned = await trio.to_thread.run_sync(store.prune)
    if pruned.blobs_removed:
        log.info("removed %d unused blobs", pruned.blobs_removed)
    if model_config.models:
        from .api.preload import warn_missing_models  # reads the store (and GGUF headers)

        await warn_missing_models(store, model_config)
    # Runners killed together with an earlier server left their folders behind.
    await trio.to_thread.run_sync(remove_stale_runner_folders)
    async with trio.open_nursery() as background:
        # Tidying the on-disk prompt cache never delays the listener.
        background.start_soon(sweep_prompt_cache, settings)
        if devices is None and engines is None:
            # Logs the engine's backends once (on a machine without GPUs, in the background).
            devices = await engine_device_source(settings, background=background)
        await _serve(
            settings, store, model_config, shutdown_trigger, engines, devices, listener,
            tls, task_status,
        )  # fmt: skip
        background.cancel_scope.cancel()
    log.info("server stopped")


async def _serve(
    settings: Settings,
    store: ModelStore,
    model_config: ModelConfig,
    shutdown_trigger: Callable[[], Awaitable[None]] | None,
    engines: EngineFactory | None,
    devices: DeviceSource | None,
    listener: socket.socket | None,
    tls: ssl.SSLContext | None,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """:func:`serve` once the store and the devices are known."""
    budget = ConnectionBudget(connection_cap(settings))
    stopping = trio.Event()

    async def trigger() -> None:
        if shutdown_trigger is None:
            await trio.sleep_forever()
        else:
            await shutdown_trigger()
        stopping.set()

    elsewhere = None  # the cores other processes keep busy, read beside real runners only
    if engines is None:
        engines = default_engine_factory(settings, devices or device_source(settings))
        elsewhere = default_cpu_elsewhere(settings)
    async with open_scheduler(
        settings, engines=engines, devices=devices, models=model_config, cpu_elsewhere=elsewhere
    ) as scheduler:
        # Quart and the dialects are imported when a request first needs them.
        app = LazyApp(scheduler, store, settings)
        try:
            async with trio.open_nursery() as nursery:
                # Requests still running when the grace period ends are told why they end.
                nursery.start_soon(app.drain.cut_after, stopping, GRACEFUL_TIMEOUT)
                if model_config.preloads:
                    # Never delays the listener: loads go on while requests are served.
                    nursery.start_soon(_preload, scheduler, store, settings, model_config)

                async def http(task_status: trio.TaskStatus[list[str]]) -> None:
                    await serve_http(
                        app,
                        hypercorn_config(settings, listener),
                        shutdown_trigger=trigger,
                        budget=budget,
                        body_timeout=settings.body_timeout,
                        tls=tls,
                        task_status=task_status,
                    )
                    nursery.cancel_scope.cancel()

                task_status.started(await nursery.start(http))
                # A runner waiting for the next cold load (OLLAMATRIO_SPARE_RUNNER),
                # started once the listener is up: it does not slow the start.
                nursery.start_soon(engines.keep_spare)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(UNLOAD_TIMEOUT):
                scheduler.unload_all()
                await scheduler.wait_idle()


async def _preload(
    scheduler: Scheduler, store: ModelStore, settings: Settings, model_config: ModelConfig
) -> None:
    from .api.models import ApiContext
    from .api.preload import preload_models

    context = ApiContext(scheduler=scheduler, store=store, settings=settings)
    await preload_models(context, model_config)


async def _set_on_signal(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            stop.set()
            return


async def _serve_until_signal(
    settings: Settings, listener: socket.socket, model_config: ModelConfig
) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_on_signal, stop)
        binds = await nursery.start(lambda task_status: serve(
            settings, shutdown_trigger=stop.wait, listener=listener,
            model_config=model_config, task_status=task_status,
        ))  # fmt: skip
        # The server listens on its own duplicate of the socket now.  Ours would keep the
        # kernel's listening socket open after the server closes its copy at shutdown: new
        # connections would be accepted into the backlog and never answered, not refused.
        listener.close()
        log.info("Listening on %s (version %s, Ollama API %s)", ", ".join(binds), *_versions())
        await stop.wait()
        # serve() returns once drained; the signal task has already finished.


def _versions() -> tuple[str, str]:
    """The project's own version and the Ollama API version it implements."""
    from ._version import OLLAMA_API_VERSION, __version__

    return __version__, OLLAMA_API_VERSION


def run_server(settings: Settings | None = None) -> None:
    """Process entry point: logging from OLLAMA_DEBUG, serve until SIGINT/SIGTERM.

    Raises:
        StartupError: the config file (``OLLAMATRIO_CONFIG``) or the TLS certificate or key
            is unusable, the address cannot be listened on or the model store cannot be used
            (checked in that order, before anything else starts).
    """
    settings = settings or Settings.from_env()
    configure_logging(settings)
    try:
        model_config = load_model_config(settings.config_path)
    except ConfigError as exc:
        raise StartupError(str(exc)) from None
    tls_context(settings)  # an unusable certificate fails here, before the port is taken
    with listen(settings) as listener:
        check_models_dir(settings.models_dir)
        trio.run(_serve_until_signal, settings, listener, model_config)
