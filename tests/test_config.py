"""Settings, duration and keep_alive parsing, mirroring Ollama's envconfig tests.

Every test builds Settings from an explicit mapping, never from the real environment.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from ollamatrio.config import (
    DEFAULT_ORIGINS,
    Settings,
    clean,
    parse_duration,
    parse_keep_alive,
    split_host_port,
)
from ollamatrio.errors import InvalidRequestError
from ollamatrio.log import TRACE, bound_request_id, configure_logging, level_for

INF = math.inf


def settings(**env: str) -> Settings:
    return Settings.from_env({"HOME": "/home/tester", **env})


def test_defaults() -> None:
    s = Settings.from_env({"HOME": "/home/tester"})
    assert s == Settings(models_dir=Path("/home/tester/.ollama/models"))
    assert (s.host, s.port, s.scheme, s.base_path) == ("127.0.0.1", 11434, "http", "")
    assert s.keep_alive == 300.0
    assert s.load_timeout == 300.0
    assert (s.max_loaded_models, s.num_parallel, s.max_queue) == (0, 1, 512)
    assert (s.context_length, s.gpu_overhead, s.debug) == (0, 0, 0)
    assert s.flash_attention is None
    assert s.kv_cache_type == "f16"
    assert (s.sched_spread, s.noprune) == (False, False)
    assert (s.engine, s.simulated_gpus) == ("process", "")
    assert s.origins == DEFAULT_ORIGINS


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings().port = 1  # type: ignore[misc]


def test_none_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_MAX_QUEUE", "7")
    assert Settings.from_env().max_queue == 7


# --- OLLAMA_HOST: Ollama's TestHost table, plus the client and bind forms ------------

HOST_CASES = {
    "empty": ("", "http://127.0.0.1:11434"),
    "only address": ("1.2.3.4", "http://1.2.3.4:11434"),
    "only port": (":1234", "http://:1234"),
    "address and port": ("1.2.3.4:1234", "http://1.2.3.4:1234"),
    "hostname": ("example.com", "http://example.com:11434"),
    "hostname and port": ("example.com:1234", "http://example.com:1234"),
    "zero port": (":0", "http://:0"),
    "too large port": (":66000", "http://:11434"),
    "too small port": (":-1", "http://:11434"),
    "ipv6 localhost": ("[::1]", "http://[::1]:11434"),
    "ipv6 world open": ("[::]", "http://[::]:11434"),
    "ipv6 no brackets": ("::1", "http://[::1]:11434"),
    "ipv6 + port": ("[::1]:1337", "http://[::1]:1337"),
    "ipv6 long form": ("0:0:0:0:0:0:0:1", "http://[::1]:11434"),
    "ipv4-mapped ipv6": ("::ffff:1.2.3.4", "http://1.2.3.4:11434"),
    "extra space": (" 1.2.3.4 ", "http://1.2.3.4:11434"),
    "extra quotes": ('"1.2.3.4"', "http://1.2.3.4:11434"),
    "extra space+quotes": (' " 1.2.3.4 " ', "http://1.2.3.4:11434"),
    "extra single quotes": ("'1.2.3.4'", "http://1.2.3.4:11434"),
    "http": ("http://1.2.3.4", "http://1.2.3.4:80"),
    "http port": ("http://1.2.3.4:4321", "http://1.2.3.4:4321"),
    "https": ("https://1.2.3.4", "https://1.2.3.4:443"),
    "https port": ("https://1.2.3.4:4321", "https://1.2.3.4:4321"),
    "proxy path": ("https://example.com/ollama", "https://example.com:443/ollama"),
    "trailing slash": ("http://1.2.3.4:5678/", "http://1.2.3.4:5678"),
    "http path": ("http://1.2.3.4:5678/path", "http://1.2.3.4:5678/path"),
    "ollama.com": ("ollama.com", "https://ollama.com:443"),
    "empty port": ("1.2.3.4:", "http://1.2.3.4:11434"),
    "non-numeric port": ("1.2.3.4:http", "http://1.2.3.4:11434"),
    "all interfaces": ("0.0.0.0", "http://0.0.0.0:11434"),
}


@pytest.mark.parametrize(("value", "expect"), HOST_CASES.values(), ids=HOST_CASES.keys())
def test_host(value: str, expect: str) -> None:
    assert settings(OLLAMA_HOST=value).url == expect


@pytest.mark.parametrize(
    ("value", "host", "port", "base_url", "bind"),
    [
        ("", "127.0.0.1", 11434, "http://127.0.0.1:11434", "127.0.0.1:11434"),
        (":8080", "", 8080, "http://127.0.0.1:8080", "0.0.0.0:8080"),
        ("0.0.0.0", "0.0.0.0", 11434, "http://0.0.0.0:11434", "0.0.0.0:11434"),
        ("[::1]:11434", "::1", 11434, "http://[::1]:11434", "[::1]:11434"),
        ("http://1.2.3.4:5678/path", "1.2.3.4", 5678, "http://1.2.3.4:5678/path", "1.2.3.4:5678"),
        ("https://example.com", "example.com", 443, "https://example.com:443", "example.com:443"),
    ],
    ids=["default", "port only", "all interfaces", "ipv6", "http path", "https"],
)
def test_host_fields(value: str, host: str, port: int, base_url: str, bind: str) -> None:
    s = settings(OLLAMA_HOST=value)
    assert (s.host, s.port, s.base_url, s.bind) == (host, port, base_url, bind)


@pytest.mark.parametrize(
    ("hostport", "expect"),
    [
        ("1.2.3.4:80", ("1.2.3.4", "80")),
        (":80", ("", "80")),
        ("[::1]:80", ("::1", "80")),
        ("host:", ("host", "")),
        ("host", None),
        ("::1", None),
        ("[::1]", None),
        ("[::1]x:80", None),
        ("[::1", None),
        ("a]b:80", None),
    ],
    ids=[
        "v4",
        "empty host",
        "v6",
        "empty port",
        "no port",
        "bare v6",
        "bracketed v6",
        "junk after bracket",
        "missing bracket",
        "stray bracket",
    ],
)
def test_split_host_port(hostport: str, expect: tuple[str, str] | None) -> None:
    if expect is None:
        with pytest.raises(ValueError, match="address"):
            split_host_port(hostport)
    else:
        assert split_host_port(hostport) == expect


# --- value cleaning, booleans, unsigned integers -------------------------------------

VAR_CASES = {
    "value": "value",
    " value ": "value",
    " 'value' ": "value",
    ' "value" ': "value",
    " ' value ' ": " value ",
    ' " value " ': " value ",
}


@pytest.mark.parametrize(("raw", "expect"), VAR_CASES.items(), ids=VAR_CASES.keys())
def test_clean(raw: str, expect: str) -> None:
    assert clean(raw) == expect


BOOL_CASES = {
    "": False,
    "true": True,
    "false": False,
    "1": True,
    "0": False,
    "T": True,
    "F": False,
    "TRUE": True,
    "False": False,
    " 'true' ": True,
    # unparsable means "on", as in Ollama
    "random": True,
    "something": True,
    "no": True,
}

BOOL_FIELDS = {"OLLAMA_SCHED_SPREAD": "sched_spread", "OLLAMA_NOPRUNE": "noprune"}


@pytest.mark.parametrize("key", BOOL_FIELDS.keys())
@pytest.mark.parametrize(("value", "expect"), BOOL_CASES.items(), ids=BOOL_CASES.keys())
def test_bool(key: str, value: str, expect: bool) -> None:
    assert getattr(settings(**{key: value}), BOOL_FIELDS[key]) is expect


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("", None),
        ("  ", None),
        ("1", True),
        ("true", True),
        ("0", False),
        ("false", False),
        ("bogus", True),
    ],
    ids=["unset", "blank", "1", "true", "0", "false", "unparsable"],
)
def test_flash_attention(value: str, expect: bool | None) -> None:
    assert settings(OLLAMA_FLASH_ATTENTION=value).flash_attention is expect


UINT_CASES: dict[str, int | None] = {
    "0": 0,
    "1": 1,
    "1337": 1337,
    "'42'": 42,
    "007": 7,
    "18446744073709551615": 18446744073709551615,
    # invalid: the default
    "": None,
    "-1": None,
    "+1": None,
    "0o10": None,
    "0x10": None,
    "1_000": None,
    "1.5": None,
    "string": None,
    "18446744073709551616": None,
    "٣": None,  # a non-ASCII digit
}

UINT_FIELDS = {
    "OLLAMA_MAX_LOADED_MODELS": "max_loaded_models",
    "OLLAMA_MAX_QUEUE": "max_queue",
    "OLLAMA_CONTEXT_LENGTH": "context_length",
    "OLLAMA_GPU_OVERHEAD": "gpu_overhead",
}


@pytest.mark.parametrize("key", UINT_FIELDS.keys())
@pytest.mark.parametrize(("value", "expect"), UINT_CASES.items(), ids=UINT_CASES.keys())
def test_uint(key: str, value: str, expect: int | None) -> None:
    field = UINT_FIELDS[key]
    default = getattr(Settings(), field)
    assert getattr(settings(**{key: value}), field) == (default if expect is None else expect)


@pytest.mark.parametrize(
    ("value", "expect"),
    [("", 1), ("0", 1), ("1", 1), ("4", 4), ("-2", 1), ("x", 1)],
    ids=["unset", "zero", "one", "four", "negative", "invalid"],
)
def test_num_parallel(value: str, expect: int) -> None:
    assert settings(OLLAMA_NUM_PARALLEL=value).num_parallel == expect


# --- durations ------------------------------------------------------------------------

KEEP_ALIVE_CASES = {
    "": 300.0,
    "1s": 1.0,
    "1m": 60.0,
    "1h": 3600.0,
    "5m0s": 300.0,
    "1h2m3s": 3723.0,
    "0": 0.0,
    "60": 60.0,
    "120": 120.0,
    "3600": 3600.0,
    "-0": 0.0,
    "-1": INF,
    "-1m": INF,
    "1.5m": 90.0,
    "'10m'": 600.0,
    # invalid values
    " ": 300.0,
    "???": 300.0,
    "1d": 300.0,
    "1y": 300.0,
    "1w": 300.0,
    "1.5": 300.0,
}


@pytest.mark.parametrize(
    ("value", "expect"), KEEP_ALIVE_CASES.items(), ids=[repr(k) for k in KEEP_ALIVE_CASES]
)
def test_keep_alive(value: str, expect: float) -> None:
    assert settings(OLLAMA_KEEP_ALIVE=value).keep_alive == expect


LOAD_TIMEOUT_CASES = {
    "": 300.0,
    "1s": 1.0,
    "1m": 60.0,
    "1h": 3600.0,
    "5m0s": 300.0,
    "1h2m3s": 3723.0,
    "0": INF,
    "60": 60.0,
    "120": 120.0,
    "3600": 3600.0,
    "-0": INF,
    "-1": INF,
    "-1m": INF,
    # invalid values
    " ": 300.0,
    "???": 300.0,
    "1d": 300.0,
    "1y": 300.0,
    "1w": 300.0,
}


@pytest.mark.parametrize(
    ("value", "expect"), LOAD_TIMEOUT_CASES.items(), ids=[repr(k) for k in LOAD_TIMEOUT_CASES]
)
def test_load_timeout(value: str, expect: float) -> None:
    assert settings(OLLAMA_LOAD_TIMEOUT=value).load_timeout == expect


@pytest.mark.parametrize(
    ("value", "expect"), LOAD_TIMEOUT_CASES.items(), ids=[repr(k) for k in LOAD_TIMEOUT_CASES]
)
def test_stall_timeout_reads_like_the_load_timeout(value: str, expect: float) -> None:
    assert settings(OLLAMATRIO_STALL_TIMEOUT=value).stall_timeout == expect


@pytest.mark.parametrize(
    ("value", "expect"), [("", 30.0), ("5s", 5.0), ("2", 2.0), ("1m", 60.0), ("0", INF),
                          ("-1", INF), ("bogus", 30.0)],
)  # fmt: skip
def test_body_timeout(value: str, expect: float) -> None:
    assert settings(OLLAMATRIO_BODY_TIMEOUT=value).body_timeout == expect


DURATION_CASES = {
    "0": 0.0,
    "-0": 0.0,
    "+0": 0.0,
    "5s": 5.0,
    "30s": 30.0,
    "1478s": 1478.0,
    "-5s": -5.0,
    "+5s": 5.0,
    "-0s": 0.0,
    "5.0s": 5.0,
    "5.6s": 5.6,
    "5.s": 5.0,
    ".5s": 0.5,
    "1.004s": 1.004,
    "100.00100s": 100.001,
    "10ns": 10e-9,
    "11us": 11e-6,
    "12µs": 12e-6,
    "12μs": 12e-6,
    "13ms": 13e-3,
    "300ms": 0.3,
    "14s": 14.0,
    "15m": 900.0,
    "16h": 57600.0,
    "3h30m": 12600.0,
    "10.5s4m": 250.5,
    "-2m3.4s": -123.4,
    "1h2m3s4ms5us6ns": 3723.004005006,
    "1h2m3.5s": 3723.5,
    "39h9m14.425s": 140_954.425,
    "52763797000ns": 52.763797,
    "0.3333333333333333333h": 1200.0,
    "9007199254740993ns": 9007199.254740993,
    "9223372036854775807ns": 9223372036.854775807,
    "9223372036854775.807us": 9223372036.854775807,
    "9223372036s854ms775us807ns": 9223372036.854775807,
    "-9223372036854775808ns": -9223372036.854775808,
    "0.100000000000000000000h": 360.0,
    "0.830103483285477580700h": 2988.372539827,
}


@pytest.mark.parametrize(
    ("text", "expect"), DURATION_CASES.items(), ids=[repr(k) for k in DURATION_CASES]
)
def test_parse_duration(text: str, expect: float) -> None:
    assert parse_duration(text) == pytest.approx(expect, rel=1e-12, abs=1e-15)


DURATION_ERRORS = {
    "": "invalid duration",
    "3": "missing unit",
    "300": "missing unit",
    "-": "invalid duration",
    "s": "invalid duration",
    ".": "invalid duration",
    "-.": "invalid duration",
    ".s": "invalid duration",
    "+.s": "invalid duration",
    "1d": 'unknown unit "d"',
    "1w": 'unknown unit "w"',
    "5 m": 'unknown unit " m"',
    " 5m": "invalid duration",
    "1.0.0s": "missing unit",
    "3000000h": "invalid duration",
    "9223372036854775808ns": "invalid duration",
    "9223372036854775.808us": "invalid duration",
    "9223372036854ms775us808ns": "invalid duration",
    "-9223372036854775809ns": "invalid duration",
}


@pytest.mark.parametrize(
    ("text", "message"), DURATION_ERRORS.items(), ids=[repr(k) for k in DURATION_ERRORS]
)
def test_parse_duration_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


# --- keep_alive in API requests -------------------------------------------------------

KEEP_ALIVE_JSON = {
    "null": (None, None),
    "int": (300, 300.0),
    "zero": (0, 0.0),
    "float zero": (0.0, 0.0),
    "fraction": (42.5, 42.5),
    "negative int": (-1, INF),
    "negative fraction": (-0.5, INF),
    "huge": (1e300, INF),
    "beyond float": (10**400, INF),
    "string minutes": ("5m", 300.0),
    "string compound": ("1h2m3s", 3723.0),
    "string zero": ("0", 0.0),
    "string negative": ("-1m", INF),
    "string ms": ("1500ms", 1.5),
}


@pytest.mark.parametrize(("value", "expect"), KEEP_ALIVE_JSON.values(), ids=KEEP_ALIVE_JSON.keys())
def test_parse_keep_alive(value: object, expect: float | None) -> None:
    assert parse_keep_alive(value) == expect


KEEP_ALIVE_JSON_ERRORS = {
    "bare number string": ("300", 'time: missing unit in duration "300"'),
    "day unit": ("1d", 'unknown unit "d"'),
    "padded string": (" 5m", "invalid duration"),
    "empty string": ("", "invalid duration"),
    "true": (True, "Unsupported type: 'bool'"),
    "false": (False, "Unsupported type: 'bool'"),
    "list": ([1], r"Unsupported type: '\[\]interface \{\}'"),
    "object": ({"s": 1}, r"Unsupported type: 'map\[string\]interface \{\}'"),
    "nan": (math.nan, "NaN"),
}


@pytest.mark.parametrize(
    ("value", "message"), KEEP_ALIVE_JSON_ERRORS.values(), ids=KEEP_ALIVE_JSON_ERRORS.keys()
)
def test_parse_keep_alive_errors(value: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        parse_keep_alive(value)


# --- the remaining variables -----------------------------------------------------------

ORIGIN_CASES = {
    "": (),
    "http://10.0.0.1": ("http://10.0.0.1",),
    "http://172.16.0.1,https://192.168.0.1": ("http://172.16.0.1", "https://192.168.0.1"),
    "http://totally.safe,http://definitely.legit": (
        "http://totally.safe",
        "http://definitely.legit",
    ),
    "'*'": ("*",),
}


@pytest.mark.parametrize(("value", "extra"), ORIGIN_CASES.items(), ids=ORIGIN_CASES.keys())
def test_origins(value: str, extra: tuple[str, ...]) -> None:
    origins = settings(OLLAMA_ORIGINS=value).origins
    assert origins == extra + DEFAULT_ORIGINS
    assert origins[len(extra) :][:4] == (
        "http://localhost",
        "https://localhost",
        "http://localhost:*",
        "https://localhost:*",
    )
    assert origins[-5:] == (
        "app://*",
        "file://*",
        "tauri://*",
        "vscode-webview://*",
        "vscode-file://*",
    )


@pytest.mark.parametrize(
    ("env", "expect"),
    [
        ({}, Path("/home/tester/.ollama/models")),
        ({"OLLAMA_MODELS": "/data/models"}, Path("/data/models")),
        ({"OLLAMA_MODELS": " '/data/my models' "}, Path("/data/my models")),
        ({"OLLAMA_MODELS": ""}, Path("/home/tester/.ollama/models")),
        ({"HOME": "/srv/ollama"}, Path("/srv/ollama/.ollama/models")),
    ],
    ids=["default", "set", "cleaned", "empty", "other home"],
)
def test_models_dir(env: dict[str, str], expect: Path) -> None:
    assert settings(**env).models_dir == expect


@pytest.mark.parametrize(
    ("value", "expect"),
    [("", "f16"), ("q8_0", "q8_0"), ("Q4_0", "q4_0"), (" 'F16' ", "f16")],
    ids=["unset", "q8_0", "uppercase", "cleaned"],
)
def test_kv_cache_type(value: str, expect: str) -> None:
    assert settings(OLLAMA_KV_CACHE_TYPE=value).kv_cache_type == expect


DEBUG_CASES = {
    "": 0,
    "0": 0,
    "false": 0,
    "1": 1,
    "true": 1,
    "t": 1,
    "2": 2,
    "3": 3,
    "-1": -1,
    "'2'": 2,
    "yes": 0,
}


@pytest.mark.parametrize(("value", "expect"), DEBUG_CASES.items(), ids=DEBUG_CASES.keys())
def test_debug(value: str, expect: int) -> None:
    assert settings(OLLAMA_DEBUG=value).debug == expect


@pytest.mark.parametrize(
    ("debug", "level"),
    [(0, logging.INFO), (1, logging.DEBUG), (2, TRACE), (3, TRACE), (-1, logging.WARNING)],
    ids=["info", "debug", "trace", "beyond trace", "negative"],
)
def test_level_for(debug: int, level: int) -> None:
    assert level_for(debug) == level


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("", "process"),
        ("process", "process"),
        ("simulated", "simulated"),
        (" 'Simulated' ", "simulated"),
    ],
    ids=["unset", "process", "simulated", "cleaned"],
)
def test_engine(value: str, expect: str) -> None:
    assert settings(OLLAMATRIO_ENGINE=value).engine == expect


def test_unknown_engine_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"OLLAMATRIO_ENGINE must be one of .*'llamafile'"):
        settings(OLLAMATRIO_ENGINE="llamafile")


def test_simulated_gpus_kept_raw() -> None:
    raw = '[{"id": "GPU-0", "total": 8589934592}]'
    assert settings(OLLAMATRIO_SIMULATED_GPUS=f"  {raw}\n").simulated_gpus == raw


# --- logging -------------------------------------------------------------------------


@pytest.fixture
def captured_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    old_level, old_handlers = root.level, list(root.handlers)
    yield stream
    for handler in list(root.handlers):
        if handler not in old_handlers:
            root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.mark.parametrize(
    ("debug", "shown"),
    [(0, {"INFO"}), (1, {"INFO", "DEBUG"}), (2, {"INFO", "DEBUG", "TRACE"})],
    ids=["info", "debug", "trace"],
)
def test_logging_levels(captured_log: io.StringIO, debug: int, shown: set[str]) -> None:
    configure_logging(settings(OLLAMA_DEBUG=str(debug)), stream=captured_log)
    logger = logging.getLogger("ollamatrio.test")
    logger.info("i")
    logger.debug("d")
    logger.log(TRACE, "t")
    levels = {line.split()[1] for line in captured_log.getvalue().splitlines()}
    assert levels == shown


def test_log_line_format(captured_log: io.StringIO) -> None:
    configure_logging(settings(), stream=captured_log)
    logger = logging.getLogger("ollamatrio.sched")
    with bound_request_id("r42"):
        logger.info("loaded %s", "model", extra={"model": "smollm2", "note": 'two "words"\n'})
    logger.warning("plain")
    first, second = captured_log.getvalue().splitlines()
    stamp, level, rest = first.split(" ", 2)
    assert stamp.endswith("Z")
    assert stamp[10] == "T"
    assert level == "INFO"
    assert (
        rest
        == 'ollamatrio.sched: loaded model model=smollm2 note="two \\"words\\"\\n" request_id=r42'
    )
    assert second.endswith("WARNING ollamatrio.sched: plain")


def test_log_lines_leave_out_other_libraries_private_record_attributes(
    captured_log: io.StringIO,
) -> None:
    """Ray, once imported, adds ``_ray_timestamp_ns`` to every record through the log
    record factory: bookkeeping, not a field of the line."""
    configure_logging(settings(), stream=captured_log)
    original = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = original(*args, **kwargs)
        record._ray_timestamp_ns = 1  # type: ignore[attr-defined]
        return record

    logging.setLogRecordFactory(factory)
    try:
        logging.getLogger("ollamatrio.sched").info("loaded", extra={"model": "smollm2"})
    finally:
        logging.setLogRecordFactory(original)
    assert captured_log.getvalue().rstrip().endswith("ollamatrio.sched: loaded model=smollm2")


def test_configure_logging_is_idempotent(captured_log: io.StringIO) -> None:
    configure_logging(settings(), stream=io.StringIO())
    configure_logging(settings(), stream=captured_log)
    logging.getLogger("ollamatrio.x").info("once")
    assert captured_log.getvalue().count("once") == 1
    assert sum(getattr(h, "_ollamatrio", False) for h in logging.getLogger().handlers) == 1


@pytest.mark.parametrize(
    ("value", "mib"),
    [("", 4096), ("0", 0), ("512", 512), ("-1", 4096), ("lots", 4096)],
)
def test_prompt_disk_cache(value: str, mib: int) -> None:
    settings = Settings.from_env({"OLLAMATRIO_PROMPT_DISK_CACHE": value, "HOME": "/h"})
    assert settings.prompt_disk_cache_mib == mib
    assert settings.prompt_disk_cache == mib << 20
    assert settings.prompt_disk_cache_dir == Path("/h/.ollama/ollamatrio/prompt-cache")
