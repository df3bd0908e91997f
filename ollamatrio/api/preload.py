"""Start-up work for the per-model configuration: name the configured models the store lacks,
and load the ones marked ``preload``.

Preloading runs as a task beside the HTTP listener, so the API is ready at once; each model
goes through the scheduler's ordinary lease path as a load-only request (Ollama's empty
prompt), with the options a request naming only the model would get.  A failure is logged
and the next model is tried: a preload is never fatal.
"""

from __future__ import annotations

import logging

import trio

from ..errors import OllamatrioError
from ..model_config import ModelConfig
from ..store import ModelStore
from .bodies import merge_options
from .models import ApiContext

log = logging.getLogger(__name__)


async def warn_missing_models(store: ModelStore, config: ModelConfig) -> None:
    """A configured model that is not in the store is only a warning: it may be pulled
    later, and its settings apply from then on."""
    missing = await trio.to_thread.run_sync(
        lambda: [name for name in config.models if not store.exists(name)]
    )
    for name in missing:
        log.warning("%s: model %s is not in the store (yet)", config.path, name)


async def preload_models(ctx: ApiContext, config: ModelConfig) -> None:
    """Load the ``preload`` models one after another, in the file's order."""
    for name in config.preloads:
        try:
            model = await ctx.resolve(name)
            caps = await ctx.capabilities(model)
            request = ctx.model_request(model, merge_options(model.params), None, caps)
            await ctx.scheduler.load(request)
        except OllamatrioError as exc:
            log.warning("preloading %s failed: %s", name, exc)
        else:
            log.info("preloaded %s", name)
