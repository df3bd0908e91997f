"""``/api/create`` at store level: a new manifest from an existing model or GGUF blobs.

The order of layers, the statuses and the config blob follow Ollama's ``server/create.go``:
base layers (from the parent model, one per GGUF file, or one converted from a Hugging Face
safetensors folder), rewritten in the type ``quantize`` asks for, then adapters, then the
template, system prompt, licenses, parameters and messages given in the request.  The
conversions are ``convert/``'s, imported on first use (numpy).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..convert.policy import ONLY_FLOAT_SOURCES, SOURCES, Target, parse_target
from ..errors import GGUFError, InvalidRequestError, ModelNotFoundError, NoSuchModelError
from ..gguf import DuplicateToken, GGUFInfo, read_gguf
from ..gguf.speculation import vocabulary_mismatch
from .manifest import (
    CONFIG_MEDIA_TYPE,
    MEDIA_ADAPTER,
    MEDIA_DRAFT,
    MEDIA_LICENSE,
    MEDIA_MESSAGES,
    MEDIA_MODEL,
    MEDIA_PARAMS,
    MEDIA_PROJECTOR,
    MEDIA_PROMPT,
    MEDIA_SYSTEM,
    MEDIA_TEMPLATE,
    Layer,
    Manifest,
    StorageError,
    config_json,
    go_json,
    parse_digest,
)
from .names import ModelName, parse_name
from .store import _CHUNK, ModelStore, PinSet

NEITHER_FROM_NOR_FILES = "neither 'from' or 'files' was specified"
NOT_GGUF = "supplied file was not in GGUF format"
_WEIGHTS = (MEDIA_MODEL, MEDIA_PROJECTOR, MEDIA_ADAPTER)
#: The digest Ollama's quantizing progress lines carry (a bar of their own, not a blob's).
QUANTIZE_DIGEST = "0000000000000000000"
Event = dict[str, Any]


def human_number(n: int) -> str:
    """Ollama's ``format.HumanNumber``: 134515008 -> "134.52M", 8030261248 -> "8.0B"."""
    for scale, suffix, decimals in ((1_000_000_000, "B", 1), (1_000_000, "M", 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{suffix}" if value.is_integer() else f"{value:.{decimals}f}{suffix}"
    if n >= 1000:
        return f"{n / 1000:.0f}K"
    return str(n)


def _file_kind(files: Mapping[str, str]) -> str:
    # Ollama decides by file name: any .safetensors, else .gguf / .bin.
    names = list(files)
    if any(n.endswith(".safetensors") for n in names):
        return "safetensors"
    if any(n.endswith((".gguf", ".bin")) for n in names):
        return "gguf"
    return ""


@dataclass(frozen=True)
class CreateRequest:
    """A validated create request; every check that needs no GGUF parsing is done here."""

    name: ModelName
    from_model: ModelName | None
    files: tuple[str, ...]  # canonical digests
    adapters: tuple[str, ...]
    template: str | None
    system: str | None
    parameters: Mapping[str, Any]
    licenses: tuple[str, ...]
    messages: tuple[Mapping[str, Any], ...]
    config_extra: Mapping[str, str] = field(default_factory=dict)
    draft: Draft | None = None
    quantize: Target | None = None
    #: A Hugging Face folder to convert: file name -> digest (``files`` when they are
    #: safetensors).
    safetensors: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def validate(
        cls,
        store: ModelStore,
        *,
        name: str | ModelName,
        from_model: str | None,
        files: Mapping[str, str] | None,
        adapters: Mapping[str, str] | None,
        template: str | None,
        system: str | None,
        parameters: Mapping[str, Any] | None,
        license: str | Sequence[str] | None,
        messages: Sequence[Mapping[str, Any]] | None,
        quantize: str | None,
        renderer: str | None,
        parser: str | None,
        requires: str | None,
        draft_files: Mapping[str, str] | None = None,
        draft: str | None = None,
    ) -> CreateRequest:
        target = parse_name(name)
        quantize_to = parse_target(quantize) if quantize else None
        source = parse_name(from_model) if from_model else None
        file_digests: tuple[str, ...] = ()
        safetensors: dict[str, str] = {}
        if source is not None:
            if not store.exists(source):
                raise ModelNotFoundError(f'model "{from_model}" not found, try pulling it first')
        elif files is not None and _file_kind(files) == "safetensors":
            safetensors = _safetensors_files(store, files)
        elif files is not None:
            file_digests = _gguf_digests(store, files, adapter=False)
        else:
            raise InvalidRequestError(NEITHER_FROM_NOR_FILES)
        adapter_digests = _gguf_digests(store, adapters, adapter=True) if adapters else ()
        chosen_draft = _draft(store, draft_files, draft, source, file_digests)
        if parameters is not None and not isinstance(parameters, Mapping):
            raise InvalidRequestError("parameters must be an object")
        extra = {
            key: value
            for key, value in (("renderer", renderer), ("parser", parser), ("requires", requires))
            if value
        }
        return cls(
            name=target,
            from_model=source,
            files=file_digests,
            adapters=adapter_digests,
            template=template or None,
            system=system or None,
            parameters=dict(parameters or {}),
            licenses=_licenses(license),
            messages=_messages(messages),
            config_extra=extra,
            draft=chosen_draft,
            quantize=quantize_to,
            safetensors=safetensors,
        )


@dataclass(frozen=True)
class Draft:
    """The draft model a create stores: its weights' blob, and the model it came from when
    ``DRAFT`` named a stored model (the layer's ``from``)."""

    digest: str
    source: str = ""
    architecture: str = ""


def _draft(
    store: ModelStore,
    files: Mapping[str, str] | None,
    name: str | None,
    source: ModelName | None,
    file_digests: tuple[str, ...],
) -> Draft | None:
    """The request's draft model, checked to share the target's vocabulary (a 400 naming
    the difference otherwise).  ``draft_files`` (Ollama's field: a GGUF uploaded as a blob)
    or ``draft`` (a stored model's name; an extension of Ollama's request)."""
    if files and name:
        raise InvalidRequestError("give either draft_files or draft, not both")
    if files:
        digests = _gguf_digests(store, files, adapter=False)
        if len(digests) > 1:
            raise InvalidRequestError("only one draft model file is supported")
        chosen = Draft(digests[0])
        label = next(iter(files))
    elif name:
        try:
            model = store.resolve(name)
        except NoSuchModelError:
            raise NoSuchModelError(
                f'draft model "{name}" not found, try pulling it first'
            ) from None
        if model.model_path is None:
            raise InvalidRequestError(f'draft model "{name}" has no model weights')
        chosen = Draft(_model_layer(model.manifest.layers), model.name.display_shortest)
        label = name
    else:
        return None
    draft_path = store.blob_path(chosen.digest)
    draft_info = _read(draft_path)
    duplicate = _read_tokens(draft_path, draft_info)
    if duplicate is not None:
        raise InvalidRequestError(f"invalid draft model file: {duplicate}")
    if source is not None:
        target_path = store.resolve(source).model_path
    else:
        target_path = store.blob_path(file_digests[0]) if file_digests else None
    if target_path is not None:
        mismatch = _checked(draft_path, lambda: vocabulary_mismatch(_read(target_path), draft_info))
        if mismatch is not None:
            raise InvalidRequestError(
                f'draft model "{label}" does not share the model\'s vocabulary: {mismatch}'
            )
    return Draft(chosen.digest, chosen.source, draft_info.architecture)


def _model_layer(layers: Sequence[Layer]) -> str:
    return next(layer.digest for layer in layers if layer.media_type == MEDIA_MODEL)


def _checked(path: Path, check: Callable[[], str | None]) -> str | None:
    """``check()``, a damaged token list being a 400 as a damaged header is."""
    try:
        return check()
    except GGUFError as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        raise InvalidRequestError(f"{NOT_GGUF}: {reason}") from None


def _gguf_digests(store: ModelStore, files: Mapping[str, str], *, adapter: bool) -> tuple[str, ...]:
    if not isinstance(files, Mapping):
        raise InvalidRequestError("files must be an object of file name to digest")
    kind = _file_kind(files)
    if kind == "safetensors":
        raise InvalidRequestError("converting a safetensors adapter is not supported")
    if kind != "gguf":
        raise InvalidRequestError("unknown type")
    if adapter and len(files) > 1:
        raise InvalidRequestError("only one adapter is currently supported")
    return tuple(_uploaded(store, digest) for digest in files.values())


def _uploaded(store: ModelStore, digest: str) -> str:
    canonical = parse_digest(digest)
    if not store.has_blob(canonical):
        raise InvalidRequestError(
            f"blob {canonical} not found: upload it with POST /api/blobs/{canonical} first"
        )
    return canonical


def _safetensors_files(store: ModelStore, files: Mapping[str, str]) -> dict[str, str]:
    """A Hugging Face folder's files, checked as far as the config says (architecture,
    shape, tokenizer present) before anything is converted."""
    from ..convert.hf_import import check_folder  # numpy and gguf: only when converting

    digests = {name: _uploaded(store, digest) for name, digest in files.items()}
    check_folder({name: store.blob_path(digest) for name, digest in digests.items()})
    return digests


def _licenses(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise InvalidRequestError("license must be a string or a list of strings")


def _messages(value: Sequence[Mapping[str, Any]] | None) -> tuple[Mapping[str, Any], ...]:
    if not value:
        return ()
    out = []
    for message in value:
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content", ""), str)
        ):
            raise InvalidRequestError("messages must be objects with a role and a content")
        # Ollama's api.Message field order: role, content, then the optional fields.
        rest = {k: v for k, v in message.items() if k not in ("role", "content")}
        out.append({"role": message["role"], "content": message.get("content", ""), **rest})
    return tuple(out)


@dataclass
class _Step:
    layer: Layer
    status: str
    info: GGUFInfo | None = None


def run_create(store: ModelStore, request: CreateRequest) -> Iterator[dict[str, Any]]:
    """Build and write the manifest, yielding Ollama's progress statuses."""
    try:
        yield from _create_steps(store, request)
    except StorageError as exc:  # "write blob sha256:...": say for which model
        shown = request.name.display_shortest
        if f'"{shown}"' in str(exc):
            raise
        raise StorageError(f'create "{shown}": {exc}') from None


def _create_steps(store: ModelStore, request: CreateRequest) -> Iterator[dict[str, Any]]:
    with store.pinned() as pins:
        target = request.name
        config_extra: dict[str, Any] = {}
        steps: list[_Step] = []
        if request.from_model is not None:
            steps, config_extra = _from_model(store, request.from_model, pins)
        elif request.safetensors:
            yield {"status": "converting model"}
            steps.append((yield from _converted(store, request.safetensors, pins)))
        else:
            for digest in request.files:
                yield {"status": "parsing GGUF"}
                steps.append(_gguf_step(store, digest, pins, adapter=False))
        if request.quantize is not None:
            steps = yield from _quantized(store, steps, request.quantize, pins)
        for digest in request.adapters:
            yield {"status": "parsing GGUF"}
            steps.append(_gguf_step(store, digest, pins, adapter=True))
        config_extra.update(request.config_extra)
        if request.draft is not None:
            steps = _replace(steps, (MEDIA_DRAFT,))  # one draft: the request's wins
            steps.append(_draft_step(store, request.draft, pins))
            config_extra["draft"] = {
                "model_format": "gguf",
                "architecture": request.draft.architecture,
            }

        config = _config_from(steps, config_extra)
        if request.template:
            steps = _replace(steps, (MEDIA_TEMPLATE, MEDIA_PROMPT))
            steps.append(_text_step(store, MEDIA_TEMPLATE, request.template.encode(), pins))
        if request.system:
            steps = _replace(steps, (MEDIA_SYSTEM,))
            steps.append(_text_step(store, MEDIA_SYSTEM, request.system.encode(), pins))
        for text in request.licenses:
            steps.append(_text_step(store, MEDIA_LICENSE, text.encode(), pins))
        steps = _with_parameters(store, steps, request.parameters, pins)
        if request.messages:
            steps = _replace(steps, (MEDIA_MESSAGES,))
            data = go_json(list(request.messages))
            steps.append(_text_step(store, MEDIA_MESSAGES, data, pins))

        layers = [step.layer for step in steps]
        config_data = config(layers)
        config_digest, _ = store.write_bytes_blob(config_data, pins)
        config_layer = Layer(CONFIG_MEDIA_TYPE, config_digest, len(config_data))

        for step in steps:
            yield {"status": step.status}
        yield {"status": "writing manifest"}
        # Writing it removes the blobs only the manifest it replaces used (store.py).
        store.write_manifest(target, Manifest(config=config_layer, layers=tuple(layers)))
        yield {"status": "success"}


def _from_model(
    store: ModelStore, source: ModelName, pins: PinSet
) -> tuple[list[_Step], dict[str, Any]]:
    model = store.resolve(source)
    steps = []
    for layer in model.manifest.layers:
        if not store.pin_if_present(layer.digest, pins):
            raise ModelNotFoundError(
                f'model "{source.display_shortest}" is incomplete, try pulling it again'
            )
        path = store.blob_path(layer.digest)
        size = path.stat().st_size
        info = _read(path) if layer.media_type in _WEIGHTS else None
        new = Layer(layer.media_type, layer.digest, size, model.name.display_shortest, layer.name)
        steps.append(_Step(new, f"using existing layer {layer.digest}", info))
    kept = ("renderer", "parser", "requires", "draft")
    extra = {k: model.config[k] for k in kept if model.config.get(k)}
    return steps, extra


def _converted(
    store: ModelStore, files: Mapping[str, str], pins: PinSet
) -> Generator[Event, None, _Step]:
    """A Hugging Face folder converted to a GGUF blob (Ollama's "converting model")."""
    from ..convert.hf_import import convert_folder

    for digest in files.values():
        if not store.pin_if_present(digest, pins):
            raise InvalidRequestError(f"blob {digest} not found")
    paths = {name: store.blob_path(digest) for name, digest in files.items()}
    with store.blob_writer() as writer:
        for done in convert_folder(paths, writer.path):
            yield {"status": "converting model", "total": done.total, "completed": done.done}
        digest = writer.commit_file(pins)
    return _new_model_step(store, digest, created=writer.created)


def _quantized(
    store: ModelStore, steps: list[_Step], target: Target, pins: PinSet
) -> Generator[Event, None, list[_Step]]:
    """The model layers rewritten in ``target``'s types, with Ollama's progress lines;
    a layer already of that type is kept, one not F32, F16 or BF16 refused."""
    from ..convert.quantize import quantize_gguf  # numpy and gguf: only when quantizing

    out = []
    for step in steps:
        if step.layer.media_type != MEDIA_MODEL or step.info is None:
            out.append(step)
            continue
        file_type = step.info.file_type
        source = SOURCES.get(file_type) if file_type is not None else None
        if source is None:
            raise InvalidRequestError(ONLY_FLOAT_SOURCES)
        if source == target.name:
            out.append(step)
            continue
        status, size = f"quantizing {source} model to {target.name}", step.layer.size
        with store.blob_writer() as writer:
            for done in quantize_gguf(store.blob_path(step.layer.digest), writer.path, target):
                completed = size * done.done // done.total if done.total else size
                yield {
                    "status": status,
                    "digest": QUANTIZE_DIGEST,
                    "total": size,
                    "completed": completed,
                }
            yield {"status": "verifying conversion"}
            digest = writer.commit_file(pins)
        out.append(_new_model_step(store, digest, created=writer.created))
    return out


def _new_model_step(store: ModelStore, digest: str, *, created: bool) -> _Step:
    path = store.blob_path(digest)
    status = "creating new layer" if created else "using existing layer"
    return _Step(Layer(MEDIA_MODEL, digest, path.stat().st_size), f"{status} {digest}", _read(path))


def _read(path: Any) -> GGUFInfo:
    """The header of a blob; a defect is a 400 with Ollama's words, then the reader's exact
    reason (the blob's path in the store left out)."""
    try:
        return read_gguf(path)
    except GGUFError as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        raise InvalidRequestError(f"{NOT_GGUF}: {reason}") from None


def _read_tokens(path: Path, info: GGUFInfo) -> DuplicateToken | None:
    try:
        return info.duplicate_token
    except GGUFError as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        raise InvalidRequestError(f"{NOT_GGUF}: {reason}") from None


def _gguf_step(store: ModelStore, digest: str, pins: PinSet, *, adapter: bool) -> _Step:
    if not store.pin_if_present(digest, pins):
        raise InvalidRequestError(f"blob {digest} not found")
    path = store.blob_path(digest)
    info = _read(path)
    duplicate = _read_tokens(path, info)
    if duplicate is not None:
        # A file llama.cpp aborts on at every load: refused here, not at each use.
        raise InvalidRequestError(f"invalid model file: {duplicate}")
    kind = info.metadata.get("general.type")
    if adapter or kind == "adapter":
        media = MEDIA_ADAPTER
    elif (
        info.architecture == "clip"  # how Ollama tells a projector from a model
        or kind in ("projector", "mmproj")
        or f"{info.architecture}.vision.block_count" in info.metadata
    ):
        media = MEDIA_PROJECTOR
    else:
        media = MEDIA_MODEL
    layer = Layer(media, digest, path.stat().st_size)
    return _Step(layer, f"using existing layer {digest}", info)


def _draft_step(store: ModelStore, draft: Draft, pins: PinSet) -> _Step:
    if not store.pin_if_present(draft.digest, pins):
        raise InvalidRequestError(f"blob {draft.digest} not found")
    size = store.blob_path(draft.digest).stat().st_size
    layer = Layer(MEDIA_DRAFT, draft.digest, size, draft.source)
    return _Step(layer, f"using existing layer {draft.digest}")


def _text_step(store: ModelStore, media: str, data: bytes, pins: PinSet) -> _Step:
    digest, created = store.write_bytes_blob(data, pins)
    status = "creating new layer" if created else "using existing layer"
    return _Step(Layer(media, digest, len(data)), f"{status} {digest}")


def _replace(steps: list[_Step], media_types: tuple[str, ...]) -> list[_Step]:
    return [step for step in steps if step.layer.media_type not in media_types]


def _with_parameters(
    store: ModelStore, steps: list[_Step], parameters: Mapping[str, Any], pins: PinSet
) -> list[_Step]:
    # New values win; the parent's other parameters are kept (Ollama's setParameters).
    merged = dict(parameters)
    for step in steps:
        if step.layer.media_type == MEDIA_PARAMS:
            existing = store.read_blob_json(step.layer.digest)
            if isinstance(existing, Mapping):
                for key, value in existing.items():
                    merged.setdefault(key, value)
    if not merged:
        return steps
    steps = _replace(steps, (MEDIA_PARAMS,))
    steps.append(_text_step(store, MEDIA_PARAMS, go_json(merged, sort_keys=True), pins))
    return steps


def _config_from(
    steps: list[_Step], extra: Mapping[str, Any]
) -> Callable[[Sequence[Layer]], bytes]:
    """A function of the final layers that returns the config blob's bytes."""
    model_format = family = model_type = file_type = ""
    families: list[str] = []
    for step in steps:
        if step.info is None:
            continue
        model_format = model_format or "gguf"
        family = family or step.info.architecture
        model_type = model_type or human_number(step.info.parameter_count)
        file_type = file_type or (step.info.file_type_name or "unknown")
        families.append(step.info.architecture)

    def build(layers: Sequence[Layer]) -> bytes:
        return config_json(
            model_format=model_format,
            model_family=family,
            model_families=families or None,
            model_type=model_type,
            file_type=file_type,
            diff_ids=[layer.digest for layer in layers],
            extra=extra,
        )

    return build


def create_model(
    store: ModelStore,
    name: str | ModelName,
    *,
    from_model: str | None = None,
    files: Mapping[str, str] | None = None,
    adapters: Mapping[str, str] | None = None,
    template: str | None = None,
    system: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    license: str | Sequence[str] | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    quantize: str | None = None,
    renderer: str | None = None,
    parser: str | None = None,
    requires: str | None = None,
    draft_files: Mapping[str, str] | None = None,
    draft: str | None = None,
) -> Iterator[dict[str, Any]]:
    """``/api/create`` at store level: validates now, then yields progress dicts.

    Statuses as Ollama's: "parsing GGUF" (or "converting model"), "quantizing F16 model
    to Q8_0" and "verifying conversion" when asked to, "using existing layer sha256:...",
    "creating new layer sha256:...", "writing manifest", "success".
    """
    request = CreateRequest.validate(
        store,
        name=name,
        from_model=from_model,
        files=files,
        adapters=adapters,
        template=template,
        system=system,
        parameters=parameters,
        license=license,
        messages=messages,
        quantize=quantize,
        renderer=renderer,
        parser=parser,
        requires=requires,
        draft_files=draft_files,
        draft=draft,
    )
    return run_create(store, request)


def import_gguf(
    store: ModelStore, name: str | ModelName, path: str | os.PathLike[str], **create_args: Any
) -> Iterator[dict[str, Any]]:
    """Copy a local GGUF file into the store and create ``name`` from it.

    The copy is hashed while it is written; zero-filled stretches of a sparse source
    stay holes in the blob.  Yields "copying file" progress, then :func:`create_model`'s.
    """
    model_name = parse_name(name)
    source = Path(path)
    read_gguf(source)  # refuse a non-GGUF file before copying anything
    return _import_steps(store, model_name, source, create_args)


def _import_steps(
    store: ModelStore, name: ModelName, source: Path, create_args: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    total = source.stat().st_size
    yield {"status": "copying file", "total": total, "completed": 0}
    with store.pinned() as pins:
        with store.blob_writer() as writer, open(source, "rb") as f:
            while chunk := f.read(_CHUNK):
                writer.write(chunk)
                yield {"status": "copying file", "total": total, "completed": writer.size}
            digest = writer.commit(pins)
        yield {
            "status": f"copied file {digest}",
            "digest": digest,
            "total": total,
            "completed": total,
        }
        key = source.name if source.suffix in (".gguf", ".bin") else source.name + ".gguf"
        yield from create_model(store, name, files={key: digest}, **create_args)
