"""Start a runner child directly (no client), for tests that share one across a module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from ollamatrio.runner.options import RunnerConfig
from ollamatrio.types import LoadSpec


@dataclass
class RawRunner:
    process: subprocess.Popen[bytes]
    config: RunnerConfig
    ready: dict[str, Any]

    @property
    def socket(self) -> str:
        return str(self.ready["socket"])

    def stop(self, timeout: float = 10.0) -> int:
        """Close stdin (the runner's cue to exit) and reap it."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        return self.wait(timeout)

    def wait(self, timeout: float = 10.0) -> int:
        """Reap the runner (SIGKILL after ``timeout``) and close the pipes."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    pipe.close()


def start_raw_runner(spec: LoadSpec, *, api_key: str = "test-key") -> RawRunner:
    """Spawn ``python -m ollamatrio.runner`` and wait (blocking) for its one stdout line."""
    config = RunnerConfig(
        spec=spec,
        api_key=api_key,
        socket_dir=tempfile.mkdtemp(prefix="ollamatrio-test-"),
        parent_pid=os.getpid(),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "ollamatrio.runner"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(config.to_json().encode() + b"\n")
    process.stdin.flush()
    line = process.stdout.readline()
    ready = json.loads(line) if line else {"event": "exit"}
    return RawRunner(process, config, ready)


def start_raw_runner_in_short_lived_thread(spec: LoadSpec) -> RawRunner:
    """Spawn from a thread that then exits, as Trio's worker threads do when idle."""
    box: dict[str, RawRunner] = {}
    thread = threading.Thread(target=lambda: box.setdefault("runner", start_raw_runner(spec)))
    thread.start()
    thread.join()
    return box["runner"]
