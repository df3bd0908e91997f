"""The console's files (``GET /ui``, console/assets.py): served from the package with their
types, a validator and a strict Content-Security-Policy, before the API app is built, to
anyone (the page asks for a key itself), and by a fleet's gateway too."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import trio
from test_lazy_app import lazy_server

from ollamatrio.config import Settings
from ollamatrio.console.assets import CSP, STATIC
from ollamatrio.fleet.gateway import RunningGateway, serve_gateway


def closed_port() -> int:
    """A port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


if TYPE_CHECKING:
    from conftest import ServerFactory


async def test_the_page_and_its_files_come_with_their_types_and_policy(
    api_server: ServerFactory,
) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            page = await c.get("/ui")
            script = await c.get("/ui/app.js")
            style = await c.get("/ui/console.css")
            slash = await c.get("/ui/")
            head = await c.head("/ui")
            missing = await c.get("/ui/nothing.js")
            escape = await c.get("/ui/../pyproject.toml")
            root = await c.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == CSP
    assert "script-src 'self';" in CSP
    assert "unsafe" not in CSP
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["cache-control"] == "no-cache"
    assert page.content == (STATIC / "index.html").read_bytes()
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    assert style.headers["content-type"] == "text/css; charset=utf-8"
    assert slash.content == page.content
    assert head.status_code == 200
    assert head.content == b""
    assert int(head.headers["content-length"]) == len(page.content)
    assert missing.status_code == 404
    assert escape.status_code == 404
    assert root.text == "Ollama is running"  # clients still find the server at /


async def test_a_browser_holding_the_file_is_answered_304(api_server: ServerFactory) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            first = await c.get("/ui/app.js")
            again = await c.get("/ui/app.js", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["etag"] == first.headers["etag"]


def test_the_page_has_no_inline_script_or_style() -> None:
    """The policy allows only the package's own files: anything inline would be blocked."""
    for path in STATIC.glob("*.html"):
        html = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), path
        assert "<style" not in html, path
        assert " style=" not in html, path
        assert not re.search(r"\son[a-z]+=", html), path  # no inline handlers


def test_every_file_the_page_names_is_shipped() -> None:
    named = set()
    for path in STATIC.iterdir():
        text = path.read_text()
        named |= set(re.findall(r"""["'](?:/ui/|\./)([\w.-]+\.(?:js|css))["']""", text))
    assert named
    assert named <= {p.name for p in STATIC.iterdir()}


async def test_the_console_is_served_before_the_app_is_built(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with lazy_server(tmp_path) as (url, app), httpx.AsyncClient(base_url=url) as c:
            page = await c.get("/ui")
            assert page.status_code == 200
            assert not app.built


async def test_with_keys_required_the_page_is_open_and_the_api_is_not(
    api_server: ServerFactory, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        async with (
            api_server(auth="required", data_dir=tmp_path / "state") as srv,
            httpx.AsyncClient(base_url=srv.url) as c,
        ):
            page = await c.get("/ui")
            script = await c.get("/ui/api.js")
            ps = await c.get("/api/ps")
    assert page.status_code == 200
    assert script.status_code == 200
    assert ps.status_code == 401


async def test_ps_says_each_devices_size_and_reserve(api_server: ServerFactory) -> None:
    """The console's device bars: /api/ps's ``devices``, each GPU then the host's RAM."""
    gpu = {"id": "sim0", "library": "CUDA", "total": 2 << 30, "compute": "8.6"}
    system = {"total": 8 << 30, "cpu_count": 2}
    with trio.fail_after(30):
        async with (
            api_server(gpus=[gpu], system=system, gpu_overhead=1 << 20) as srv,
            httpx.AsyncClient(base_url=srv.url) as c,
        ):
            devices = (await c.get("/api/ps")).json()["devices"]
    assert [d["device"] for d in devices] == ["sim0", "host"]
    assert devices[0]["total"] == 2 << 30
    assert devices[0]["reserve"] > 1 << 20  # the overhead asked for, and a context's
    assert devices[1] == {"device": "host", "name": "host RAM", "total": 8 << 30, "reserve": 0}


async def test_a_fleets_gateway_serves_the_console_itself(tmp_path: Path) -> None:
    """No host is up (nothing listens at its address), and the page still comes: it is the
    gateway's own, as its /api/ps is."""
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            running: RunningGateway = await nursery.start(
                lambda task_status: serve_gateway(
                    [f"http://127.0.0.1:{closed_port()}"], settings,
                    shutdown_trigger=stop.wait, task_status=task_status,
                )
            )  # fmt: skip
            async with httpx.AsyncClient(base_url=running.url) as c:
                page = await c.get("/ui")
                script = await c.get("/ui/app.js")
                missing = await c.get("/ui/nothing.js")
                forwarded = await c.get("/api/tags")  # no host to take it
            stop.set()
    assert forwarded.status_code == 503
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == CSP
    assert page.content == (STATIC / "index.html").read_bytes()
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    assert missing.status_code == 404
