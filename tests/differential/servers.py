"""The two servers the differential suite talks to: the reference Ollama (the upstream
release in ``../shared/ollama``) and ollamatrio from this tree, each a child process with
its own store, both holding the same model created from the same Modelfile; and the
registry both push to (the project's fake one, in a thread of the test process)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

# Where the reference lives: OLLAMATRIO_REFERENCE_OLLAMA (a folder holding the tarball, or
# the tarball itself; set, it is the only place looked at), else ``../shared/ollama`` from
# the repository root, else the same beside a git worktree's main checkout.
ENV_REFERENCE = "OLLAMATRIO_REFERENCE_OLLAMA"
TARBALL_GLOB = "ollama-*-linux-amd64*.tgz"

# The reference listens on one of these (other suites use other ports).
REFERENCE_PORTS = range(11500, 11510)
# The registry the push cases publish to listens on one of these.
REGISTRY_PORTS = range(11510, 11520)

# Start-up is well under a second for both; a loaded machine gets plenty of slack.
START_TIMEOUT = 60.0

_LISTENING = re.compile(r"Listening on (?:http://)?([0-9.]+:[0-9]+)")


def _candidates() -> Iterator[Path]:
    if env := os.environ.get(ENV_REFERENCE):
        yield Path(env)  # named: the only place looked at
        return
    yield REPO_ROOT.parent / "shared" / "ollama"
    # A git worktree: the main checkout's sibling.
    git = REPO_ROOT / ".git"
    if git.is_file():
        common = git.read_text().partition("gitdir:")[2].strip()
        main = Path(common).resolve().parents[2] if common else None
        if main is not None:
            yield main.parent / "shared" / "ollama"


def reference_tarball() -> Path | None:
    """The reference Ollama's tarball, or None when none is here."""
    for place in _candidates():
        if place.is_file():
            return place
        if place.is_dir():
            found = sorted(place.glob(TARBALL_GLOB))
            if found:
                return found[-1]
    return None


def free_port(ports: range) -> int:
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} for the reference Ollama")


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path


def _watch(process: subprocess.Popen[bytes], log: Path, found: list[str], ready: threading.Event):
    """Copy the child's output into ``log``; note the address of its 'Listening on' line."""
    assert process.stdout is not None
    with log.open("wb") as out:
        for line in process.stdout:
            out.write(line)
            out.flush()
            if not ready.is_set() and (match := _LISTENING.search(line.decode(errors="replace"))):
                found.append(match.group(1))
                ready.set()
    ready.set()  # the child ended: whoever waits sees no address


@contextmanager
def _running(name: str, argv: list[str], env: dict[str, str], log: Path) -> Iterator[Server]:
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    found: list[str] = []
    ready = threading.Event()
    watcher = threading.Thread(target=_watch, args=(process, log, found, ready), daemon=True)
    watcher.start()
    try:
        ready.wait(START_TIMEOUT)
        if not found:
            raise RuntimeError(f"{name} did not start; its log: {log}\n{log.read_text()[-3000:]}")
        yield Server(name, f"http://{found[0]}", process, log)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        watcher.join(5)
        if process.stdout is not None:
            process.stdout.close()


def _base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA_", "OLLAMATRIO_"))}
    env["HOME"] = str(home)
    return env


@contextmanager
def reference_ollama(tarball: Path, work: Path) -> Iterator[Server]:
    """Extract the reference into ``work`` and run it on a free port of REFERENCE_PORTS."""
    with tarfile.open(tarball) as archive:
        archive.extractall(work, filter="data")
    env = _base_env(work)
    env["OLLAMA_HOST"] = f"127.0.0.1:{free_port(REFERENCE_PORTS)}"
    env["OLLAMA_MODELS"] = str(work / "models")
    try:
        with _running("reference Ollama", [str(work / "bin" / "ollama"), "serve"], env,
                      work / "server.log") as server:  # fmt: skip
            yield server
    finally:
        shutil.rmtree(work / "lib", ignore_errors=True)


@contextmanager
def ollamatrio(work: Path) -> Iterator[Server]:
    """This tree's server on a port the OS picks."""
    env = _base_env(work)
    env["OLLAMA_HOST"] = "127.0.0.1:0"
    env["OLLAMA_MODELS"] = str(work / "models")
    env["OLLAMATRIO_DATA"] = str(work / "data")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    with _running("ollamatrio", [sys.executable, "-m", "ollamatrio", "serve"], env,
                  work / "server.log") as server:  # fmt: skip
        yield server


def create_with_cli(argv: list[str], server: Server, name: str, modelfile: Path) -> None:
    """``<cli> create name -f modelfile`` against ``server`` (each side's own client)."""
    env = _base_env(modelfile.parent)
    env["OLLAMA_HOST"] = server.url
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run(
        [*argv, "create", name, "-f", str(modelfile)],
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{server.name}: create {name} failed: {done.stderr.decode()[-2000:]}")


@contextmanager
def fake_registry(address: str) -> Iterator[Any]:
    """The project's fake registry (``ollamatrio.testing.fake_registry``) listening on
    ``address`` (``127.0.0.1:<port>``), run by Trio in a thread of its own."""
    import trio

    from ollamatrio.testing.fake_registry import FakeRegistry

    host, _, port = address.rpartition(":")
    registry = FakeRegistry(host=host, port=int(port))
    running: dict[str, Any] = {}
    ready = threading.Event()

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            running["stop"] = nursery.cancel_scope
            running["token"] = trio.lowlevel.current_trio_token()
            await nursery.start(registry.serve)
            ready.set()

    def run() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:  # a port taken meanwhile: said by the caller
            running["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="fake registry", daemon=True)
    thread.start()
    ready.wait(START_TIMEOUT)
    if "error" in running or "stop" not in running:
        raise RuntimeError(f"the fake registry did not start on {address}: {running.get('error')}")
    try:
        yield registry
    finally:
        trio.from_thread.run_sync(running["stop"].cancel, trio_token=running["token"])
        thread.join(10)
