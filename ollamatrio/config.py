"""Server settings from the environment, with Ollama's variable names, defaults and rules.

Parsing mirrors Ollama's ``envconfig`` package: every value is trimmed of surrounding
whitespace and then of quote characters; unsigned integers that do not parse fall back
to their default; booleans that are empty keep their default and ones that do not parse
count as *true*; durations are Go duration strings or bare integer seconds.  Durations are
seconds as ``float`` here, with ``math.inf`` standing for Ollama's "forever".
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InvalidRequestError

log = logging.getLogger(__name__)

DEFAULT_PORT = 11434
DEFAULT_KEEP_ALIVE = 300.0
DEFAULT_LOAD_TIMEOUT = 300.0
DEFAULT_STALL_TIMEOUT = 300.0
DEFAULT_BODY_TIMEOUT = 30.0
ENGINES = ("process", "simulated")
AUTH_MODES = ("off", "required")  # OLLAMATRIO_AUTH

# Ollama always allows these origins, after the ones from OLLAMA_ORIGINS.
_DEFAULT_ORIGIN_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
DEFAULT_ORIGINS: tuple[str, ...] = (
    *(
        origin
        for host in _DEFAULT_ORIGIN_HOSTS
        for origin in (
            f"http://{host}",
            f"https://{host}",
            f"http://{host}:*",
            f"https://{host}:*",
        )
    ),
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
)


DEFAULT_RESPONSES_TTL = 30 * 24 * 3600.0  # seconds: as long as OpenAI keeps them
# MiB of slot states kept on disk for runners that come back (slot_cache/); a 12k-token
# prompt of an 8B model with an f16 KV cache is about 1.5 GiB of state.
DEFAULT_PROMPT_DISK_CACHE_MIB = 4096


def _default_models_dir() -> Path:
    return Path.home() / ".ollama" / "models"


@dataclass(frozen=True)
class Settings:
    """Everything the server reads from its environment, parsed once at start-up."""

    host: str = "127.0.0.1"  # "" binds every interface (OLLAMA_HOST=":8080")
    port: int = DEFAULT_PORT
    models_dir: Path = field(default_factory=_default_models_dir)
    keep_alive: float = DEFAULT_KEEP_ALIVE  # seconds; math.inf = forever
    max_loaded_models: int = 0  # 0 = auto (3 per GPU, 3 on CPU)
    num_parallel: int = 1
    max_queue: int = 512
    load_timeout: float = DEFAULT_LOAD_TIMEOUT  # seconds; math.inf = never give up
    # Seconds a running generation may go without a byte from its runner (prompt progress
    # counts) before it fails and the runner is killed; math.inf = wait forever.
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    # OLLAMATRIO_BODY_TIMEOUT: seconds a request body may go without a byte from the client
    # before it is answered 408 and the connection closed; math.inf = wait forever.
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    # OLLAMATRIO_MAX_CONNECTIONS: client connections the server holds at once; 0 = from the
    # open file limit (http/budget.py: the limit less a reserve for runners and the store).
    max_connections: int = 0
    sched_spread: bool = False
    context_length: int = 0  # 0 = auto tier from total VRAM
    flash_attention: bool | None = None  # None = auto
    kv_cache_type: str = "f16"
    gpu_overhead: int = 0  # bytes reserved per GPU
    origins: tuple[str, ...] = DEFAULT_ORIGINS
    noprune: bool = False
    # OLLAMATRIO_SPARE_RUNNER: keep one runner process started ahead of need (interpreter and
    # engine imported, waiting for its model), so a cold load skips that part.
    spare_runner: bool = True
    debug: int = 0  # 0 INFO, 1 DEBUG, 2 TRACE (negative: WARNING)
    engine: str = "process"
    simulated_gpus: str = ""  # raw JSON list for the simulated device source
    simulated_engine: str = ""  # raw JSON: behaviour of the simulated engine
    scheme: str = "http"  # from OLLAMA_HOST; matters to clients, not to the server
    base_path: str = ""  # path after host:port in OLLAMA_HOST (reverse proxies)
    # OLLAMATRIO_CONFIG: the per-model settings file (model_config.py), read by the server
    # at start-up only, so that client commands never fail on it.
    config_path: Path | None = None
    # OLLAMATRIO_DATA: the server's own state (stored /v1/responses); None = a folder
    # "ollamatrio" beside the model store, never inside its blobs or manifests.
    data_dir: Path | None = None
    # OLLAMATRIO_RESPONSES_TTL: how long a stored response is kept; math.inf = forever.
    responses_ttl: float = DEFAULT_RESPONSES_TTL
    # OLLAMATRIO_PROMPT_DISK_CACHE: MiB of prompt states saved when runners unload and
    # restored when they load again (in state_dir/prompt-cache); 0 turns it off.
    prompt_disk_cache_mib: int = DEFAULT_PROMPT_DISK_CACHE_MIB
    # OLLAMATRIO_PROMPT_CACHE: each runner's host-RAM prompt cache in MiB; 0 = off,
    # -1 (unset) = derived from the model's context and the free RAM (docs/prompt_cache.md).
    prompt_cache_mib: int = -1
    # OLLAMATRIO_CORES: the CPU cores the scheduler divides among the runners that are
    # generating (scheduler/core_share.py); 0 = the physical cores this process may use.
    cores: int = 0
    # OLLAMATRIO_AUTH: "required" asks every request but the liveness routes for an API key
    # (auth/keys.py, api/auth_gate.py); "off" serves anyone who reaches the port.
    auth: str = "off"
    # OLLAMATRIO_TLS_CERT / OLLAMATRIO_TLS_KEY: PEM files (the certificate chain, its private
    # key); both set, the one listener speaks HTTPS only (http/tls.py).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # OLLAMATRIO_FLEET_SECRET: a fleet's hosts require it on every request (the gateway
    # sends it, http/fleet_secret.py); "" = not a fleet's host.  Never in a repr.
    fleet_secret: str = field(default="", repr=False)
    # OLLAMATRIO_FAIR_SHARE: requests waiting for a model's slot are served round-robin
    # between principals (scheduler/fair_queue.py); off, first come, first served.
    fair_share: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``env`` (default: ``os.environ``)."""
        if env is None:
            env = os.environ
        scheme, host, port, base_path = parse_host(env.get("OLLAMA_HOST", ""))
        engine = _var(env, "OLLAMATRIO_ENGINE").lower() or "process"
        if engine not in ENGINES:
            raise ValueError(
                f"OLLAMATRIO_ENGINE must be one of {', '.join(ENGINES)}, "
                f"not {env['OLLAMATRIO_ENGINE']!r}"
            )
        # Like Go's os.UserHomeDir, the home directory comes from HOME when it is set.
        models = _var(env, "OLLAMA_MODELS")
        home = env.get("HOME", "")
        if models:
            models_dir = Path(models)
        elif home:
            models_dir = Path(home) / ".ollama" / "models"
        else:
            models_dir = _default_models_dir()
        config = _var(env, "OLLAMATRIO_CONFIG")
        auth = _var(env, "OLLAMATRIO_AUTH").lower() or "off"
        if auth not in AUTH_MODES:
            raise ValueError(
                f"OLLAMATRIO_AUTH must be one of {', '.join(AUTH_MODES)}, "
                f"not {env['OLLAMATRIO_AUTH']!r}"
            )
        max_connections = _var(env, "OLLAMATRIO_MAX_CONNECTIONS")
        if max_connections and not _UINT.fullmatch(max_connections):
            raise ValueError(
                "OLLAMATRIO_MAX_CONNECTIONS must be a number of client connections "
                f"(0: from the open file limit), not {env['OLLAMATRIO_MAX_CONNECTIONS']!r}"
            )
        tls_cert, tls_key = _var(env, "OLLAMATRIO_TLS_CERT"), _var(env, "OLLAMATRIO_TLS_KEY")
        if bool(tls_cert) != bool(tls_key):
            raise ValueError(
                "OLLAMATRIO_TLS_CERT and OLLAMATRIO_TLS_KEY go together: set both (PEM files, "
                "for HTTPS) or neither"
            )
        return cls(
            host=host,
            port=port,
            scheme=scheme,
            base_path=base_path,
            models_dir=models_dir,
            keep_alive=_env_duration(
                env, "OLLAMA_KEEP_ALIVE", DEFAULT_KEEP_ALIVE, zero_is_inf=False
            ),
            max_loaded_models=_env_uint(env, "OLLAMA_MAX_LOADED_MODELS", 0),
            # Ollama's scheduler treats anything below one slot as one.
            num_parallel=max(1, _env_uint(env, "OLLAMA_NUM_PARALLEL", 1)),
            max_queue=_env_uint(env, "OLLAMA_MAX_QUEUE", 512),
            load_timeout=_env_duration(
                env, "OLLAMA_LOAD_TIMEOUT", DEFAULT_LOAD_TIMEOUT, zero_is_inf=True
            ),
            stall_timeout=_env_duration(
                env, "OLLAMATRIO_STALL_TIMEOUT", DEFAULT_STALL_TIMEOUT, zero_is_inf=True
            ),
            body_timeout=_env_duration(
                env, "OLLAMATRIO_BODY_TIMEOUT", DEFAULT_BODY_TIMEOUT, zero_is_inf=True
            ),
            max_connections=int(max_connections or 0),
            sched_spread=_env_bool(env, "OLLAMA_SCHED_SPREAD", False),
            context_length=_env_uint(env, "OLLAMA_CONTEXT_LENGTH", 0),
            flash_attention=_env_optional_bool(env, "OLLAMA_FLASH_ATTENTION"),
            kv_cache_type=_var(env, "OLLAMA_KV_CACHE_TYPE").lower() or "f16",
            gpu_overhead=_env_uint(env, "OLLAMA_GPU_OVERHEAD", 0),
            origins=parse_origins(_var(env, "OLLAMA_ORIGINS")),
            noprune=_env_bool(env, "OLLAMA_NOPRUNE", False),
            spare_runner=_env_bool(env, "OLLAMATRIO_SPARE_RUNNER", True),
            debug=parse_debug(_var(env, "OLLAMA_DEBUG")),
            engine=engine,
            simulated_gpus=env.get("OLLAMATRIO_SIMULATED_GPUS", "").strip(),
            simulated_engine=env.get("OLLAMATRIO_SIMULATED_ENGINE", "").strip(),
            config_path=Path(config).expanduser() if config else None,
            data_dir=Path(data).expanduser() if (data := _var(env, "OLLAMATRIO_DATA")) else None,
            responses_ttl=_env_duration(
                env, "OLLAMATRIO_RESPONSES_TTL", DEFAULT_RESPONSES_TTL, zero_is_inf=True
            ),
            prompt_disk_cache_mib=_env_uint(
                env, "OLLAMATRIO_PROMPT_DISK_CACHE", DEFAULT_PROMPT_DISK_CACHE_MIB
            ),
            prompt_cache_mib=_env_uint(env, "OLLAMATRIO_PROMPT_CACHE", -1),
            cores=_env_uint(env, "OLLAMATRIO_CORES", 0),
            auth=auth,
            tls_cert=Path(tls_cert).expanduser() if tls_cert else None,
            tls_key=Path(tls_key).expanduser() if tls_key else None,
            fleet_secret=_var(env, "OLLAMATRIO_FLEET_SECRET"),
            fair_share=_env_bool(env, "OLLAMATRIO_FAIR_SHARE", True),
        )

    @property
    def state_dir(self) -> Path:
        """Where the server keeps its own state: OLLAMATRIO_DATA, else ``ollamatrio``
        beside the model store."""
        return self.data_dir if self.data_dir is not None else self.models_dir.parent / "ollamatrio"

    @property
    def prompt_disk_cache(self) -> int:
        """The on-disk prompt cache's bound in bytes (0: off)."""
        return self.prompt_disk_cache_mib << 20

    @property
    def prompt_disk_cache_dir(self) -> Path:
        """The on-disk prompt cache's private folder, in the server's state folder."""
        return self.state_dir / "prompt-cache"

    @property
    def url(self) -> str:
        """OLLAMA_HOST in Ollama's canonical form, e.g. ``http://127.0.0.1:11434``."""
        path = f"/{self.base_path}" if self.base_path else ""
        return f"{self.scheme}://{join_host_port(self.host, self.port)}{path}"

    @property
    def base_url(self) -> str:
        """Where a client reaches this server; an empty host means this machine."""
        path = f"/{self.base_path}" if self.base_path else ""
        host = self.host or "127.0.0.1"
        return f"{self.scheme}://{join_host_port(host, self.port)}{path}"

    @property
    def bind(self) -> str:
        """The ``host:port`` the HTTP server listens on (hypercorn's bind syntax)."""
        return join_host_port(self.host or "0.0.0.0", self.port)


# --- environment value rules (envconfig) ---------------------------------------------


def clean(value: str) -> str:
    """Ollama's ``Var``: strip whitespace, then quote characters (in that order)."""
    return value.strip().strip("\"'")


def _var(env: Mapping[str, str], key: str) -> str:
    return clean(env.get(key, ""))


_UINT = re.compile(r"[0-9]+")
_INT = re.compile(r"[+-]?[0-9]+")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``; raises ``ValueError`` on anything else."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid boolean {text!r}")


def _env_optional_bool(env: Mapping[str, str], key: str) -> bool | None:
    """None when unset or empty; a set but unparsable boolean means "on" (Ollama)."""
    text = _var(env, key)
    if not text:
        return None
    try:
        return parse_go_bool(text)
    except ValueError:
        return True


def _env_bool(env: Mapping[str, str], key: str, default: bool) -> bool:
    value = _env_optional_bool(env, key)
    return default if value is None else value


def _env_uint(env: Mapping[str, str], key: str, default: int) -> int:
    text = _var(env, key)
    if not text:
        return default
    if _UINT.fullmatch(text) and int(text) < 1 << 64:
        return int(text)
    log.warning(
        "invalid environment variable, using default",
        extra={"key": key, "value": text, "default": default},
    )
    return default


def _env_duration(env: Mapping[str, str], key: str, default: float, *, zero_is_inf: bool) -> float:
    text = _var(env, key)
    seconds = default
    if text:
        try:
            seconds = parse_duration(text)
        except ValueError:
            if _INT.fullmatch(text):
                seconds = float(int(text))
    if seconds < 0 or (zero_is_inf and seconds == 0):
        return math.inf
    return seconds


def parse_debug(text: str) -> int:
    """OLLAMA_DEBUG: a true boolean is 1, another integer is itself, anything else 0."""
    try:
        if parse_go_bool(text):
            return 1
    except ValueError:
        pass
    return int(text) if _INT.fullmatch(text) else 0


def parse_origins(text: str) -> tuple[str, ...]:
    """OLLAMA_ORIGINS entries (split on commas, kept verbatim) then the built-in ones."""
    extra = tuple(text.split(",")) if text else ()
    return extra + DEFAULT_ORIGINS


# --- OLLAMA_HOST ---------------------------------------------------------------------


def parse_host(raw: str) -> tuple[str, str, int, str]:
    """Parse OLLAMA_HOST into ``(scheme, host, port, path)`` exactly as Ollama does.

    An explicit ``http://`` or ``https://`` changes the default port to 80 or 443; a
    port that is not an integer in 0..65535 falls back to the default.
    """
    text = clean(raw).strip()
    default_port = DEFAULT_PORT
    scheme, sep, hostport = text.partition("://")
    if not sep:
        scheme, hostport = "http", text
        if text == "ollama.com":
            scheme, hostport = "https", "ollama.com:443"
    elif scheme == "http":
        default_port = 80
    elif scheme == "https":
        default_port = 443

    hostport, _, path = hostport.partition("/")
    try:
        host, port_text = split_host_port(hostport)
    except ValueError:
        host, port_text = "127.0.0.1", str(default_port)
        ip = _parse_ip(hostport.strip("[]"))
        if ip is not None:
            host = ip
        elif hostport:
            host = hostport

    port = default_port
    if _INT.fullmatch(port_text) and 0 <= int(port_text) <= 65535:
        port = int(port_text)
    else:
        log.warning("invalid port, using default", extra={"port": port_text, "default": port})
    return scheme, host, port, path


def split_host_port(hostport: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort``: ``host:port`` or ``[v6host]:port``; port may be empty."""
    i = hostport.rfind(":")
    if i < 0:
        raise ValueError(f"address {hostport}: missing port in address")
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise ValueError(f"address {hostport}: missing ']' in address")
        if end + 1 == len(hostport):
            raise ValueError(f"address {hostport}: missing port in address")
        if end + 1 != i:
            reason = "too many colons" if hostport[end + 1] == ":" else "missing port"
            raise ValueError(f"address {hostport}: {reason} in address")
        host, j, k = hostport[1:end], 1, end + 1
    else:
        host, j, k = hostport[:i], 0, 0
        if ":" in host:
            raise ValueError(f"address {hostport}: too many colons in address")
    if "[" in hostport[j:]:
        raise ValueError(f"address {hostport}: unexpected '[' in address")
    if "]" in hostport[k:]:
        raise ValueError(f"address {hostport}: unexpected ']' in address")
    return host, hostport[i + 1 :]


def _parse_ip(text: str) -> str | None:
    """Go's ``net.ParseIP(text).String()``, or None when ``text`` is no IP literal."""
    if "%" in text:  # Go's ParseIP takes no IPv6 zone
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def join_host_port(host: str, port: int) -> str:
    """Go's ``net.JoinHostPort``: IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- durations -----------------------------------------------------------------------

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_MAX_NS = 1 << 63  # time.Duration is an int64 of nanoseconds


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def _span(s: str, pred: Callable[[str], bool]) -> int:
    """Length of the prefix of ``s`` whose characters satisfy ``pred``."""
    return next((n for n, c in enumerate(s) if not pred(c)), len(s))


def parse_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration`` in integer nanoseconds, with its error messages."""
    invalid = ValueError(f'time: invalid duration "{text}"')
    s = text
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise invalid
    total = 0
    while s:  # one "<number><unit>" term per turn, e.g. "1.5h"
        if not (s[0] == "." or _is_digit(s[0])):
            raise invalid
        n = _span(s, _is_digit)
        whole_text, s = s[:n], s[n:]
        frac_text = ""
        if s.startswith("."):
            n = _span(s[1:], _is_digit)
            frac_text, s = s[1 : 1 + n], s[1 + n :]
        if not whole_text and not frac_text:
            raise invalid
        n = _span(s, lambda c: c != "." and not _is_digit(c))
        if n == 0:
            raise ValueError(f'time: missing unit in duration "{text}"')
        unit_text, s = s[:n], s[n:]
        unit = _UNITS_NS.get(unit_text)
        if unit is None:
            raise ValueError(f'time: unknown unit "{unit_text}" in duration "{text}"')
        whole = int(whole_text) if whole_text else 0
        if whole > _MAX_NS // unit:
            raise invalid
        value = whole * unit
        if frac_text:
            # Go scales the fraction with float64 and truncates to whole nanoseconds.
            frac, scale = _go_fraction(frac_text)
            value += int(frac * (unit / scale))
            if value > _MAX_NS:
                raise invalid
        total += value
        if total > _MAX_NS:
            raise invalid
    if neg:
        return -total
    if total > _MAX_NS - 1:
        raise invalid
    return total


def _go_fraction(digits: str) -> tuple[int, float]:
    """Go's ``leadingFraction``: digits past int64 precision are consumed and dropped."""
    value, scale = 0, 1.0
    overflow = False
    for c in digits:
        if overflow:
            continue
        if value > (_MAX_NS - 1) // 10:
            overflow = True
            continue
        nxt = value * 10 + int(c)
        if nxt > _MAX_NS:
            overflow = True
            continue
        value, scale = nxt, scale * 10
    return value, scale


def parse_duration(text: str) -> float:
    """Go duration syntax (``"1h2m3.5s"``, ``"300ms"``, ``"-1m"``, ``"0"``) in seconds.

    A bare number other than ``"0"`` is an error, as in Go.  Raises ``ValueError``.
    """
    return parse_duration_ns(text) / 1e9


_GO_JSON_TYPES = {
    bool: "bool",
    dict: "map[string]interface {}",
    list: "[]interface {}",
}


def parse_keep_alive(value: object) -> float | None:
    """The API's ``keep_alive`` JSON field in seconds (``math.inf`` = forever).

    ``None`` (absent or ``null``) means "not given".  A number is seconds, fractions
    allowed; a string is a Go duration (``"300"`` without a unit is rejected, as Ollama
    does); any negative value means forever.  Raises :class:`InvalidRequestError`.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        go_type = _GO_JSON_TYPES.get(type(value), type(value).__name__)
        raise InvalidRequestError(f"Unsupported type: '{go_type}'")
    if isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
    else:
        try:
            seconds = float(value)
        except OverflowError:  # a JSON integer beyond float range: forever either way
            return math.inf
        if math.isnan(seconds):
            raise InvalidRequestError("Unsupported keep_alive value: NaN")
    if seconds < 0 or seconds * 1e9 >= _MAX_NS:
        return math.inf
    return seconds
