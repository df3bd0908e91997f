"""Serving: long streams are never cut by Quart's response timeout, ``serve`` on port 0,
graceful drain at shutdown, and SIGINT/SIGTERM handling of the real process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from helpers.read_only import read_only

from ollamatrio._version import OLLAMA_API_VERSION, __version__
from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.serve import StartupError, check_models_dir, serve
from ollamatrio.store import ModelStore, import_gguf

SYSTEM = json.dumps({"gpus": [], "system": {"total": 64 << 30, "cpu_count": 2}})


def import_model(store: ModelStore, name: str, path: Path) -> None:
    for _ in import_gguf(store, name, path):
        pass


def _engines(behaviour: SimulatedBehaviour) -> tuple[SimulatedEngineFactory, SimulatedDevices]:
    devices = SimulatedDevices(SYSTEM)
    return SimulatedEngineFactory(devices, default=behaviour), devices


async def start_serve(
    nursery: trio.Nursery,
    settings: Settings,
    stop: trio.Event,
    engines: SimulatedEngineFactory,
    devices: SimulatedDevices,
) -> str:
    """``serve`` on port 0 until ``stop`` is set; its one URL."""
    (url,) = await nursery.start(
        partial(serve, settings, shutdown_trigger=stop.wait, engines=engines, devices=devices)
    )
    return url


async def test_stream_longer_than_a_minute(autojump_clock: trio.abc.Clock, api_server) -> None:
    """35 tokens at 0.5 token/s (70 s) through real hypercorn, in virtual time, with Quart's
    60 s response timeout put back: generation routes do not go through Quart's response
    machinery, so nothing cuts a long stream.  The clock jumps only after 30 ms of real
    idleness, so socket and worker-thread work always finishes before virtual time moves."""
    autojump_clock.autojump_threshold = 0.1  # type: ignore[attr-defined]
    behaviour = SimulatedBehaviour(load_seconds=1, tokens_per_second=0.5)
    lines: list[dict] = []
    with trio.fail_after(1000):
        async with api_server(behaviour=behaviour) as srv:
            srv.app.config["RESPONSE_TIMEOUT"] = 60
            async with httpx.AsyncClient(base_url=srv.url, timeout=None) as c:
                body = {"model": "tiny", "prompt": "x", "options": {"num_predict": 35}}
                async with c.stream("POST", "/api/generate", json=body) as r:
                    async for line in r.aiter_lines():
                        lines.append(json.loads(line))
    tokens = [line for line in lines if "load_progress" not in line]  # after the load's
    assert len(tokens) == 36
    assert lines[-1]["done"]
    assert lines[-1]["eval_duration"] == 70 * 10**9  # 70 virtual seconds


async def test_serve_on_port_zero_and_unload_at_shutdown(tmp_path: Path, tiny_gguf) -> None:
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
    import_model(ModelStore(settings.models_dir), "tiny", tiny_gguf())
    engines, devices = _engines(SimulatedBehaviour(load_seconds=0.01, tokens_per_second=100))
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(serve, settings, shutdown_trigger=stop.wait, engines=engines,
                        devices=devices)
            )  # fmt: skip
            (url,) = binds
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
            assert not url.endswith(":0")
            async with httpx.AsyncClient(base_url=url) as c:
                # A stream in flight when shutdown starts is drained, not cut.
                async with c.stream(
                    "POST", "/api/generate",
                    json={"model": "tiny", "prompt": "x", "options": {"num_predict": 30}},
                ) as r:  # fmt: skip
                    lines = []
                    async for line in r.aiter_lines():
                        if "load_progress" in line:
                            continue  # the load's lines
                        if not lines:
                            stop.set()
                        lines.append(json.loads(line))
            assert len(lines) == 31
            assert lines[-1]["done_reason"] == "length"
            assert engines.engines  # still loaded while serving
        # serve() returned: every runner was unloaded.
        assert engines.engines == {}
        assert engines.loads == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_run_server_stops_on_signal(tmp_path: Path, signum: signal.Signals) -> None:
    env = {
        **os.environ,
        "OLLAMA_HOST": "127.0.0.1:0",
        "OLLAMA_MODELS": str(tmp_path / "models"),
        "OLLAMATRIO_ENGINE": "simulated",
        "OLLAMATRIO_SIMULATED_GPUS": SYSTEM,
    }
    code = "from ollamatrio.serve import run_server; run_server()"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", code], env=env, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    output = b""
    try:
        with trio.fail_after(30):
            while (match := re.search(rb"Listening on (http://\S+)", output)) is None:
                chunk = await proc.stderr.receive_some()
                assert chunk, output.decode()
                output += chunk
            while b"\n" not in output[match.end() :]:
                chunk = await proc.stderr.receive_some()
                assert chunk, output.decode()
                output += chunk
            # Both versions in the log line: ours and the Ollama API's it implements.
            line = output[match.start() :].split(b"\n")[0].decode()
            assert f"(version {__version__}, Ollama API {OLLAMA_API_VERSION})" in line
            async with httpx.AsyncClient(base_url=match.group(1).decode()) as c:
                assert (await c.get("/api/version")).status_code == 200
            proc.send_signal(signum)
            while chunk := await proc.stderr.receive_some():
                output += chunk
            assert await proc.wait() == 0, output.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        await proc.stderr.aclose()
    text = output.decode()
    assert f"received {signum.name}, shutting down" in text
    assert "server stopped" in text


# -- start-up errors: one line, exit status 1 ----------------------------------------------


def _serve_fails(env: dict[str, str]) -> str:
    """``python -m ollamatrio serve`` with ``env`` must fail at once: status 1, nothing on
    stdout and exactly one line on stderr, which is returned."""
    env = {**os.environ, "OLLAMATRIO_ENGINE": "simulated", "OLLAMATRIO_SIMULATED_GPUS": SYSTEM,
           **env}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "ollamatrio", "serve"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert proc.stderr.endswith("\n"), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_serve_on_a_busy_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as held:  # another server (Ollama, say) already listens there
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = _serve_fails(
            {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_MODELS": str(tmp_path / "models")}
        )
    assert line == f"Error: listen tcp 127.0.0.1:{port}: bind: address already in use\n"


def test_serve_with_models_under_a_file_says_so_in_one_line(tmp_path: Path) -> None:
    """A path under a regular file cannot be created, not even by root."""
    (tmp_path / "file").write_text("not a folder")
    line = _serve_fails({"OLLAMA_HOST": "127.0.0.1:0", "OLLAMA_MODELS": str(tmp_path / "file/sub")})
    assert line == (
        f"Error: mkdir {tmp_path / 'file'}: not a directory: ensure path elements are traversable\n"
    )


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("nosuchhost.invalid", "listen tcp: lookup nosuchhost.invalid: no such host"),
        # TEST-NET-1 (RFC 5737): no interface of this machine has it.
        ("192.0.2.1:11434", "listen tcp 192.0.2.1:11434: bind: cannot assign requested address"),
    ],
    ids=["unknown-name", "foreign-address"],
)
def test_serve_with_a_bad_ollama_host_says_so_in_one_line(
    tmp_path: Path, host: str, expected: str
) -> None:
    line = _serve_fails({"OLLAMA_HOST": host, "OLLAMA_MODELS": str(tmp_path / "models")})
    assert line == f"Error: {expected}\n"


def test_an_unreadable_store_is_one_startup_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root reads every folder, so the refusal is simulated where the store is read."""

    def refuse(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", refuse)
    with pytest.raises(StartupError) as caught:
        check_models_dir(tmp_path / "models")
    assert str(caught.value) == f"open {tmp_path / 'models' / 'blobs'}: permission denied"


async def test_serve_from_a_read_only_store_with_a_leftover_partial(
    tmp_path: Path, tiny_gguf, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pull cut short leaves ``*-partial-*`` files; a store remounted read-only after that
    must still start and serve what it holds (start-up clean-up is best-effort)."""
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
    store = ModelStore(settings.models_dir)
    import_model(store, "tiny", tiny_gguf())
    partial_file = store.blobs_dir / f"sha256-{'0' * 64}-partial-0"
    partial_file.write_bytes(b"half a download")
    engines, devices = _engines(SimulatedBehaviour(load_seconds=0.01, tokens_per_second=100))
    stop = trio.Event()
    with read_only(settings.models_dir, monkeypatch):
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                url = await start_serve(nursery, settings, stop, engines, devices)
                async with httpx.AsyncClient(base_url=url) as c:
                    tags = (await c.get("/api/tags")).json()
                    assert [m["name"] for m in tags["models"]] == ["tiny:latest"]
                    assert (await c.post("/api/show", json={"model": "tiny"})).status_code == 200
                    r = await c.post(
                        "/api/generate",
                        json={"model": "tiny", "prompt": "x", "stream": False,
                              "options": {"num_predict": 3}},
                    )  # fmt: skip
                    assert r.status_code == 200, r.text
                    assert r.json()["done"] is True
                stop.set()
    assert partial_file.exists()  # nothing could be removed, and nothing failed for it


async def test_shutdown_tells_cut_streams_and_queued_requests_why(
    autojump_clock: trio.abc.Clock, tmp_path: Path, tiny_gguf
) -> None:
    """SIGTERM's drain: two long streams (native NDJSON, /v1 SSE) and two requests queued
    for a slot are still running when the 10 s grace period ends.  The streams end with an
    error line, the queued requests get 503, then the server stops."""
    autojump_clock.autojump_threshold = 0.1  # type: ignore[attr-defined]
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models", num_parallel=2)
    import_model(ModelStore(settings.models_dir), "tiny", tiny_gguf())
    engines, devices = _engines(SimulatedBehaviour(load_seconds=0.01, tokens_per_second=1))
    messages = [{"role": "user", "content": "x"}]
    streams = {
        "/api/generate": {"model": "tiny", "prompt": "x", "options": {"num_predict": 1000}},
        "/v1/chat/completions": {
            "model": "tiny", "messages": messages, "stream": True, "max_tokens": 1000
        },
    }  # fmt: skip
    queued = {
        "/api/chat": {"model": "tiny", "messages": messages},
        "/v1/completions": {"model": "tiny", "prompt": "x", "max_tokens": 3},
    }
    lines: dict[str, list[str]] = {path: [] for path in streams}
    answers: dict[str, tuple[int, dict, float]] = {}
    stop = trio.Event()

    async def read_stream(c: httpx.AsyncClient, path: str, first: trio.Event) -> None:
        async with c.stream("POST", path, json=streams[path]) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line:
                    lines[path].append(line)
                    first.set()

    async def wait_in_queue(c: httpx.AsyncClient, path: str) -> None:
        r = await c.post(path, json=queued[path])
        answers[path] = (r.status_code, r.json(), trio.current_time())

    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            url = await start_serve(nursery, settings, stop, engines, devices)
            async with httpx.AsyncClient(base_url=url, timeout=None) as c:
                async with trio.open_nursery() as requests:
                    for path in streams:
                        first = trio.Event()
                        requests.start_soon(read_stream, c, path, first)
                        await first.wait()
                    for path in queued:
                        requests.start_soon(wait_in_queue, c, path)
                    await trio.sleep(1)  # both are waiting for a slot now
                    stopped_at = trio.current_time()
                    stop.set()
                assert trio.current_time() - stopped_at == pytest.approx(10, abs=0.5)
    native, sse = lines["/api/generate"], lines["/v1/chat/completions"]
    assert json.loads(native[-1]) == {"error": "server shutting down"}
    assert len(native) > 5
    assert all("error" not in json.loads(line) for line in native[:-1])
    assert json.loads(sse[-1].removeprefix("data: "))["error"]["message"] == "server shutting down"
    assert "data: [DONE]" not in sse
    assert answers["/api/chat"][:2] == (503, {"error": "server shutting down"})
    assert answers["/v1/completions"][0] == 503
    assert answers["/v1/completions"][1]["error"]["message"] == "server shutting down"
    for _status, _body, at in answers.values():
        assert at - stopped_at == pytest.approx(10, abs=0.5)
    assert engines.engines == {}  # and every runner unloaded after that
