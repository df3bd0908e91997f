"""API keys in the request chain (api/auth_gate.py): with ``OLLAMATRIO_AUTH=required`` every
route of the table answers by the key it is sent (none, a wrong one, a revoked one, one of each
scope), in its dialect's shape, through raw HTTP and the official SDKs; a key created or revoked
while the server runs counts within a second; the key table never holds a secret."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import ollama
import openai
import pytest
import trio
import trio.testing

from ollamatrio.api.chain import Chain, request_state
from ollamatrio.api.table import ROUTES, Dialect, Route, Scope
from ollamatrio.auth.keys import KeyStore
from ollamatrio.auth.state_file import FILE_NAME
from ollamatrio.config import Settings
from ollamatrio.http.drain import Drain

if TYPE_CHECKING:
    from conftest import RunningServer, ServerFactory

SCOPE_KEYS = ("inference", "admin", "metrics")
BAD_KEYS = ("none", "wrong", "revoked")
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}


@dataclass
class Keys:
    store: KeyStore
    secrets: dict[str, str]  # scope key name -> its secret, and "revoked"


def make_keys(state: Path) -> Keys:
    store = KeyStore.in_folder(state)
    secrets = {name: store.create(name, [name])[1] for name in SCOPE_KEYS}
    secrets["revoked"] = store.create("gone", ["admin"])[1]
    store.revoke("gone")
    return Keys(store, secrets)


@asynccontextmanager
async def auth_server(
    api_server: ServerFactory, tmp_path: Path
) -> AsyncIterator[tuple[RunningServer, Keys]]:
    keys = await trio.to_thread.run_sync(make_keys, tmp_path / "state")
    async with api_server(auth="required", data_dir=tmp_path / "state") as srv:
        yield srv, keys


def headers_for(keys: Keys, who: str) -> dict[str, str]:
    if who == "none":
        return {}
    if who == "wrong":
        return {"Authorization": "Bearer otk_notakeyofours0000000000000000000000000000"}
    return {"Authorization": f"Bearer {keys.secrets[who]}"}


def request_of(route: Route, method: str) -> tuple[str, dict[str, Any]]:
    """A concrete request of ``route``: harmless whatever it reaches (missing names, empty
    bodies), so each key's answer can be seen without side effects."""
    path = (
        route.path.replace("<path:model>", "tiny")
        .replace("<response_id>", "resp_missing")
        .replace("<digest>", "sha256:" + "0" * 64)
        .replace("<path:file>", "app.js")
    )
    if method in ("GET", "HEAD"):
        return path, {}
    if path.startswith("/api/blobs/"):
        return path, {"content": b"x"}
    return path, {"json": {"model": "missing"}}


ROUTE_METHODS = [
    pytest.param(route, method, id=f"{method} {route.path}")
    for route in ROUTES
    for method in sorted(route.methods)
]


async def status_and_body(
    client: httpx.AsyncClient, method: str, path: str, headers: dict[str, str], **kw: Any
) -> tuple[int, httpx.Headers, bytes]:
    """The answer's status and headers, and its body when it is a refusal (a route's own
    answer may stream without end: the event stream)."""
    async with client.stream(method, path, headers=headers, **kw) as response:
        body = await response.aread() if response.status_code in (401, 403) else b""
        return response.status_code, response.headers, body


def check_shape(dialect: Dialect, status: int, body: bytes) -> None:
    answer = json.loads(body)
    if dialect is Dialect.NATIVE:
        assert (
            answer["error"] == "unauthorized"
            if status == 401
            else answer["error"].startswith("forbidden: ")
        )
    elif dialect is Dialect.ANTHROPIC:
        assert answer["type"] == "error"
        kind = "authentication_error" if status == 401 else "permission_error"
        assert answer["error"]["type"] == kind
    else:
        code = "invalid_api_key" if status == 401 else "insufficient_permissions"
        assert answer["error"]["code"] == code
        assert answer["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("route", "method"), ROUTE_METHODS)
async def test_every_route_answers_by_its_key(
    api_server: ServerFactory, tmp_path: Path, route: Route, method: str
) -> None:
    path, extra = request_of(route, method)
    async with (
        auth_server(api_server, tmp_path) as (srv, keys),
        httpx.AsyncClient(base_url=srv.url, timeout=30) as client,
    ):
        answers = {
            who: await status_and_body(client, method, path, headers_for(keys, who), **extra)
            for who in (*BAD_KEYS, *SCOPE_KEYS)
        }
    if route.scope is Scope.OPEN:
        assert {status for status, _, _ in answers.values()} == {200}
        return
    for who, (status, headers, body) in answers.items():
        allowed = who in ("admin", route.scope.value)
        if who in BAD_KEYS:
            assert status == 401, who
            assert headers["www-authenticate"] == "Bearer"
        elif allowed:
            assert status not in (401, 403), who
            continue
        else:
            assert status == 403, who
        if method != "HEAD":
            check_shape(route.dialect, status, body)


async def test_x_api_key_is_accepted_and_a_path_without_route_asks_for_a_key(
    api_server: ServerFactory, tmp_path: Path
) -> None:
    async with (
        auth_server(api_server, tmp_path) as (srv, keys),
        httpx.AsyncClient(base_url=srv.url) as client,
    ):
        ok = await client.get("/api/tags", headers={"x-api-key": keys.secrets["inference"]})
        assert ok.status_code == 200
        assert (await client.get("/api/nowhere")).status_code == 401
        known = {"x-api-key": keys.secrets["metrics"]}
        assert (await client.get("/api/nowhere", headers=known)).status_code == 404
        # A preflight is answered before any key is asked for.
        preflight = await client.options("/api/chat", headers={"Origin": "http://localhost"})
        assert preflight.status_code == 204


async def test_the_official_clients_send_their_keys(
    api_server: ServerFactory, tmp_path: Path
) -> None:
    async with auth_server(api_server, tmp_path) as (srv, keys):
        inference, metrics = keys.secrets["inference"], keys.secrets["metrics"]
        # openai: api_key as Bearer.
        async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=inference) as oai:
            assert [m.id async for m in oai.models.list()]
        for secret, error in (
            ("wrong", openai.AuthenticationError),
            (metrics, openai.PermissionDeniedError),
        ):
            async with openai.AsyncOpenAI(
                base_url=srv.url + "/v1", api_key=secret, max_retries=0
            ) as oai:
                with pytest.raises(error) as caught:
                    await oai.chat.completions.create(model="tiny", messages=CHAT["messages"])
                assert caught.value.code in ("invalid_api_key", "insufficient_permissions")
        # anthropic: api_key as x-api-key, auth_token as Bearer.
        for kw in ({"api_key": inference}, {"auth_token": inference, "api_key": None}):
            async with anthropic.AsyncAnthropic(base_url=srv.url, max_retries=0, **kw) as ant:
                message = await ant.messages.create(
                    model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                )
                assert message.content
        for secret, failure in (
            ("wrong", anthropic.AuthenticationError),
            (metrics, anthropic.PermissionDeniedError),
        ):
            async with anthropic.AsyncAnthropic(
                base_url=srv.url, api_key=secret, max_retries=0
            ) as ant:
                with pytest.raises(failure):
                    await ant.messages.create(
                        model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                    )
        # ollama: headers=.
        bearer = {"Authorization": f"Bearer {inference}"}
        async with ollama.AsyncClient(host=srv.url, headers=bearer) as client:
            assert [m.model for m in (await client.list()).models]
            assert (await client.chat(model="tiny", messages=CHAT["messages"])).message
        async with ollama.AsyncClient(host=srv.url) as client:
            with pytest.raises(ollama.ResponseError) as refused:
                await client.list()
            assert (refused.value.status_code, refused.value.error) == (401, "unauthorized")


async def test_a_key_created_or_revoked_while_serving_counts_within_a_second(
    api_server: ServerFactory, tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    async with (
        auth_server(api_server, tmp_path) as (srv, keys),
        httpx.AsyncClient(base_url=srv.url) as client,
    ):

        async def tags(secret: str) -> int:
            return (await client.get("/api/tags", headers={"x-api-key": secret})).status_code

        assert await tags(keys.secrets["inference"]) == 200  # the table read
        _, secret = await trio.to_thread.run_sync(keys.store.create, "new", ["inference"])
        assert await tags(secret) == 401  # the copy read under a second ago serves
        mock_clock.jump(1.0)
        assert await tags(secret) == 200
        await trio.to_thread.run_sync(keys.store.revoke, "new")
        mock_clock.jump(1.0)
        assert await tags(secret) == 401
        # Last use is written with a reading at least five seconds after the last write.
        mock_clock.jump(5.0)
        assert await tags(keys.secrets["inference"]) == 200
        mock_clock.jump(5.0)
        assert await tags(keys.secrets["inference"]) == 200
        listed = {k.name: k for k in await trio.to_thread.run_sync(keys.store.list)}
        assert listed["inference"].last_used_at is not None
        assert listed["metrics"].last_used_at is None


def test_the_key_table_holds_no_secret(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "state")
    keys.store.mark_used({"inference": 1.0})
    files = [p for p in (tmp_path / "state").iterdir() if p.name.startswith(FILE_NAME)]
    assert files
    data = b"".join(p.read_bytes() for p in files)
    for secret in keys.secrets.values():
        assert secret.encode() not in data
        assert secret[12:].encode() not in data  # nor the part after the public prefix
    assert keys.secrets["inference"][4:12].encode() in data  # the prefix is: the grep works


@pytest.mark.parametrize("auth", ["off", "required"])
async def test_the_route_sees_its_key_and_principal(tmp_path: Path, auth: str) -> None:
    keys = await trio.to_thread.run_sync(make_keys, tmp_path / "state")
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(request_state(scope))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    settings = Settings(auth=auth, data_dir=tmp_path / "state")
    chain = Chain(app, settings, Drain(), lambda: None)
    secret = keys.secrets["inference"].encode()
    for path, headers in (
        ("/api/tags", [(b"authorization", b"Bearer " + secret)]),
        ("/api/version", []),
    ):
        scope = {
            "type": "http", "method": "GET", "path": path, "client": ("10.0.0.7", 5000),
            "headers": [(b"host", b"127.0.0.1"), *headers],
        }  # fmt: skip
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        await chain(scope, receive, send)
        assert sent[0]["status"] == 200
    keyed, open_route = seen
    if auth == "required":
        assert (keyed.key.name, keyed.principal) == ("inference", "inference")
    else:
        assert (keyed.key, keyed.principal) == (None, "10.0.0.7")
    assert (open_route.key, open_route.principal) == (None, "10.0.0.7")


def test_off_is_the_default_and_anything_else_is_refused() -> None:
    assert Settings.from_env({}).auth == "off"
    assert Settings.from_env({"OLLAMATRIO_AUTH": "Required"}).auth == "required"
    with pytest.raises(ValueError, match="OLLAMATRIO_AUTH"):
        Settings.from_env({"OLLAMATRIO_AUTH": "yes"})
