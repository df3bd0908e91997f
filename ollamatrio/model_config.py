"""Per-model server configuration: a TOML file named by ``OLLAMATRIO_CONFIG``.

::

    [models."llama3.2:3b"]
    num_parallel = 2          # slots
    num_ctx = 8192            # default context (a request's num_ctx still wins)
    keep_alive = "1h"         # default keep_alive (a request's still wins)
    preload = true            # loaded at start-up, in the background
    gpus = [0]                # GPU indices or ids ("GPU-…"); [] or "cpu": CPU only
    prompt_cache = 512        # host-RAM prompt cache in MiB (0: off; OLLAMATRIO_PROMPT_CACHE)
    draft_num_predict = 6     # tokens a draft model drafts per step (a request's still wins)
    kv_cache_type = "q8_0"    # both KV cache sides (OLLAMA_KV_CACHE_TYPE) ...
    kv_cache_type_v = "f16"   # ... or one side: kv_cache_type_k, kv_cache_type_v
    speculative = "ngram"     # default speculative decoding: auto, off, ngram, draft

    [models.nomic-embed-text]
    pinned = true             # never evicted, never expires

Names are normalised as the store does (``llama3.2`` is ``llama3.2:latest``, case does not
matter).  The file is read once at start-up; anything wrong in it (a syntax error, an
unknown table or key, a value of the wrong type, a bad duration) is one
:class:`ConfigError` naming the file and the key.  docs/scheduling.md, "Per-model
configuration", has the precedence rules.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import speculative
from .config import parse_keep_alive
from .devices import GpuInfo
from .errors import InvalidRequestError, OllamatrioError
from .kv_cache import kv_type_name
from .store.names import InvalidModelNameError, ModelName

CPU_ONLY = "cpu"

_INT = re.compile(r"[+-]?[0-9]+")


class ConfigError(OllamatrioError):
    """The config file cannot be used: one line naming the file and the offending key."""


@dataclass(frozen=True)
class ModelSettings:
    """One model's settings; ``None`` means "not set here" (the server-wide default)."""

    num_parallel: int | None = None
    num_ctx: int | None = None
    keep_alive: float | None = None  # seconds; math.inf = forever
    pinned: bool = False
    preload: bool = False
    # Allowed GPUs: an int is an index, a str an id (NVML UUID, simulated id).
    # None: any GPU; (): CPU only.
    gpus: tuple[int | str, ...] | None = None
    prompt_cache: int | None = None  # MiB of host-RAM prompt cache; 0 = off
    draft_num_predict: int | None = None  # default tokens drafted per step; 0 = no drafting
    # KV cache types (ollamatrio/kv_cache.py): both sides, then each side's own.
    kv_cache_type: str | None = None
    kv_cache_type_k: str | None = None
    kv_cache_type_v: str | None = None
    speculative: str | None = None  # the model's default ``speculative`` option

    @property
    def kv_cache_types(self) -> Mapping[str, str | None]:
        """The KV cache settings by name, as :func:`~ollamatrio.kv_cache.requested_kv_types`
        reads a layer."""
        return {
            "kv_cache_type": self.kv_cache_type,
            "kv_cache_type_k": self.kv_cache_type_k,
            "kv_cache_type_v": self.kv_cache_type_v,
        }

    def allows(self, gpu: GpuInfo) -> bool:
        if self.gpus is None:
            return True
        return any(
            g == gpu.index if isinstance(g, int) else g.lower() == gpu.id.lower() for g in self.gpus
        )


DEFAULT = ModelSettings()

# A bound on remembered lookups: request names come from the store, but stay safe.
_CACHE_LIMIT = 4096


def model_key(name: str) -> tuple[str, str, str, str]:
    """The store's identity of a model name (``llama3.2`` = ``llama3.2:latest``, any case).

    Raises:
        InvalidModelNameError: not a valid model name.
    """
    return ModelName.parse(name).folded()


@dataclass(frozen=True)
class ModelConfig:
    """The parsed file: settings by model name as written there, in file order."""

    path: Path | None = None
    models: Mapping[str, ModelSettings] = field(default_factory=dict)
    _by_key: dict[tuple[str, str, str, str], ModelSettings] = field(
        init=False, repr=False, compare=False
    )
    _seen: dict[str, ModelSettings] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        by_key = {model_key(name): settings for name, settings in self.models.items()}
        object.__setattr__(self, "_by_key", by_key)

    def lookup(self, name: str) -> ModelSettings:
        """The settings for a model name (the defaults when it is not configured).  Called on
        every request, so names seen once are remembered."""
        found = self._seen.get(name)
        if found is not None:
            return found
        try:
            found = self._by_key.get(model_key(name), DEFAULT)
        except InvalidModelNameError:
            found = DEFAULT
        if len(self._seen) >= _CACHE_LIMIT:
            self._seen.clear()
        self._seen[name] = found
        return found

    @property
    def preloads(self) -> list[str]:
        """Models to load at start-up, in file order."""
        return [name for name, settings in self.models.items() if settings.preload]


# -- reading the file ------------------------------------------------------------------


def load_model_config(path: Path | None) -> ModelConfig:
    """Read and check the config file; no path means no per-model settings.

    Raises:
        ConfigError: unreadable, not TOML, or anything in it is wrong.
    """
    if path is None:
        return ModelConfig()
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"{path}: cannot read: {reason[:1].lower()}{reason[1:]}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_model_config(text, path)


def parse_model_config(text: str, path: Path) -> ModelConfig:
    """Parse the TOML text of the file at ``path`` (named in every error)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    for table_key in data:
        if table_key != "models":
            raise ConfigError(
                f"{path}: {_quote(table_key)}: unknown table (expected [models.NAME])"
            )
    tables = data.get("models", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{path}: models: must be a table of [models.NAME] tables")
    models: dict[str, ModelSettings] = {}
    first_by_key: dict[tuple[str, str, str, str], str] = {}
    for name, table in tables.items():
        where = f"models.{_quote(name)}"
        try:
            key = model_key(name)
        except InvalidModelNameError:
            raise ConfigError(f"{path}: {where}: invalid model name") from None
        if key in first_by_key:
            raise ConfigError(
                f"{path}: {where}: the same model as models.{_quote(first_by_key[key])}"
            )
        first_by_key[key] = name
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {where}: must be a table")
        try:
            models[name] = _model_settings(table)
        except _Invalid as exc:
            raise ConfigError(f"{path}: {where}.{exc.key}: {exc.problem}") from None
    return ModelConfig(path=path, models=models)


class _Invalid(Exception):
    def __init__(self, key: str, problem: str) -> None:
        super().__init__(key, problem)
        self.key = key
        self.problem = problem


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _quote(key: str) -> str:
    """A key as TOML would write it: bare when it can be, else quoted."""
    return key if _BARE_KEY.fullmatch(key) else '"' + key.replace('"', '\\"') + '"'


def _model_settings(table: Mapping[str, Any]) -> ModelSettings:
    parsers = {
        "num_parallel": _positive_int,
        "num_ctx": _positive_int,
        "keep_alive": _keep_alive,
        "pinned": _bool,
        "preload": _bool,
        "gpus": _gpus,
        "prompt_cache": _mib,
        "draft_num_predict": _count,
        "kv_cache_type": _kv_type,
        "kv_cache_type_k": _kv_type,
        "kv_cache_type_v": _kv_type,
        "speculative": _speculative,
    }
    values: dict[str, Any] = {}
    for key, value in table.items():
        parse = parsers.get(key)
        if parse is None:
            raise _Invalid(_quote(key), f"unknown key (expected one of {', '.join(parsers)})")
        try:
            values[key] = parse(value)
        except ValueError as exc:
            raise _Invalid(key, str(exc)) from None
    if values.get("pinned") and "keep_alive" in values:
        raise _Invalid("keep_alive", "a pinned model never expires; remove keep_alive or pinned")
    return ModelSettings(**values)


def _type_name(value: object) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)  # fmt: skip


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be an integer, not {_type_name(value)}")
    if value < 1:
        raise ValueError(f"must be at least 1, not {value}")
    return value


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be an integer, not {_type_name(value)}")
    if value < 0:
        raise ValueError(f"must be 0 or more, not {value}")
    return value


def _mib(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number of MiB, not {_type_name(value)}")
    if value < 0:
        raise ValueError(f"must be 0 (off) or more MiB, not {value}")
    return value


def _kv_type(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a KV cache type name, not {_type_name(value)}")
    return kv_type_name(value)


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, not {_type_name(value)}")
    return value


def _speculative(value: object) -> str:
    try:
        return speculative.parse_mode(value)
    except speculative.SpeculativeError:
        modes = ", ".join(f'"{m}"' for m in speculative.MODES)
        raise ValueError(f"must be one of {modes}, not {value!r}") from None


def _keep_alive(value: object) -> float:
    """The API's keep_alive rules (a number is seconds, a string a Go duration, negative is
    forever), and, as ``OLLAMA_KEEP_ALIVE``, a string of whole seconds such as ``"-1"``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be a duration string or a number of seconds, not "
                         f"{_type_name(value)}")  # fmt: skip
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        value = int(value.strip())
    try:  # a bad duration gets Go's own message
        seconds = parse_keep_alive(value)
    except InvalidRequestError as exc:
        raise ValueError(str(exc)) from None
    assert seconds is not None
    return seconds


def _gpus(value: object) -> tuple[int | str, ...]:
    if isinstance(value, str) and value.strip().lower() == CPU_ONLY:
        return ()
    if not isinstance(value, list):
        raise ValueError(f'must be an array of GPU indices or ids, or "cpu", not '
                         f"{_type_name(value)}")  # fmt: skip
    return tuple(_gpu(item) for item in value)


def _gpu(item: object) -> int | str:
    if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
        return item
    if isinstance(item, str) and item.strip():
        return item.strip()
    shown = repr(item) if isinstance(item, int | str) else _type_name(item)
    raise ValueError(f"{shown} is neither a GPU index (0, 1, …) nor a GPU id")
