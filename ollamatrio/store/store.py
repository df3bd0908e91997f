"""The on-disk model store, in Ollama's layout so both servers can share one directory.

::

    <root>/manifests/<host>/<namespace>/<model>/<tag>   JSON manifests
    <root>/blobs/sha256-<hex>                           content-addressed files

Every method is synchronous (call it through ``trio.to_thread.run_sync``) and safe to
call from several threads: blob files appear by atomic rename, manifests are replaced
atomically, and the steps that decide which blobs are still referenced hold one lock.
Nothing resolves outside the root: names and digests are validated before they become
path components, and symlinks whose target leaves the store are refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import InvalidRequestError, ModelNotFoundError, NoSuchModelError, OllamatrioError
from .manifest import (
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
    Manifest,
    StorageError,
    StoreError,
    blob_filename,
    on_disk,
    os_reason,
    parse_digest,
)
from .names import ModelName, parse_name

log = logging.getLogger("ollamatrio.store")

_TEMP_PREFIX = ".tmp-"  # never a valid digest or name, so readers skip it
_CHUNK = 8 << 20
_HOLE_MIN = 64 << 10  # all-zero runs at least this long stay holes in the blob


def _remove_temp(path: str) -> int:
    """Remove a leftover temporary or partial file: 1 if removed.  Best-effort: on a
    read-only or otherwise unwritable store it stays, and the store still serves reads."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("could not remove leftover file %s: %s", path, exc)
        return 0
    return 1


def not_found(name: str) -> ModelNotFoundError:
    return NoSuchModelError(f'model "{name}" not found, try pulling it first')


@dataclass(frozen=True)
class ModelDetails:
    """The ``details`` object of ``/api/tags``, ``/api/show`` and ``/api/ps``."""

    parent_model: str = ""
    format: str = ""
    family: str = ""
    families: tuple[str, ...] | None = None
    parameter_size: str = ""
    quantization_level: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "parent_model": self.parent_model,
            "format": self.format,
            "family": self.family,
            "families": list(self.families) if self.families is not None else None,
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization_level,
        }


@dataclass(frozen=True)
class Model:
    """Everything the server needs to know about one stored model."""

    name: ModelName  # with the case it is stored under
    digest: str  # hex SHA-256 of the manifest file bytes
    manifest: Manifest
    config: Mapping[str, Any]  # the config blob's JSON (renderer, parser, capabilities...)
    model_path: Path | None  # the GGUF weights; None if the manifest has no model layer
    template: str | None = None
    system: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    license: tuple[str, ...] = ()
    messages: tuple[Mapping[str, Any], ...] = ()
    adapters: tuple[Path, ...] = ()
    projectors: tuple[Path, ...] = ()
    drafts: tuple[Path, ...] = ()  # draft models for speculative decoding (the first is used)
    size: int = 0  # config and layers, bytes
    modified_at: datetime = field(default_factory=lambda: datetime.now().astimezone())
    details: ModelDetails = field(default_factory=ModelDetails)

    @property
    def short_name(self) -> str:
        return self.name.display_shortest


@dataclass(frozen=True)
class PruneResult:
    blobs_removed: int = 0
    bytes_removed: int = 0
    temp_files_removed: int = 0


class PinSet:
    """Digests an operation in progress needs; prune and delete leave them alone.

    A blob the operation itself wrote (:meth:`created`) and a blob whose removal a pin held
    back are looked at again when the last pin on them goes: whichever no manifest names
    by then is removed, so an operation that fails, is cut short or loses a race to another
    writer leaves nothing behind.
    """

    def __init__(self, store: ModelStore) -> None:
        self._store = store
        self._digests: set[str] = set()
        self._created: set[str] = set()

    def add(self, digest: str) -> None:
        digest = parse_digest(digest)
        with self._store._lock:
            if digest not in self._digests:
                self._digests.add(digest)
                self._store._pins[digest] += 1

    def created(self, digest: str) -> None:
        """Pin ``digest``, a blob this operation put in the store: if no manifest names it
        once the operation ends, it goes."""
        digest = parse_digest(digest)
        with self._store._lock:
            self.add(digest)
            self._created.add(digest)

    def release(self) -> None:
        store = self._store
        with store._lock:
            unpinned = set()
            for digest in self._digests:
                store._pins[digest] -= 1
                if store._pins[digest] <= 0:
                    del store._pins[digest]
                    unpinned.add(digest)
            candidates = self._created | (unpinned & store._held_back)
            self._digests.clear()
            self._created.clear()
            if candidates:
                store.remove_unreferenced(candidates)


class BlobWriter:
    """Write one blob incrementally: hashed while written, verified, renamed into place.

    Data goes to a temporary file inside ``blobs/`` (same filesystem, so the final
    rename is atomic).  Long all-zero runs are skipped with a seek, so a sparse source
    stays sparse.  Use as a context manager; leaving it without :meth:`commit` removes
    the temporary file.
    """

    def __init__(self, store: ModelStore, expected: str | None = None) -> None:
        self._store = store
        self._expected = parse_digest(expected) if expected is not None else None
        self._action = f"write blob {self._expected or '(new)'}"
        with store._lock, on_disk(self._action):  # registered before prune can see it
            fd, tmp = tempfile.mkstemp(dir=store.blobs_dir, prefix=_TEMP_PREFIX + "sha256-")
            self._tmp = Path(tmp)
            store._temps.add(self._tmp)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self.size = 0
        self.digest: str | None = None
        self.created = False  # True when commit() put a new blob in place

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.digest is not None or self._file.closed:
            raise OllamatrioError("blob writer is already closed")
        if not data:
            return
        self._hash.update(data)
        n = len(data)
        with on_disk(self._action):
            if n >= _HOLE_MIN and bytes(data).count(0) == n:
                self._file.seek(n, os.SEEK_CUR)
            else:
                self._file.write(data)
        self.size += n

    def commit(self, pins: PinSet | None = None) -> str:
        """Verify the digest and move the blob into place; returns ``sha256:<hex>``.

        With ``pins`` the blob is pinned in the same step, so no prune can slip between
        the rename and the manifest that will reference it.
        """
        if self.digest is not None:
            return self.digest
        try:
            digest = "sha256:" + self._hash.hexdigest()
            with on_disk(f"write blob {digest}"):
                self._file.truncate(self.size)  # materialises a trailing hole
                self._file.close()
            if self._expected is not None and digest != self._expected:
                raise InvalidRequestError(
                    f'digest mismatch, expected "{self._expected}", got "{digest}"'
                )
            with on_disk(f"store blob {digest}"):
                self.created = self._store._install_blob(self._tmp, digest, pins)
        except BaseException:
            self.abort()
            raise
        self.digest = digest
        return digest

    @property
    def path(self) -> Path:
        """The temporary file, for a writer that must open a path of its own (a GGUF
        writer); then :meth:`commit_file` instead of :meth:`commit`."""
        return self._tmp

    def commit_file(self, pins: PinSet | None = None) -> str:
        """:meth:`commit` for bytes written to :attr:`path` directly: hashed from disk."""
        if self.size:
            raise OllamatrioError("blob writer: both write() and the path were used")
        self._file.close()
        with on_disk(self._action), open(self._tmp, "rb") as f:
            while chunk := f.read(_CHUNK):
                self._hash.update(chunk)
                self.size += len(chunk)
        self._file = open(self._tmp, "ab")  # noqa: SIM115 - commit() closes it
        return self.commit(pins)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)
        self._store._forget_temp(self._tmp)

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.digest is None:
            self.abort()


class ModelStore:
    """Manifests and blobs under ``root`` (``settings.models_dir``)."""

    def __init__(self, root: str | os.PathLike[str], *, noprune: bool = False) -> None:
        self.root = Path(root).expanduser()
        self.manifests_dir = self.root / "manifests"
        self.blobs_dir = self.root / "blobs"
        self.manifests_dir.mkdir(parents=True, exist_ok=True)
        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        self.noprune = noprune
        self._real_root = self.root.resolve(strict=True)
        self._lock = threading.RLock()
        self._pins: Counter[str] = Counter()  # digests an operation in progress needs
        # Unreferenced digests whose removal a pin held back: looked at again when the
        # last pin on them goes (PinSet.release).
        self._held_back: set[str] = set()
        self._temps: set[Path] = set()  # temporary files of live writers
        # Models read from manifests, by manifest path, with the file's identity when read:
        # a manifest is only ever replaced (never edited in place), so an unchanged
        # (inode, mtime, size) means the model is unchanged, whoever writes the store.
        self._loaded: dict[Path, tuple[tuple[int, int, int], bool, Model]] = {}
        #: Bumped by every manifest this process writes or deletes (caches above this use it).
        self.generation = 0

    # -- paths ---------------------------------------------------------------------------

    def _confined(self, path: Path) -> Path:
        """``path`` itself, after checking that it (and any link on it) stays in the store."""
        if not path.resolve().is_relative_to(self._real_root):
            log.warning("refusing %s: it points outside the model store", path)
            where = path.relative_to(self.root) if path.is_relative_to(self.root) else path.name
            raise StoreError(f"refusing {where}: it points outside the model store")
        return path

    def blob_path(self, digest: str) -> Path:
        """Path of the blob for a ``sha256:<hex>`` / ``sha256-<hex>`` digest."""
        return self._confined(self.blobs_dir / blob_filename(digest))

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def manifest_path(self, name: str | ModelName) -> Path:
        return self._confined(self.manifests_dir.joinpath(*parse_name(name).parts))

    # -- blobs ---------------------------------------------------------------------------

    def blob_writer(self, digest: str | None = None) -> BlobWriter:
        """A writer for one new blob; with ``digest`` the content is verified against it."""
        return BlobWriter(self, digest)

    def write_blob(self, digest: str, chunks: Iterable[bytes], pins: PinSet | None = None) -> bool:
        """Store ``chunks`` as the blob ``digest``; False if it was already present.

        An existing blob is kept without reading ``chunks`` (Ollama answers 200 then).
        With ``pins`` the blob is pinned as soon as it exists.
        """
        if self.pin_if_present(parse_digest(digest), pins):
            return False
        with self.blob_writer(digest) as writer:
            for chunk in chunks:
                writer.write(chunk)
            writer.commit(pins)
        return writer.created

    def write_bytes_blob(self, data: bytes, pins: PinSet | None = None) -> tuple[str, bool]:
        """Store a small blob from memory; returns its digest and whether it is new."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        return digest, self.write_blob(digest, [data], pins)

    def pin_if_present(self, digest: str, pins: PinSet | None) -> bool:
        """Whether the blob exists; if so it joins ``pins`` in the same locked step."""
        with self._lock:
            present = self.has_blob(digest)
            if present and pins is not None:
                pins.add(digest)
            return present

    def _install_blob(self, tmp: Path, digest: str, pins: PinSet | None) -> bool:
        final = self.blob_path(digest)
        with self._lock:
            self._temps.discard(tmp)
            if final.is_file():
                if pins is not None:
                    pins.add(digest)
                tmp.unlink(missing_ok=True)
                return False
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
            if pins is not None:
                pins.created(digest)
            return True

    def _forget_temp(self, tmp: Path) -> None:
        with self._lock:
            self._temps.discard(tmp)

    @contextlib.contextmanager
    def pinned(self, digests: Iterable[str] = ()) -> Iterator[PinSet]:
        """Keep blobs from being pruned while an operation needs them (see :class:`PinSet`)."""
        pins = PinSet(self)
        try:
            for digest in digests:
                pins.add(digest)
            yield pins
        finally:
            pins.release()

    # -- manifests -----------------------------------------------------------------------

    def _entries(self) -> Iterator[tuple[ModelName, Path]]:
        """Every ``(name, manifest path)`` four levels under ``manifests/``."""

        def subdirs(path: Path) -> list[Path]:
            try:
                return sorted(p for p in path.iterdir() if p.is_dir())
            except OSError:
                return []

        for host in subdirs(self.manifests_dir):
            for namespace in subdirs(host):
                for model in subdirs(namespace):
                    try:
                        tags = sorted(model.iterdir())
                    except OSError:
                        continue
                    for tag in tags:
                        name = ModelName.from_parts(
                            (host.name, namespace.name, model.name, tag.name)
                        )
                        if name is None or not tag.is_file():
                            continue
                        if not tag.resolve().is_relative_to(self._real_root):
                            log.warning("ignoring %s: it points outside the model store", tag)
                            continue
                        yield name, tag

    def _find(self, name: ModelName) -> tuple[ModelName, Path] | None:
        """The stored name and manifest path for ``name``, matched case-insensitively."""
        exact = self.manifests_dir.joinpath(*name.parts)
        if exact.is_file():
            return name, exact
        for stored, path in self._entries():
            if stored == name:
                return stored, path
        return None

    def _name_for_write(self, name: ModelName) -> ModelName:
        """``name`` with each part spelled like an existing directory that differs only in case.

        Ollama does the same, so ``Llama3`` overwrites ``llama3`` instead of creating a twin.
        """
        parts: list[str] = []
        current = self.manifests_dir
        for part in name.parts:
            chosen = part
            if not (current / part).exists():
                with contextlib.suppress(OSError):
                    for entry in sorted(os.listdir(current)):
                        if entry.lower() == part.lower():
                            chosen = entry
                            break
            parts.append(chosen)
            current = current / chosen
        return ModelName(*parts)

    def _read_manifest(self, path: Path) -> tuple[Manifest, str, float]:
        data = self._confined(path).read_bytes()
        mtime = path.stat().st_mtime
        return Manifest.parse(data), hashlib.sha256(data).hexdigest(), mtime

    def read_manifest(self, name: str | ModelName) -> Manifest:
        """The manifest stored for ``name``; ModelNotFoundError if there is none."""
        model_name = parse_name(name)
        found = self._find(model_name)
        if found is None:
            raise not_found(str(name) if isinstance(name, str) else model_name.display_shortest)
        return self._read_manifest(found[1])[0]

    def read_manifest_bytes(self, name: str | ModelName) -> tuple[ModelName, bytes, Manifest]:
        """The stored name (its spelling on disk), manifest bytes and parsed manifest for
        ``name``, as a push sends them; ModelNotFoundError if there is none."""
        model_name = parse_name(name)
        found = self._find(model_name)
        if found is None:
            raise not_found(str(name) if isinstance(name, str) else model_name.display_shortest)
        stored, path = found
        data = self._confined(path).read_bytes()
        return stored, data, Manifest.parse(data)

    def write_manifest(self, name: str | ModelName, manifest: Manifest | bytes) -> str:
        """Write a manifest atomically; returns the hex digest of the bytes written.

        Raw bytes (a manifest as a registry served it) are validated and written
        unchanged, so the digest matches the registry's.  Every blob it names must exist.
        The blobs of the manifest it replaces that no manifest names any more are removed
        in the same locked step (unless noprune), as Ollama's create and pull do.
        """
        if isinstance(manifest, Manifest):
            data, parsed = manifest.to_bytes(), manifest
        else:
            data, parsed = bytes(manifest), Manifest.parse(manifest)
        with self._lock:
            for digest in parsed.digests():
                if not self.has_blob(digest):
                    raise StoreError(f"cannot write manifest: blob {digest} is missing")
            target = self._name_for_write(parse_name(name))
            path = self.manifests_dir.joinpath(*target.parts)
            with on_disk(f'write manifest for "{target.display_shortest}"'):
                path.parent.mkdir(parents=True, exist_ok=True)
                self._confined(path)
                replaced = self._digests_of(path) if path.is_file() else set()
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX)
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, path)
                except BaseException:
                    Path(tmp).unlink(missing_ok=True)
                    raise
            self.generation += 1
            if not self.noprune:
                self.remove_unreferenced(replaced - parsed.digests())
        return hashlib.sha256(data).hexdigest()

    def _digests_of(self, path: Path) -> set[str]:
        """The blobs the manifest at ``path`` names; none if it cannot be read (its blobs
        are then left to a later prune)."""
        try:
            return self._read_manifest(path)[0].digests()
        except (StoreError, OSError) as exc:
            log.warning("manifest %s unreadable, keeping its blobs: %s", path.name, exc)
            return set()

    # -- models --------------------------------------------------------------------------

    def resolve(self, name: str | ModelName) -> Model:
        """The stored model called ``name``; ModelNotFoundError if absent or incomplete."""
        model_name = parse_name(name)
        shown = name if isinstance(name, str) else model_name.display_shortest
        found = self._find(model_name)
        if found is None:
            raise not_found(shown)
        return self._load(*found, check_blobs=True)

    def exists(self, name: str | ModelName) -> bool:
        return self._find(parse_name(name)) is not None

    def list(self) -> list[Model]:
        """Every readable model, most recently modified first (as ``/api/tags``)."""
        models = []
        for name, path in self._entries():
            try:
                models.append(self._load(name, path, check_blobs=False))
            except (OllamatrioError, OSError, ValueError) as exc:
                log.warning("skipping unreadable model %s: %s", name.display_shortest, exc)
        models.sort(key=lambda m: (-int(m.modified_at.timestamp()), m.short_name))
        return models

    def read_blob_text(self, digest: str) -> str:
        return self.blob_path(digest).read_bytes().decode("utf-8", errors="replace")

    def read_blob_json(self, digest: str) -> Any:
        try:
            return json.loads(self.blob_path(digest).read_bytes())
        except ValueError as exc:
            raise StoreError(f"blob {digest} is not valid JSON: {exc}") from None

    def _load(self, name: ModelName, path: Path, *, check_blobs: bool) -> Model:
        try:
            st = path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._loaded.get(path)
            if cached is not None and cached[0] == stamp and cached[2].name == name:
                _, checked, model = cached
                if check_blobs and not checked:
                    for blob in (
                        model.model_path,
                        *model.adapters,
                        *model.projectors,
                        *model.drafts,
                    ):
                        if blob is not None:
                            blob.stat()  # FileNotFoundError -> model incomplete
                    self._loaded[path] = (stamp, True, model)
                return model
            manifest, digest, mtime = self._read_manifest(path)
            model = self._model_from(name, manifest, digest, mtime, check_blobs)
            self._loaded[path] = (stamp, check_blobs, model)
            return model
        except FileNotFoundError as exc:
            if exc.filename == str(path):  # deleted meanwhile
                raise not_found(name.display_shortest) from None
            missing = Path(exc.filename or "").name
            raise ModelNotFoundError(
                f'model "{name.display_shortest}" is incomplete ({missing} is missing), '
                "try pulling it again"
            ) from None
        except OSError as exc:  # no permission, an I/O error: say which model, not where
            action = f'read model "{name.display_shortest}"'
            log.error("%s: %s", action, exc)
            raise StorageError(f"{action}: {os_reason(exc)}") from None

    def _model_from(
        self, name: ModelName, manifest: Manifest, digest: str, mtime: float, check_blobs: bool
    ) -> Model:
        config: Mapping[str, Any] = {}
        if manifest.config is not None:
            raw = self.read_blob_json(manifest.config.digest)
            config = raw if isinstance(raw, Mapping) else {}
        model_path: Path | None = None
        parent = ""
        template = system = None
        params: dict[str, Any] = {}
        licenses: list[str] = []
        messages: tuple[Mapping[str, Any], ...] = ()
        adapters: list[Path] = []
        projectors: list[Path] = []
        drafts: list[Path] = []
        for layer in manifest.layers:
            blob = self.blob_path(layer.digest)
            kind = layer.media_type
            if kind in (MEDIA_MODEL, MEDIA_ADAPTER, MEDIA_PROJECTOR, MEDIA_DRAFT) and check_blobs:
                blob.stat()  # FileNotFoundError -> model incomplete
            if kind == MEDIA_MODEL:
                model_path, parent = blob, layer.from_
            elif kind == MEDIA_ADAPTER:
                adapters.append(blob)
            elif kind == MEDIA_PROJECTOR:
                projectors.append(blob)
            elif kind == MEDIA_DRAFT:
                drafts.append(blob)
            elif kind in (MEDIA_TEMPLATE, MEDIA_PROMPT):
                template = self.read_blob_text(layer.digest)
            elif kind == MEDIA_SYSTEM:
                system = self.read_blob_text(layer.digest)
            elif kind == MEDIA_PARAMS:
                raw = self.read_blob_json(layer.digest)
                params = dict(raw) if isinstance(raw, Mapping) else {}
            elif kind == MEDIA_MESSAGES:
                raw = self.read_blob_json(layer.digest)
                messages = (
                    tuple(m for m in raw if isinstance(m, Mapping)) if isinstance(raw, list) else ()
                )
            elif kind == MEDIA_LICENSE:
                licenses.append(self.read_blob_text(layer.digest))
        families = config.get("model_families")
        details = ModelDetails(
            parent_model=parent,
            format=_str(config.get("model_format")),
            family=_str(config.get("model_family")),
            families=tuple(str(f) for f in families) if isinstance(families, list) else None,
            parameter_size=_str(config.get("model_type")),
            quantization_level=_str(config.get("file_type")),
        )
        return Model(
            name=name,
            digest=digest,
            manifest=manifest,
            config=config,
            model_path=model_path,
            template=template,
            system=system,
            params=params,
            license=tuple(licenses),
            messages=messages,
            adapters=tuple(adapters),
            projectors=tuple(projectors),
            drafts=tuple(drafts),
            size=manifest.size,
            modified_at=datetime.fromtimestamp(mtime).astimezone(),
            details=details,
        )

    # -- changing the store ----------------------------------------------------------------

    def copy(self, source: str | ModelName, destination: str | ModelName) -> ModelName:
        """Give the manifest of ``source`` a second name (the bytes are copied unchanged)."""
        try:
            src = parse_name(source)
        except InvalidRequestError:
            raise InvalidRequestError(f'source "{source}" is invalid') from None
        try:
            dst = parse_name(destination)
        except InvalidRequestError:
            raise InvalidRequestError(f'destination "{destination}" is invalid') from None
        with self._lock:
            found = self._find(src)
            if found is None:
                raise ModelNotFoundError(
                    f'model "{source if isinstance(source, str) else src.display_shortest}" '
                    "not found"
                )
            stored, src_path = found
            with on_disk(f'read model "{stored.display_shortest}"'):
                data = self._confined(src_path).read_bytes()
            target = self._name_for_write(dst)
            if self.manifests_dir.joinpath(*target.parts) == src_path:
                return target
            self.write_manifest(target, data)
        return target

    def delete(self, name: str | ModelName) -> None:
        """Remove a model and every blob no other manifest references."""
        model_name = parse_name(name)
        with self._lock:
            found = self._find(model_name)
            if found is None:
                shown = name if isinstance(name, str) else model_name.display_shortest
                raise ModelNotFoundError(f"model '{shown}' not found")
            stored, path = found
            digests = self._digests_of(path)
            with on_disk(f'delete model "{stored.display_shortest}"'):
                self._confined(path).unlink()
            self.generation += 1
            self._loaded.pop(path, None)
            self._prune_dirs(self.manifests_dir)
            self.remove_unreferenced(digests)

    def _referenced(self) -> set[str] | None:
        """Digests any manifest names; None if some manifest cannot be read (be careful)."""
        referenced: set[str] = set()
        for name, path in self._entries():
            try:
                referenced |= self._read_manifest(path)[0].digests()
            except (StoreError, OSError) as exc:
                log.warning("manifest %s unreadable, keeping all blobs: %s", name, exc)
                return None
        return referenced

    def remove_unreferenced(
        self, candidates: Iterable[str], *, hold_back: bool = True
    ) -> tuple[int, int]:
        """Delete those of ``candidates`` that no manifest references and no operation has
        pinned; returns (blobs removed, bytes removed).  With ``hold_back`` a pinned one
        goes when its last pin does, unless a manifest names it by then (:meth:`PinSet.
        release` looks at it again): the blobs of a deleted or replaced manifest."""
        with self._lock:
            candidates = set(candidates)
            if not candidates:
                return 0, 0
            referenced = self._referenced()
            if referenced is None:
                return 0, 0
            unused = candidates - referenced
            self._held_back -= candidates - unused
            pinned = unused & self._pins.keys()
            if hold_back:
                self._held_back |= pinned
            removed = removed_bytes = 0
            for digest in unused - pinned:
                self._held_back.discard(digest)
                # The link itself, never its target: unlinking is safe even for a bad link.
                path = self.blobs_dir / blob_filename(digest)
                try:
                    size = path.lstat().st_size
                    path.unlink()
                except FileNotFoundError:
                    continue
                except OSError as exc:  # a read-only store still serves what it holds
                    log.warning("could not remove unused blob %s: %s", path.name, exc)
                    continue
                removed += 1
                removed_bytes += size
            return removed, removed_bytes

    def prune(self) -> PruneResult:
        """Remove blobs no manifest references and stray temporary files (unless noprune)."""
        if self.noprune:
            return PruneResult()
        with self._lock:
            temps = 0
            candidates: list[str] = []
            for entry in os.scandir(self.blobs_dir):
                try:
                    candidates.append(parse_digest(entry.name))
                except InvalidRequestError:
                    # Partial downloads and temporary files: Ollama removes these too.
                    if Path(entry.path) in self._temps or entry.is_dir(follow_symlinks=False):
                        continue
                    temps += _remove_temp(entry.path)
            temps += self._remove_manifest_temps()
            # The sweep leaves pinned blobs to their operations: a pull keeps what it
            # downloaded for the next try even if it fails.
            removed, removed_bytes = self.remove_unreferenced(candidates, hold_back=False)
            self._prune_dirs(self.manifests_dir)
        if removed or temps:
            log.info(
                "pruned %d unused blobs (%d bytes), %d temporary files",
                removed,
                removed_bytes,
                temps,
            )
        return PruneResult(removed, removed_bytes, temps)

    def _remove_manifest_temps(self) -> int:
        removed = 0
        for dirpath, _dirs, files in os.walk(self.manifests_dir):
            for filename in files:
                if filename.startswith(_TEMP_PREFIX):
                    removed += _remove_temp(os.path.join(dirpath, filename))
        return removed

    def _prune_dirs(self, top: Path) -> None:
        """Remove empty directories below ``top`` (never ``top`` itself, never via links)."""
        for dirpath, dirnames, _files in os.walk(top, topdown=False):
            for dirname in dirnames:
                with contextlib.suppress(OSError):  # not empty, or a link: keep it
                    path = os.path.join(dirpath, dirname)
                    if not os.path.islink(path):
                        os.rmdir(path)


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""
