"""The memory a model will take on a host, predicted by the gateway from the shared store.

With one model store shared by every host (``OLLAMA_MODELS`` on shared storage, the fleet's
documented default), the gateway can read a model's GGUF header as the hosts will and
predict its size with ``memory.py``, so that a cold model goes to a host whose free memory
(``/api/ps``'s ``free_memory``) fits it.  The prediction is a hint, never a promise: it uses
the gateway's own settings (``OLLAMA_CONTEXT_LENGTH``, ``OLLAMA_NUM_PARALLEL``, the KV cache
type, flash attention), the model's own ``num_ctx`` parameter if it has one, and otherwise the
smallest default context a host picks (hosts with large GPUs default to more); a request's own
``options`` are not read.  The host's scheduler decides for itself.

Name resolution (a manifest read) and the header read (``model_info``: once per file, in a
worker thread) never run on the event loop; predictions are cached per model file, whose
path names its content's digest, so a name pointed at a new file gets a new prediction.  A
name the gateway's store does not have (a store that is not shared, a typo) predicts
nothing: the model then fits everywhere, as the policy treats an unknown size.
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from .. import model_info
from ..config import Settings
from ..errors import GGUFError, OllamatrioError
from ..memory import MemoryOptions, estimate, projector_bytes
from ..scheduler.options import default_context_length
from ..store import ModelStore
from ..store.names import InvalidModelNameError

log = logging.getLogger(__name__)

_MAX_ENTRIES: Final = 1024  # model files remembered (names are client input)


class SizePredictor:
    """Predicted bytes per model, from the store at ``settings.models_dir``."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._store = ModelStore(settings.models_dir)
        self._sizes: dict[tuple[str, int], int] = {}  # (model file, num_ctx) → bytes

    async def predict(self, name: str) -> int | None:
        """The bytes loading ``name`` is predicted to take on a host; None if unknown."""
        try:
            model = await trio.to_thread.run_sync(self._store.resolve, name)
        except (OllamatrioError, InvalidModelNameError, OSError, ValueError) as exc:
            log.debug("no size for %s: %s", name, exc)
            return None
        if model.model_path is None:
            return None
        settings = self._settings
        configured = model.params.get("num_ctx")
        num_ctx = (
            int(configured)
            if isinstance(configured, int | float) and configured > 0
            else default_context_length(settings.context_length, 0)
        )
        key = (str(model.model_path), num_ctx)
        size = self._sizes.get(key)
        if size is not None:
            return size
        try:
            info = await model_info.read_model_info(key[0])
            projector = 0
            for path in model.projectors[:1]:
                projector = projector_bytes(await model_info.read_model_info(str(path)))
        except (GGUFError, OSError) as exc:
            log.debug("no size for %s: %s", name, exc)
            return None
        options = MemoryOptions(
            num_ctx=num_ctx,
            num_parallel=max(1, settings.num_parallel),
            kv_cache_type=settings.kv_cache_type,
            flash_attention=settings.flash_attention,
            projector=projector,
        )
        size = estimate(info, options).total
        if len(self._sizes) >= _MAX_ENTRIES:
            self._sizes.clear()
        self._sizes[key] = size
        return size
