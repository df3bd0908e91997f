"""What the HTTP layer knows about a stored model: resolution, capabilities, the scheduler's
:class:`ModelRequest`, and the ``/api/show`` document."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..config import Settings
from ..errors import (
    CapabilityError,
    GGUFError,
    InvalidRequestError,
    ModelNotFoundError,
    NoSuchModelError,
    RunnerStartError,
)
from ..gguf import ArraySummary, GGUFInfo
from ..gguf.speculation import has_mtp_heads
from ..model_info import read_model_info
from ..modelfile import Message, Modelfile, render_modelfile, render_parameters
from ..scheduler import ModelRequest, Scheduler
from ..store import Model, ModelStore, parse_name
from ..template import is_go_template
from ..wire import rfc3339
from .chain import current_request
from .priority import checked_priority
from .responses.store import ResponseStore

if TYPE_CHECKING:
    from ..observability.metrics import ServerMetrics

# Keys Ollama leaves out of /api/show's model_info (the chat template is ``template``).
_NOT_SHOWN = ("general.name", "tokenizer.chat_template")

#: How long a resolved model or the model list is served from memory before the store is
#: looked at again (for other processes writing it; this process's own writes take effect
#: at once through ``ModelStore.generation``).
REVALIDATE_AFTER = 1.0

_THINKING_MARKERS = ("<think>", "enable_thinking", "reasoning_content", ".Thinking", "thinking")


@dataclass
class ApiContext:
    """Everything a handler needs; one per app."""

    scheduler: Scheduler
    store: ModelStore
    settings: Settings
    metrics: ServerMetrics | None = None  # create_app's; None where a test builds a context
    responses: ResponseStore | None = None  # stored /v1/responses; create_app's
    # Resolved models by the name asked for, and the model list, each with the trio time
    # they were read and the store generation they were read at.
    _models: dict[str, tuple[float, int, Model]] = field(default_factory=dict)
    _listing: tuple[float, int, list[Model]] | None = None

    def _fresh(self, read_at: float, generation: int) -> bool:
        return (
            generation == self.store.generation and trio.current_time() - read_at < REVALIDATE_AFTER
        )

    async def resolve(self, name: str, *, scheduled: bool = False) -> Model:
        """The stored model ``name`` (404 if absent, 400 for a bad name).  Served from
        memory on the hot path; the store is read again after this process changed it or
        :data:`REVALIDATE_AFTER` seconds passed.  An absent model is ``model 'x' not
        found``, Ollama's handlers' words, unless ``scheduled``: the routes whose lookup
        Ollama leaves to its scheduler (embeddings) say ``..., try pulling it first``
        (``server/routes.go``: ``GenerateHandler``, ``ChatHandler``; ``handleScheduleError``)."""
        cached = self._models.get(name)
        if cached is not None and self._fresh(cached[0], cached[1]):
            model = cached[2]
        else:
            parse_name(name)  # a bad name is a 400 before any file is touched
            generation = self.store.generation
            try:
                model = await trio.to_thread.run_sync(self.store.resolve, name)
            except NoSuchModelError:
                if scheduled:
                    raise
                raise ModelNotFoundError(f"model '{name}' not found") from None
            if len(self._models) > 4096:  # names are client input: bound the memory
                self._models.clear()
            self._models[name] = (trio.current_time(), generation, model)
        if model.model_path is None:
            raise InvalidRequestError(f'"{name}" has no model weights')
        return model

    async def list_models(self) -> list[Model]:
        """Every stored model, newest first (``/api/tags``, ``/v1/models``), from memory
        while fresh."""
        if self._listing is not None and self._fresh(self._listing[0], self._listing[1]):
            return self._listing[2]
        generation = self.store.generation
        models = await trio.to_thread.run_sync(self.store.list)
        self._listing = (trio.current_time(), generation, models)
        return models

    async def gguf(self, path: str) -> GGUFInfo:
        """Header of a model file, from the process-wide header cache the scheduler plans
        from (:mod:`ollamatrio.model_info`): blobs are content-addressed, so it never goes
        stale, and one read serves both."""
        try:
            return await read_model_info(path)
        except FileNotFoundError:
            raise ModelNotFoundError(f"model blob {Path(path).name} not found") from None
        except GGUFError as exc:  # the reader's words, with the blob's name for its path
            raise GGUFError(str(exc).replace(path, Path(path).name)) from None

    async def capabilities(self, model: Model) -> list[str]:
        assert model.model_path is not None
        return capabilities(model, await self.gguf(str(model.model_path)))

    def model_request(
        self,
        model: Model,
        options: Mapping[str, Any],
        keep_alive: float | None,
        caps: list[str],
        *,
        embedding: bool = False,
        shift: bool | None = None,
        cost: int = 1,
    ) -> ModelRequest:
        """The scheduler's request; ``embedding`` asks for a runner in embedding mode (an
        embedding model always gets one; a chat model's runner is reloaded into it once,
        and then serves both kinds of request).  Its place in the queue (principal,
        priority) is the request's this task serves, if any (api/priority.py); ``cost``
        its prompt's estimated tokens."""
        template = model.template or ""
        state = current_request()
        return ModelRequest(
            name=model.short_name,
            model_path=str(model.model_path),
            options=options,
            keep_alive=keep_alive,
            adapters=tuple(str(p) for p in model.adapters),
            projector=str(model.projectors[0]) if model.projectors else None,
            draft=str(model.drafts[0]) if model.drafts else None,
            embedding_only="embedding" in caps and "completion" not in caps,
            embeddings=embedding,
            shift=shift,
            # llama.cpp renders Jinja; a Go template layer cannot be applied (docs/api.md).
            chat_template=template if "{%" in template else None,
            digest=model.digest,
            details=model.details.to_json(),
            principal=state.principal if state is not None else "",
            priority=checked_priority(state.priority) if state is not None else "interactive",
            cost=cost,
        )


class Capability(enum.StrEnum):
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    TOOLS = "tools"
    INSERT = "insert"
    VISION = "vision"
    THINKING = "thinking"
    MTP = "mtp"  # not Ollama's: the file carries multi-token-prediction heads
    RERANK = "rerank"  # ours: a cross-encoder (rank pooling) that /api/rerank serves


# ``<arch>.pooling_type`` of a reranker (gguf.PoolingType.RANK): llama.cpp scores pairs.
_RANK_POOLING = 4


def capabilities(model: Model, info: GGUFInfo) -> list[str]:
    """As Ollama derives them: embedding when the GGUF declares a pooling type, else
    completion; tools/insert/thinking from the template; vision with a projector.  Ours
    besides: mtp when the file carries multi-token-prediction heads (speculative decoding's
    drafter), rerank when the pooling type is rank."""
    caps: list[str] = [
        Capability.EMBEDDING if info.pooling_type is not None else Capability.COMPLETION
    ]
    if info.pooling_type == _RANK_POOLING:
        caps.append(Capability.RERANK)
    # Both templates count: a Go TEMPLATE layer renders plain prompts, while tool calls go
    # through the GGUF's own (Jinja) template.  Ollama matches variable names without case.
    template = f"{model.template or ''}\n{info.chat_template or ''}".lower()
    if "tools" in template:
        caps.append(Capability.TOOLS)
    if "suffix" in template:
        caps.append(Capability.INSERT)
    if model.projectors:
        caps.append(Capability.VISION)
    if any(marker.lower() in template for marker in _THINKING_MARKERS):
        caps.append(Capability.THINKING)
    if has_mtp_heads(info):
        caps.append(Capability.MTP)
    for extra in model.config.get("capabilities") or ():
        if isinstance(extra, str) and extra not in caps:
            caps.append(extra)
    return [str(c) for c in caps]


def require_loadable(name: str, info: GGUFInfo) -> None:
    """A model llama.cpp would abort on at every load (one in the store from before this
    check, or from another server) fails here with the reason, before a runner starts."""
    duplicate = info.duplicate_token  # read with the header (model_info.py)
    if duplicate is not None:
        raise RunnerStartError(f'model "{name}" cannot be loaded: {duplicate}')


def require(name: str, caps: list[str], cap: str, label: str | None = None) -> None:
    """400 ``"<model>" does not support <label>`` unless the model has ``cap`` (Ollama's
    handlers' own checks: generate, chat, thinking)."""
    if cap not in caps:
        raise CapabilityError(f'"{name}" does not support {label or cap}')


def require_for_runner(model: Model, caps: list[str], cap: str) -> None:
    """400 ``<full model name> does not support <cap>``: Ollama's words for what its
    scheduler checks (tools, insert), which name the model in full (``server/images.go``
    ``CheckCapabilities``, wrapped with the name in ``server/routes.go``)."""
    if cap not in caps:
        raise CapabilityError(f"{model.name} does not support {cap}")


# -- /api/show -------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """A metadata value as Go's encoder writes it: a whole float is an integer
    (``rope.freq_base`` 10000)."""
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def model_info(info: GGUFInfo, verbose: bool) -> dict[str, Any]:
    """``model_info`` as Ollama shows it: without ``verbose`` every array that has items is
    ``null`` (Ollama reads the header with no room for arrays); with it, every array in
    full, vocabularies included (read from the file: call it in a worker thread)."""
    out: dict[str, Any] = {}
    for key, value in info.metadata.items():
        if key in _NOT_SHOWN:
            continue
        if isinstance(value, list | tuple | ArraySummary) and len(value):
            out[key] = _jsonable(info.full_array(key)) if verbose else None
        else:
            out[key] = _jsonable(value)
    out["general.parameter_count"] = info.parameter_count
    return dict(sorted(out.items()))


def template_in_use(model: Model, info: GGUFInfo) -> str:
    """The chat template generation applies (docs/compat.md): a Jinja template layer, else
    the GGUF's own template (which wins over a Go layer), else a Go layer."""
    layer = model.template or ""
    if is_go_template(layer) and info.chat_template:
        return info.chat_template
    return layer or info.chat_template or ""


def modelfile_of(model: Model, template: str | None = None) -> str:
    """The model's Modelfile; ``template``: the one in use, when it is not the model's
    own layer (the GGUF's)."""
    assert model.model_path is not None
    mf = Modelfile(
        models=(str(model.model_path), *(str(p) for p in model.projectors)),
        adapters=tuple(str(p) for p in model.adapters),
        drafts=tuple(str(p) for p in model.drafts),
        template=template or model.template,
        system=model.system,
        parameters=dict(model.params),
        licenses=model.license,
        messages=tuple(
            Message(str(m.get("role", "")), str(m.get("content", ""))) for m in model.messages
        ),
    )
    return render_modelfile(mf, model.short_name)


async def show(ctx: ApiContext, model: Model, verbose: bool) -> dict[str, Any]:
    """Ollama's ShowResponse: empty strings are left out (``omitempty``), ``tensors`` always
    there, ``template`` the one generation applies."""
    assert model.model_path is not None
    info = await ctx.gguf(str(model.model_path))
    template = template_in_use(model, info)
    texts = {
        "license": "\n".join(model.license),
        "modelfile": modelfile_of(model, template),
        "parameters": render_parameters(model.params),
        "template": template,
        "system": model.system or "",
    }
    out: dict[str, Any] = {key: text for key, text in texts.items() if text}
    out["details"] = model.details.to_json()
    out["model_info"] = await trio.to_thread.run_sync(model_info, info, verbose)
    if model.messages:
        out["messages"] = list(model.messages)
    if model.projectors:
        projector = await ctx.gguf(str(model.projectors[0]))
        out["projector_info"] = await trio.to_thread.run_sync(model_info, projector, verbose)
    if model.drafts:  # not Ollama's: the draft model's header, as projector_info
        draft = await ctx.gguf(str(model.drafts[0]))
        out["draft_info"] = await trio.to_thread.run_sync(model_info, draft, verbose)
    out["tensors"] = [
        {"name": t.name, "type": t.type.name, "shape": list(t.shape)} for t in info.tensors
    ]
    out["capabilities"] = capabilities(model, info)
    out["modified_at"] = rfc3339(model.modified_at)
    return out
