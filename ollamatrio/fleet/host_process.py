"""One fleet host's server: an unchanged ``python -m ollamatrio serve`` child process.

A Ray Serve replica (``fleet/ray_app.py``) owns one of these.  The replica's code runs in
Ray's own threads and event loop, not under Trio, so this is plain blocking code: start the
server, read its ``Listening on`` line, answer health and load questions over HTTP, and stop
it with SIGTERM (the server's own drain, then its runners' unload) before SIGKILL.

The child never outlives its owner: it gets ``PR_SET_PDEATHSIG`` (SIGKILL when the thread
that started it dies, which a killed replica process does), and :meth:`HostProcess.stop`
runs from the replica's destructor on every orderly shutdown.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import IO, Any, Final

from ..http.fleet_secret import HEADER as FLEET_SECRET
from ..serve import GRACEFUL_TIMEOUT

log = logging.getLogger(__name__)

STARTUP_TIMEOUT: Final = 60.0  # seconds for the server to print its address
# The server's drain (GRACEFUL_TIMEOUT) plus its runners' unload.
STOP_TIMEOUT: Final = GRACEFUL_TIMEOUT + 10.0
_LISTENING: Final = re.compile(r"Listening on (https?://\S+)")
_PR_SET_PDEATHSIG: Final = 1


class HostStartError(RuntimeError):
    """The server did not start (its output says why)."""


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent thread dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _forward(stream: IO[str], prefix: str) -> None:
    """Copy the server's remaining output to our log, so its pipe never fills."""
    with stream:
        for line in stream:
            log.info("%s %s", prefix, line.rstrip())


class HostProcess:
    """``ollamatrio serve`` on ``bind_host`` (port chosen by the OS)."""

    def __init__(self, bind_host: str, env: Mapping[str, str]) -> None:
        child_env = {**os.environ, **env, "OLLAMA_HOST": f"{bind_host}:0"}
        # The server requires the fleet secret (it reads it from its environment, never
        # from its command line): its health and load questions carry it too.
        secret = child_env.get("OLLAMATRIO_FLEET_SECRET", "").strip()
        self._headers = {FLEET_SECRET.decode(): secret} if secret else {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ollamatrio", "serve"],
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_die_with_parent,
        )
        assert self.proc.stderr is not None
        self.url = self._read_address(self.proc.stderr)
        self.pid = self.proc.pid
        # Inherited from whoever started it: a Ray worker runs at niceness 15 unless the node
        # was started with RAY_worker_niceness=0 (docs/fleet.md), and cannot undo that.
        try:
            self.niceness = os.getpriority(os.PRIO_PROCESS, self.pid)
        except ProcessLookupError:  # it has died already: what it inherited, ours
            self.niceness = os.getpriority(os.PRIO_PROCESS, 0)
        self._output = threading.Thread(
            target=_forward, args=(self.proc.stderr, f"[serve {self.pid}]"), daemon=True
        )
        self._output.start()

    def _read_address(self, stderr: IO[str]) -> str:
        # A watchdog, not a poll: kill the child if it has not spoken in time, which ends
        # the read below.
        timer = threading.Timer(STARTUP_TIMEOUT, self.proc.kill)
        timer.start()
        seen: list[str] = []
        try:
            for line in stderr:
                seen.append(line)
                if (match := _LISTENING.search(line)) is not None:
                    return match.group(1)
        finally:
            timer.cancel()
        self.proc.wait()
        stderr.close()
        output = "".join(seen[-20:])
        raise HostStartError(f"ollamatrio serve exited ({self.proc.returncode}):\n{output}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def get(self, path: str, timeout: float = 5.0) -> Any:
        """``GET path`` on the server, its JSON answer.

        Raises:
            OSError: the server did not answer (URLError is one).
        """
        request = urllib.request.Request(self.url + path, headers=self._headers)
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read())

    def healthy(self) -> str | None:
        """None when the process runs and answers ``/api/version``; else why not."""
        if not self.alive():
            return f"ollamatrio serve exited ({self.proc.returncode})"
        try:
            self.get("/api/version")
        except (OSError, ValueError) as exc:
            return f"ollamatrio serve does not answer /api/version: {exc}"
        return None

    def requests(self) -> float:
        """Requests queued and running on the server (``/api/ps``), for autoscaling."""
        try:
            rows = self.get("/api/ps").get("models") or []
        except (OSError, ValueError, AttributeError):
            return 0.0
        return float(sum(int(r.get("queued", 0)) + int(r.get("active", 0)) for r in rows))

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM (the server drains and unloads its runners), SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("ollamatrio serve %d did not stop in %.0f s", self.pid, timeout)
                self.proc.kill()
                self.proc.wait()
        self._output.join(5.0)  # the rest of its output, up to the end of the pipe
