"""Model names: ``[host/][namespace/]model[:tag]``, parsed and validated like Ollama.

A :class:`ModelName` keeps the case it was given (manifests are stored under it) but
compares and hashes case-insensitively, because Ollama treats ``Llama3`` and ``llama3``
as the same model.  Every part is validated before it can become a path component, so
a name can never address a file outside ``manifests/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidRequestError

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# Ollama's rules (types/model/name.go): first character alphanumeric or "_", then
# alphanumerics, "_", "-", "."; the host may also hold ":" (a port); the namespace has
# no "."; the host is at most 350 characters, every other part at most 80.  ASCII only.
_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,349}")
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,79}")
_MODEL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,79}")
_TAG_RE = _MODEL_RE


class InvalidModelNameError(InvalidRequestError):
    """A model name breaks the naming rules; the message is Ollama's exact text."""

    MESSAGE = "invalid model name"

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(self.MESSAGE)
        self.name = name
        self.reason = reason


def _valid_part(pattern: re.Pattern[str], part: str) -> bool:
    # ".." is refused everywhere (stricter than the newest Ollama, as older ones were)
    # so no part can ever read as a parent-directory step.
    return pattern.fullmatch(part) is not None and ".." not in part


@dataclass(frozen=True, eq=False)
class ModelName:
    """A fully qualified model name; build it with :meth:`parse` or :meth:`from_parts`."""

    host: str
    namespace: str
    model: str
    tag: str

    def __post_init__(self) -> None:
        checks = (
            ("host", _HOST_RE, self.host),
            ("namespace", _NAMESPACE_RE, self.namespace),
            ("model", _MODEL_RE, self.model),
            ("tag", _TAG_RE, self.tag),
        )
        for kind, pattern, part in checks:
            if not _valid_part(pattern, part):
                raise InvalidModelNameError(str(self._raw()), f"bad {kind} {part!r}")

    def _raw(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @classmethod
    def parse(cls, text: str) -> ModelName:
        """Parse ``[scheme://][host/][namespace/]model[:tag]``, filling Ollama's defaults."""
        if not isinstance(text, str) or not text:
            raise InvalidModelNameError(str(text), "empty name")
        host = namespace = tag = ""
        rest = text
        # "/" never appears in a tag, so a ":" after the last "/" starts the tag (a ":"
        # before it belongs to a host port).
        if rest.rfind(":") > rest.rfind("/"):
            rest, _, tag = rest.rpartition(":")
            if not tag or not rest:
                raise InvalidModelNameError(text, "empty model or tag")
        rest, slash, model = rest.rpartition("/")
        if slash:  # namespace/model or host/namespace/model
            if not model or not rest:
                raise InvalidModelNameError(text, "empty part")
            rest, slash, namespace = rest.rpartition("/")
            if slash:
                if not namespace or not rest:
                    raise InvalidModelNameError(text, "empty part")
                scheme, sep, after = rest.partition("://")
                host = after if sep else scheme
        return cls(
            host=host or DEFAULT_HOST,
            namespace=namespace or DEFAULT_NAMESPACE,
            model=model,
            tag=tag or DEFAULT_TAG,
        )

    @classmethod
    def from_parts(cls, parts: tuple[str, ...] | list[str]) -> ModelName | None:
        """The name stored at ``manifests/<host>/<namespace>/<model>/<tag>``, or None."""
        if len(parts) != 4:
            return None
        try:
            return cls(*parts)
        except InvalidModelNameError:
            return None

    @property
    def parts(self) -> tuple[str, str, str, str]:
        """Path components of the manifest under ``manifests/``."""
        return (self.host, self.namespace, self.model, self.tag)

    @property
    def display_shortest(self) -> str:
        """``model:tag`` on the default registry and namespace, longer forms otherwise."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    def folded(self) -> tuple[str, str, str, str]:
        """The case-insensitive identity used for equality and hashing."""
        return (self.host.lower(), self.namespace.lower(), self.model.lower(), self.tag.lower())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModelName):
            return NotImplemented
        return self.folded() == other.folded()

    def __hash__(self) -> int:
        return hash(self.folded())

    def __str__(self) -> str:
        return self._raw()


def parse_name(text: str | ModelName) -> ModelName:
    """Accept a name string or an already parsed :class:`ModelName`."""
    return text if isinstance(text, ModelName) else ModelName.parse(text)
