"""The front door's connection budget (http/budget.py): the open file limit raised at start,
the cap derived from it, and the policy at the cap (the oldest idle connection closed to
make room, else a fast 503), in isolation and through the front door."""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import import_model
from test_front import GENERATE, Client

from ollamatrio.config import Settings
from ollamatrio.http import budget as budget_module
from ollamatrio.http.budget import (
    RETRY_AFTER,
    ConnectionBudget,
    default_cap,
    raise_open_file_limit,
)
from ollamatrio.runner.file_limit import CHILD_LIMIT_ENV
from ollamatrio.serve import connection_cap
from ollamatrio.store import ModelStore

# -- the open file limit and the cap ------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "cap"),
    [(64, 16), (256, 128), (512, 384), (1024, 768), (4096, 3072), (1 << 20, 786432)],
)
def test_default_cap(limit: int, cap: int) -> None:
    assert default_cap(limit) == cap


class FakeLimits:
    """``resource.getrlimit``/``setrlimit`` for RLIMIT_NOFILE, without touching ours."""

    def __init__(self, soft: int, hard: int, *, refuse: bool = False) -> None:
        self.soft, self.hard, self.refuse = soft, hard, refuse
        self.set: list[tuple[int, int]] = []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        if self.refuse:
            raise ValueError("not allowed to raise maximum limit")
        self.set.append(limits)
        self.soft, self.hard = limits


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(soft: int, hard: int, **kwargs: Any) -> FakeLimits:
        fake = FakeLimits(soft, hard, **kwargs)
        monkeypatch.delenv(CHILD_LIMIT_ENV, raising=False)  # what a raise records, undone
        monkeypatch.setattr(resource, "getrlimit", fake.getrlimit)
        monkeypatch.setattr(resource, "setrlimit", fake.setrlimit)
        return fake

    return install


def test_the_soft_limit_is_raised_to_the_hard_one(limits: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, "ollamatrio.http.budget")
    fake = limits(1024, 524288)
    got = raise_open_file_limit()
    assert (got.before, got.soft, got.hard) == (1024, 524288, 524288)
    assert fake.set == [(524288, 524288)]
    assert "open file limit raised from 1024 to 524288 (hard limit 524288)" in caplog.text
    assert os.environ[CHILD_LIMIT_ENV] == "1024"  # runners get the limit the server had


def test_an_unlimited_hard_limit_raises_to_the_systems_ceiling(
    limits: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, "ollamatrio.http.budget")
    monkeypatch.setattr(budget_module, "_ceiling", lambda: 65536)
    fake = limits(256, resource.RLIM_INFINITY)
    assert raise_open_file_limit().soft == 65536
    assert fake.set == [(65536, resource.RLIM_INFINITY)]
    assert "raised from 256 to 65536 (hard limit unlimited)" in caplog.text


def test_a_soft_limit_at_the_hard_one_stays(limits: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, "ollamatrio.http.budget")
    fake = limits(256, 256)
    got = raise_open_file_limit()
    assert (got.before, got.soft) == (256, 256)
    assert fake.set == []
    assert "open file limit 256 (hard limit 256)" in caplog.text
    assert CHILD_LIMIT_ENV not in os.environ


def test_a_refused_raise_keeps_the_limit_and_warns(limits: Any, caplog: Any) -> None:
    limits(1024, 4096, refuse=True)
    assert raise_open_file_limit().soft == 1024
    assert "could not raise it to 4096" in caplog.text


def test_the_cap_follows_the_raised_limit_or_the_setting(limits: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, "ollamatrio.serve")
    limits(256, 1024)
    assert connection_cap(Settings()) == 768  # from 1,024, not 256
    assert "up to 768 client connections at once (from the limit" in caplog.text
    assert connection_cap(Settings(max_connections=50)) == 50
    assert connection_cap(Settings(max_connections=5000)) == 5000
    assert "above the open file limit (1024)" in caplog.text


@pytest.mark.parametrize(("value", "expect"), [("", 0), ("0", 0), ("300", 300), (" '40' ", 40)])
def test_max_connections_setting(value: str, expect: int) -> None:
    assert Settings.from_env({"OLLAMATRIO_MAX_CONNECTIONS": value}).max_connections == expect


@pytest.mark.parametrize("value", ["-1", "many", "1.5", "1e3"])
def test_a_bad_max_connections_is_a_clear_error(value: str) -> None:
    with pytest.raises(ValueError, match="OLLAMATRIO_MAX_CONNECTIONS must be a number"):
        Settings.from_env({"OLLAMATRIO_MAX_CONNECTIONS": value})


# -- the policy at the cap, on the autojump clock ------------------------------------------


class Conn:
    """A connection as the front door holds one: a place, and idle stretches."""

    def __init__(self, budget: ConnectionBudget, name: str, log: list[str]) -> None:
        self.budget, self.name, self.log = budget, name, log
        self.admitted: bool | None = None
        self.go_idle = trio.Event()
        self.leave = trio.Event()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.budget.place(self) as admitted:
            self.admitted = admitted
            task_status.started()
            if not admitted:
                self.log.append(f"{self.name} refused")
                return
            with trio.CancelScope() as busy:
                await self.go_idle.wait()
            with trio.CancelScope() as scope, self.budget.idle(scope):
                await self.leave.wait()
            self.log.append(f"{self.name} {'closed' if scope.cancel_called else 'left'}")
            assert not busy.cancel_called


async def test_under_the_cap_every_connection_gets_a_place(autojump_clock: Any) -> None:
    budget = ConnectionBudget(3)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        conns = [Conn(budget, f"c{i}", log) for i in range(3)]
        for c in conns:
            await nursery.start(c.run)
        assert [c.admitted for c in conns] == [True] * 3
        assert (budget.held, budget.peak, budget.evicted, budget.refused) == (3, 3, 0, 0)
        for c in conns:
            c.go_idle.set()
            c.leave.set()
    assert (budget.held, sorted(log)) == (0, ["c0 left", "c1 left", "c2 left"])


async def test_at_the_cap_the_oldest_idle_connection_makes_room(autojump_clock: Any) -> None:
    budget = ConnectionBudget(3)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        a, b, c = (Conn(budget, name, log) for name in "abc")
        for conn in (a, b, c):
            await nursery.start(conn.run)
        # Idle since: c, then a; b stays busy.
        c.go_idle.set()
        await trio.testing.wait_all_tasks_blocked()
        a.go_idle.set()
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        d = Conn(budget, "d", log)
        await nursery.start(d.run)
        assert d.admitted
        assert trio.current_time() == start
        assert log == ["c closed"]
        e = Conn(budget, "e", log)
        await nursery.start(e.run)
        assert e.admitted
        assert log == ["c closed", "a closed"]
        # b, d and e are busy: the next one is refused, at once.
        f = Conn(budget, "f", log)
        await nursery.start(f.run)
        assert f.admitted is False
        assert log[-1] == "f refused"
        assert (budget.held, budget.peak, budget.evicted, budget.refused) == (3, 3, 2, 1)
        # One leaves: the next one has its place.
        b.go_idle.set()
        b.leave.set()
        await budget.wait_held(2)
        g = Conn(budget, "g", log)
        await nursery.start(g.run)
        assert g.admitted
        assert budget.evicted == 2
        for conn in (d, e, g):
            conn.go_idle.set()
            conn.leave.set()
    assert budget.held == 0


async def test_a_burst_closes_one_idle_connection_per_newcomer(autojump_clock: Any) -> None:
    budget = ConnectionBudget(4)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        old = [Conn(budget, f"old{i}", log) for i in range(4)]
        for conn in old:
            await nursery.start(conn.run)
            conn.go_idle.set()
            await trio.testing.wait_all_tasks_blocked()
        new = [Conn(budget, f"new{i}", log) for i in range(3)]
        for conn in new:  # all at once, before any closed one has left
            nursery.start_soon(conn.run)
        await budget.wait_held(4)
        await trio.testing.wait_all_tasks_blocked()
        assert all(conn.admitted for conn in new)
        assert sorted(log) == ["old0 closed", "old1 closed", "old2 closed"]  # the oldest
        assert budget.held == 4
        assert (budget.peak, budget.evicted, budget.refused) == (4, 3, 0)
        nursery.cancel_scope.cancel()
    assert budget.held == 0


async def test_a_newcomer_waits_for_a_connection_already_closing(autojump_clock: Any) -> None:
    """Not refused for a place that is being freed (the handler is in its last close)."""
    budget = ConnectionBudget(1)
    closed = trio.Event()
    log: list[str] = []

    async def closing(task_status: trio.TaskStatus[None]) -> None:
        async with budget.place("old"):
            task_status.started()
            budget.leaving("old")
            await closed.wait()  # the socket's close, drawn out

    async with trio.open_nursery() as nursery:
        await nursery.start(closing)
        new = Conn(budget, "new", log)
        nursery.start_soon(new.run)
        await trio.testing.wait_all_tasks_blocked()
        assert new.admitted is None  # waiting
        closed.set()
        await trio.testing.wait_all_tasks_blocked()
        assert new.admitted
        assert (budget.held, budget.evicted, budget.refused) == (1, 0, 0)
        new.go_idle.set()
        new.leave.set()
    assert budget.held == 0


async def test_close_idle_at_shutdown(autojump_clock: Any) -> None:
    budget = ConnectionBudget(2)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        a, b = Conn(budget, "a", log), Conn(budget, "b", log)
        for conn in (a, b):
            await nursery.start(conn.run)
        a.go_idle.set()
        await trio.testing.wait_all_tasks_blocked()
        budget.close_idle()
        await budget.wait_held(1)
        assert log == ["a closed"]
        b.go_idle.set()
        b.leave.set()
    assert budget.held == 0


def test_the_cap_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionBudget(0)


# -- through the front door -------------------------------------------------------------


async def test_a_new_client_closes_the_oldest_idle_keep_alive(api_server: Any) -> None:
    budget = ConnectionBudget(3)
    with trio.fail_after(30):
        async with api_server(budget=budget) as srv:
            clients = []
            for _ in range(3):
                client = await Client.open(srv.url)
                r = await client.exchange("/api/version", method="GET")
                assert (r.status, r.by_front_door) == (200, True)
                clients.append(client)
            await budget.wait_held(3)
            # A fourth: the first (idle longest) is closed, the newcomer served.
            client = await Client.open(srv.url)
            r = await client.exchange("/api/generate", GENERATE)
            assert (r.status, r.lines()[-1]["done"]) == (200, True)
            clients.append(client)
            assert await clients[0].closed()
            assert (budget.held, budget.evicted, budget.refused) == (3, 1, 0)
            # A client connected but silent is idle as well (waiting for its first head).
            silent = await Client.open(srv.url)
            await budget.wait_held(3)
            assert await clients[1].closed()
            for client in clients[2:]:
                r = await client.exchange("/api/version", method="GET")
                assert r.status == 200
            for client in (*clients, silent):
                await client.stream.aclose()
            await budget.wait_held(0)


async def expect_continue(client: Client) -> None:
    """A generation whose body is still to come: busy, not idle, once 100 Continue came."""
    request = client.request("/api/generate", GENERATE, extra=b"Expect: 100-continue\r\n")
    await client.send(request.partition(b"\r\n\r\n")[0] + b"\r\n\r\n")
    assert await client._line() == b"HTTP/1.1 100 Continue"
    assert await client._line() == b""


async def test_over_the_cap_with_none_idle_is_a_fast_503(api_server: Any) -> None:
    budget = ConnectionBudget(2)
    with trio.fail_after(30):
        async with api_server(budget=budget) as srv:
            busy = [await Client.open(srv.url) for _ in range(2)]
            for client in busy:
                await expect_continue(client)
            refused = await Client.open(srv.url)
            with trio.fail_after(1):
                r = await refused.exchange("/api/version", method="GET")
            assert r.status == 503
            assert r.headers[b"retry-after"] == b"%d" % RETRY_AFTER
            assert r.headers[b"connection"] == b"close"
            assert "error" in json.loads(r.body)
            assert await refused.closed()
            await refused.stream.aclose()
            assert (budget.held, budget.refused) == (2, 1)
            # One of the busy ones finishes its request; the next client is served.
            body = json.dumps(GENERATE).encode()
            await busy[0].send(body)
            r = await busy[0].response()
            assert r.status == 200
            await busy[0].stream.aclose()
            await budget.wait_held(1)
            client = await Client.open(srv.url)
            r = await client.exchange("/api/version", method="GET")
            assert r.status == 200
            for c in (client, *busy):
                await c.stream.aclose()
            await budget.wait_held(0)


async def test_a_connection_handed_to_hypercorn_holds_its_place(api_server: Any) -> None:
    budget = ConnectionBudget(1)
    with trio.fail_after(30):
        async with api_server(budget=budget) as srv:
            theirs = await Client.open(srv.url)
            # A head with bare-LF line ends is hypercorn's; the body is still to come.
            data = json.dumps(GENERATE).encode()
            await theirs.send(
                b"POST /api/generate HTTP/1.1\nHost: %s\nContent-Length: %d\n\n"
                % (theirs.host, len(data))
            )
            await budget.wait_held(1)
            refused = await Client.open(srv.url)
            r = await refused.exchange("/api/version", method="GET")
            assert r.status == 503
            await refused.stream.aclose()
            await theirs.send(data)
            r = await theirs.response()
            assert (r.status, r.by_front_door) == (200, False)
            await theirs.stream.aclose()
            await budget.wait_held(0)
            ours = await Client.open(srv.url)
            r = await ours.exchange("/api/version", method="GET")
            assert r.status == 200
            await ours.stream.aclose()


def test_a_refused_client_reads_the_503_though_it_sent_a_request_first() -> None:
    """The request the refused client already sent is read before closing, so that the
    close is no reset that could destroy the answer."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as client:
        client.sendall(b"GET /api/version HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
        server, _ = listener.accept()

        async def main() -> None:
            await budget_module.refuse(trio.SocketStream(trio.socket.from_stdlib_socket(server)))

        trio.run(main)
        client.settimeout(5)
        data = b""
        while chunk := client.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 503 ")
        assert data.endswith(budget_module.REFUSAL_BODY)


# -- a real server under a low open file limit ---------------------------------------------

LIMIT = 256  # soft and hard: raising the soft limit cannot help


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
async def test_a_server_under_a_low_file_limit_still_serves_and_loads(
    tmp_path: Path, tiny_gguf: Any
) -> None:
    """``python -m ollamatrio serve`` (real runner processes) under ``ulimit -n 256``: with
    more idle connections than its cap, a new request and a model load still succeed (the
    oldest idle connections are closed for them); with the cap taken by busy connections, a
    new one is answered 503 at once; the server's descriptors stay below the limit."""
    store = ModelStore(tmp_path / "models")
    await trio.to_thread.run_sync(import_model, store, "tiny", tiny_gguf())
    env = {**os.environ, "OLLAMA_HOST": "127.0.0.1:0", "OLLAMA_MODELS": str(tmp_path / "models"),
           "OLLAMATRIO_ENGINE": "process"}  # fmt: skip
    env.pop("OLLAMATRIO_MAX_CONNECTIONS", None)
    command = f'ulimit -Sn {LIMIT} && ulimit -Hn {LIMIT} && exec "$@"'
    proc = await trio.lowlevel.open_process(
        ["bash", "-c", command, "bash", sys.executable, "-m", "ollamatrio", "serve"],
        env=env, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    output = bytearray()
    listening = trio.Event()

    async def read_log() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.receive_some():
            output.extend(chunk)
            if b"Listening on" in output:
                listening.set()

    clients: list[Client] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_log)
            with trio.fail_after(60):
                await listening.wait()
            text = output.decode()
            assert f"open file limit {LIMIT} (hard limit {LIMIT})" in text
            match = re.search(r"up to (\d+) client connections at once \(from the limit", text)
            assert match is not None, text
            cap = int(match.group(1))
            assert cap == default_cap(LIMIT)
            url = re.search(r"Listening on (http://\S+)", text).group(1)  # type: ignore[union-attr]

            def server_fds() -> int:
                return len(os.listdir(f"/proc/{proc.pid}/fd"))

            with trio.fail_after(60):
                # More idle connections than the cap: the oldest are closed as new ones come.
                idle = [await Client.open(url) for _ in range(cap + 8)]
                clients += idle
                with trio.fail_after(5):
                    r = await (await open_client(url, clients)).exchange(
                        "/api/version", method="GET"
                    )
                assert r.status == 200
                # A generation that starts a runner process: it has its descriptors.
                client = await open_client(url, clients)
                r = await client.exchange("/api/generate", {**GENERATE, "stream": False})
                assert r.status == 200, r.body
                assert json.loads(r.body)["done"] is True
                for old in idle[:8]:
                    assert await old.closed()
                assert server_fds() < LIMIT
                # The cap taken by busy connections (a body still to come): a fast 503.
                for c in clients:
                    await c.stream.aclose()
                clients.clear()
                for _ in range(cap):
                    await expect_continue(await open_client(url, clients))
                refused = await open_client(url, clients)
                with trio.fail_after(2):
                    r = await refused.exchange("/api/version", method="GET")
                assert r.status == 503
                assert r.headers[b"retry-after"] == b"%d" % RETRY_AFTER
                assert server_fds() < LIMIT
                assert "the most allowed (OLLAMATRIO_MAX_CONNECTIONS)" in output.decode()
                for c in clients:
                    await c.stream.aclose()
                clients.clear()
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0, output.decode()
    finally:
        for c in clients:
            await c.stream.aclose()
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        await proc.stderr.aclose()
    assert "server stopped" in output.decode()


async def open_client(url: str, clients: list[Client]) -> Client:
    client = await Client.open(url)
    clients.append(client)
    return client
