"""What ``python -m ollamatrio serve`` imports before it answers its first ``/api/version``.

The server is ready at once because everything the first request does not need waits for
its first use: the Quart app and its dialects (the first request that needs them), GGUF
parsing and numpy (the first model inspected), the Go template interpreter (the first
prompt templated), the metrics library (the app), and nothing from asyncio at all.  This
test pins that set, so a module-level import added somewhere cannot quietly bring the
start-up cost back: it runs the real command under ``-X importtime`` (which names every
module as it is imported, unbuffered, on stderr), asks ``/api/version`` once, and kills the
server as soon as the answer is in.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Third-party top-level packages the server may hold before its first request.
ALLOWED_THIRD_PARTY = frozenset({
    "trio", "outcome", "sniffio", "sortedcontainers", "idna", "attr", "attrs",
    "h11", "h2", "hpack", "hyperframe", "priority", "wsproto", "hypercorn", "typing_extensions",
    "psutil", "pynvml", "orjson", "exceptiongroup",
})  # fmt: skip

# Names the interpreter tries at start-up whatever runs (site's hook; copy's Jython probe).
INTERPRETER_PROBES = frozenset({"sitecustomize", "usercustomize", "org"})

# Never at start: each is a first-use cost (or, asyncio, not ours to pay under Trio).
FORBIDDEN = (
    "asyncio", "numpy", "gguf", "quart", "quart_trio", "flask", "werkzeug", "jinja2", "click",
    "prometheus_client", "httpx", "xllamacpp", "yaml", "sqlite3", "PIL",
    "ollamatrio.template", "ollamatrio.api.app", "ollamatrio.api.routes", "ollamatrio.testing",
)  # fmt: skip

_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|( *)([\w.]+)$")
_LISTENING = re.compile(r"Listening on http://127\.0\.0\.1:(\d+)")


def _ask_version(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _startup_imports(tmp_path: Path) -> tuple[set[str], bytes]:
    """The modules a fresh server imported up to its first ``/api/version`` answer."""
    env = dict(os.environ, OLLAMA_HOST="127.0.0.1:0", OLLAMA_MODELS=str(tmp_path / "models"))
    env["HOME"] = str(tmp_path)  # no config file, no state of the user's
    env["TMPDIR"] = str(tmp_path)  # the spare runner's folder, left behind by the kill
    env["PYTHONPATH"] = str(ROOT)
    env.pop("OLLAMATRIO_CONFIG", None)
    server = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "ollamatrio", "serve"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    assert server.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        port = None
        while port is None:
            line = server.stderr.readline().decode(errors="replace")
            assert line or server.poll() is None, "the server exited:\n" + "".join(lines[-20:])
            assert time.monotonic() < deadline, "no Listening line in 60 s"
            lines.append(line)
            if found := _LISTENING.search(line):
                port = int(found.group(1))
        answer = _ask_version(port)
    finally:
        server.send_signal(signal.SIGKILL)  # nothing imported after the answer counts
        _, rest = server.communicate(timeout=30)
    lines += rest.decode(errors="replace").splitlines()
    modules = {m.group(2) for line in lines if (m := _IMPORT_LINE.match(line.rstrip("\n")))}
    return modules, answer


@pytest.fixture(scope="module")
def startup(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], bytes]:
    return _startup_imports(tmp_path_factory.mktemp("startup"))


def test_version_answers(startup: tuple[set[str], bytes]) -> None:
    _, answer = startup
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"version":"0.24.0"' in answer.replace(b" ", b"")


def test_no_first_use_cost_at_start(startup: tuple[set[str], bytes]) -> None:
    modules, _ = startup
    loaded = sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert loaded == []


def test_third_party_set_is_pinned(startup: tuple[set[str], bytes]) -> None:
    modules, _ = startup
    stdlib = sys.stdlib_module_names
    tops = {m.split(".")[0] for m in modules}
    third_party = tops - stdlib - INTERPRETER_PROBES - {"ollamatrio"}
    third_party = {t for t in third_party if not t.startswith("_")}
    assert third_party <= ALLOWED_THIRD_PARTY, sorted(third_party - ALLOWED_THIRD_PARTY)
