"""``/api/create``'s progress stream: who owns the store's iterator, and how errors end it.

The store's ``create_model`` is replaced by scripted iterators, so each test controls exactly
where the stream stands when the client leaves or a step fails."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from ollamatrio.api import progress
from ollamatrio.errors import InvalidRequestError, ModelNotFoundError, OllamatrioError

BODY = {"model": "new", "from": "tiny"}


class Script:
    """A store iterator that yields ``steps`` (an exception is raised in its turn), then
    waits for ``release``; ``closed`` is set when it is closed, from whatever thread."""

    def __init__(self, *steps: dict[str, Any] | Exception) -> None:
        self.steps = steps
        self.closed = trio.Event()
        self._token = trio.lowlevel.current_trio_token()

    def __call__(self, store: Any, name: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        return self._run()

    def _run(self) -> Iterator[dict[str, Any]]:
        try:
            for step in self.steps:
                if isinstance(step, Exception):
                    raise step
                yield step
        finally:
            self._token.run_sync_soon(self.closed.set)


def scope_for(path: str, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """An ASGI scope and ``receive`` for one POST whose client then says nothing more."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 11434), "extensions": {},
    }  # fmt: skip
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": json.dumps(body).encode()}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    return scope, receive


async def test_client_gone_at_the_head_closes_the_store_iterator(
    api_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script({"status": "parsing GGUF"}, {"status": "writing manifest"})
    head_sent = trio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            head_sent.set()
            await trio.sleep_forever()  # the connection is gone: this write never completes

    with trio.fail_after(30):
        async with api_server() as srv:
            monkeypatch.setattr(progress, "create_model", script)
            scope, receive = scope_for("/api/create", BODY)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(srv.app, scope, receive, send)
                await head_sent.wait()
                assert not script.closed.is_set()  # the stream owns it while it writes
                nursery.cancel_scope.cancel()
            with trio.fail_after(1):
                await script.closed.wait()


@pytest.mark.parametrize(
    ("failure", "status"),
    [(InvalidRequestError("bad layer"), 400), (ModelNotFoundError("no such model"), 404)],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_an_error_before_the_first_event_keeps_its_status(
    api_server: Any, monkeypatch: pytest.MonkeyPatch, failure: Exception, status: int,
    stream: bool,
) -> None:  # fmt: skip
    script = Script(failure)
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            monkeypatch.setattr(progress, "create_model", script)
            r = await c.post("/api/create", json={**BODY, "stream": stream})
            assert r.status_code == status
            assert r.json() == {"error": str(failure)}
            await script.closed.wait()


async def test_validation_errors_answer_before_the_stream(api_server: Any) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/create", json={"model": "new", "files": ["x"]})
            assert r.status_code == 400
            assert r.json() == {"error": "invalid value for 'files': expected an object"}
            r = await c.post("/api/create", json={"model": "new", "from": "absent"})
            assert r.status_code == 404


@pytest.mark.parametrize(
    ("failure", "message"),
    [(OllamatrioError("disk full"), "disk full"), (RuntimeError("boom"), "boom")],
)
async def test_an_error_after_the_first_event_ends_with_an_error_line(
    api_server: Any, monkeypatch: pytest.MonkeyPatch, failure: Exception, message: str
) -> None:
    script = Script({"status": "parsing GGUF"}, failure)
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            monkeypatch.setattr(progress, "create_model", script)
            r = await c.post("/api/create", json=BODY)
            assert r.status_code == 200
            lines = [json.loads(line) for line in r.text.splitlines()]
            assert lines == [{"status": "parsing GGUF"}, {"error": message}]
            await script.closed.wait()


async def test_each_event_is_one_line_and_stream_false_answers_the_last(
    api_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [{"status": "parsing GGUF"}, {"status": "writing manifest"}, {"status": "success"}]
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            monkeypatch.setattr(progress, "create_model", Script(*steps))
            r = await c.post("/api/create", json=BODY)
            assert r.headers["content-type"] == "application/x-ndjson"
            assert [json.loads(line) for line in r.text.splitlines()] == steps
            monkeypatch.setattr(progress, "create_model", Script(*steps))
            r = await c.post("/api/create", json={**BODY, "stream": False})
            assert (r.status_code, r.json()) == (200, {"status": "success"})
