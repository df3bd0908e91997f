"""Digests, layers and manifests in the exact JSON shapes Ollama reads and writes."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError, OllamatrioError

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"

_IMAGE = "application/vnd.ollama.image."
MEDIA_MODEL = _IMAGE + "model"
MEDIA_ADAPTER = _IMAGE + "adapter"
MEDIA_PROJECTOR = _IMAGE + "projector"
MEDIA_DRAFT = _IMAGE + "draft"  # a draft model for speculative decoding (Ollama's name)
MEDIA_TEMPLATE = _IMAGE + "template"
MEDIA_PROMPT = _IMAGE + "prompt"  # the template's media type in old manifests
MEDIA_SYSTEM = _IMAGE + "system"
MEDIA_PARAMS = _IMAGE + "params"
MEDIA_MESSAGES = _IMAGE + "messages"
MEDIA_LICENSE = _IMAGE + "license"

log = logging.getLogger("ollamatrio.store")

_DIGEST_RE = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")


class StoreError(OllamatrioError):
    """The store's content is damaged or unsafe (bad manifest JSON, a link leaving the store)."""


class StorageError(StoreError):
    """The filesystem refused a store operation (read-only, full, no permission).  Its
    message names the model or digest and the reason; the path goes to the log only."""


def os_reason(exc: OSError) -> str:
    """An OS error without its file names: ``read-only file system``."""
    return (exc.strerror or type(exc).__name__).lower()


@contextlib.contextmanager
def on_disk(action: str) -> Iterator[None]:
    """Report an OS error inside the block as :class:`StorageError` ``"<action>: <reason>"``
    (``action`` names the model or blob), logging the full error with its paths."""
    try:
        yield
    except OSError as exc:
        log.error("%s: %s", action, exc)
        raise StorageError(f"{action}: {os_reason(exc)}") from None


def parse_digest(digest: str) -> str:
    """Canonical ``sha256:<lowercase hex>`` for ``sha256:<hex>`` or ``sha256-<hex>``."""
    match = _DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
    if match is None:
        raise InvalidRequestError("invalid digest format")
    return "sha256:" + match.group(1).lower()


def blob_filename(digest: str) -> str:
    """The file name of a blob in ``blobs/`` (``sha256-<hex>``)."""
    return parse_digest(digest).replace(":", "-")


def _go_compatible(value: Any) -> Any:
    # Go's encoding/json writes an integral float64 without a fraction ("1", not "1.0").
    if isinstance(value, float) and math.isfinite(value) and abs(value) < 1e21:
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {str(k): _go_compatible(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_go_compatible(v) for v in value]
    return value


def go_json(value: Any, *, sort_keys: bool = False) -> bytes:
    """Encode like Go's ``json.NewEncoder(w).Encode``: compact, HTML-escaped, newline.

    Matching Go byte for byte makes a layer we write share its digest with the same
    layer written by Ollama, so the blobs are deduplicated between the two servers.
    """
    text = json.dumps(
        _go_compatible(value), ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys
    )
    for char, escaped in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return (text + "\n").encode()


@dataclass(frozen=True)
class Layer:
    """One entry of a manifest: a blob, its media type and size."""

    media_type: str
    digest: str  # canonical sha256:<hex>
    size: int
    from_: str = ""  # JSON "from": the model this layer was taken from
    name: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if self.from_:
            out["from"] = self.from_
        if self.name:
            out["name"] = self.name
        return out

    @classmethod
    def from_json(cls, obj: object) -> Layer:
        if not isinstance(obj, Mapping):
            raise StoreError("manifest layer is not an object")
        media_type, digest, size = obj.get("mediaType"), obj.get("digest"), obj.get("size")
        if not isinstance(media_type, str):
            raise StoreError("manifest layer has no mediaType")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise StoreError(f"manifest layer {digest!r} has a bad size")
        try:
            canonical = parse_digest(digest)  # type: ignore[arg-type]
        except InvalidRequestError:
            raise StoreError(f"manifest layer has a bad digest {digest!r}") from None
        from_, name = obj.get("from", ""), obj.get("name", "")
        return cls(
            media_type=media_type,
            digest=canonical,
            size=size,
            from_=from_ if isinstance(from_, str) else "",
            name=name if isinstance(name, str) else "",
        )


@dataclass(frozen=True)
class Manifest:
    """A Docker distribution v2 manifest as Ollama stores it."""

    config: Layer | None
    layers: tuple[Layer, ...]
    schema_version: int = 2
    media_type: str = MANIFEST_MEDIA_TYPE

    @property
    def size(self) -> int:
        """Bytes of the config and every layer (what ``/api/tags`` reports)."""
        return sum(layer.size for layer in self.all_layers())

    def all_layers(self) -> tuple[Layer, ...]:
        return (*self.layers, self.config) if self.config else self.layers

    def digests(self) -> set[str]:
        return {layer.digest for layer in self.all_layers()}

    def to_bytes(self) -> bytes:
        empty = {"mediaType": "", "digest": "", "size": 0}  # Go's zero Layer
        config = self.config.to_json() if self.config else empty
        return go_json(
            {
                "schemaVersion": self.schema_version,
                "mediaType": self.media_type,
                "config": config,
                "layers": [layer.to_json() for layer in self.layers],
            }
        )

    @classmethod
    def parse(cls, data: bytes) -> Manifest:
        """Parse and validate manifest bytes; every digest is checked before any use."""
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"manifest is not JSON: {exc}") from None
        if not isinstance(obj, Mapping):
            raise StoreError("manifest is not a JSON object")
        raw_layers = obj.get("layers") or []
        if not isinstance(raw_layers, list):
            raise StoreError("manifest layers is not a list")
        raw_config = obj.get("config")
        config = None
        # Go tolerates a zero config ({"digest": ""}); so do we.
        if isinstance(raw_config, Mapping) and raw_config.get("digest"):
            config = Layer.from_json(raw_config)
        schema = obj.get("schemaVersion", 2)
        media_type = obj.get("mediaType", MANIFEST_MEDIA_TYPE)
        return cls(
            config=config,
            layers=tuple(Layer.from_json(layer) for layer in raw_layers),
            schema_version=schema if isinstance(schema, int) else 2,
            media_type=media_type if isinstance(media_type, str) else MANIFEST_MEDIA_TYPE,
        )


def config_json(
    *,
    model_format: str,
    model_family: str,
    model_families: Sequence[str] | None,
    model_type: str,
    file_type: str,
    diff_ids: Sequence[str],
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """The config blob, fields in the order of Ollama's ``ConfigV2`` struct."""
    body: dict[str, Any] = {
        "model_format": model_format,
        "model_family": model_family,
        "model_families": list(model_families) if model_families is not None else None,
        "model_type": model_type,
        "file_type": file_type,
    }
    for key in ("renderer", "parser", "requires", "draft"):
        if extra and extra.get(key):
            body[key] = extra[key]
    body["architecture"] = "amd64"
    body["os"] = "linux"
    body["rootfs"] = {"type": "layers", "diff_ids": list(diff_ids)}
    return go_json(body)
