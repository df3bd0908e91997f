"""The route table (api/table.py) is the one list of routes: what Quart registers, what the
streamed routes serve, what the front door limits and which dialect answers an error all
come from it."""

from __future__ import annotations

from typing import Any

import pytest

from ollamatrio.api import blob_upload
from ollamatrio.api.chain import allow_header
from ollamatrio.api.routes import PLANNERS
from ollamatrio.api.table import (
    JSON_STREAM_PATHS,
    ROUTES,
    Dialect,
    Way,
    dialect_of,
    route_for,
    views_of,
)


def test_every_streamed_json_route_has_a_handler() -> None:
    assert {*PLANNERS, "/api/pull", "/api/push"} == set(JSON_STREAM_PATHS)
    uploads = [r for r in ROUTES if r.way is Way.STREAM and r.path not in JSON_STREAM_PATHS]
    assert [r.path for r in uploads] == [blob_upload.ENDPOINT]


async def test_quart_registers_the_tables_views(api_server: Any) -> None:
    async with api_server() as srv:
        app = srv.app
    registered = {
        (rule.rule, method)
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        for method in rule.methods or ()
        if method not in ("OPTIONS", "HEAD") or method in _declared(rule.rule)
    }
    expected = {(r.path, method) for r in ROUTES if r.way is not Way.EVENTS for method in r.methods}
    assert registered == expected


def _declared(path: str) -> set[str]:
    return {m for r in ROUTES if r.path == path for m in r.methods}


def test_a_view_the_table_does_not_list_is_refused() -> None:
    from quart_trio import QuartTrio

    from ollamatrio.api.app import register_views

    async def view() -> None: ...

    with pytest.raises(RuntimeError, match="/api/secret"):
        register_views(QuartTrio("t"), views_of(("GET", "/api/secret", view)))


@pytest.mark.parametrize(
    ("method", "path", "found"),
    [
        ("POST", "/api/chat", "/api/chat"),
        ("GET", "/api/chat", None),
        ("HEAD", "/api/ps", "/api/ps"),  # a GET route answers HEAD, as Werkzeug routes it
        ("GET", "/v1/models/library/llama3:8b", "/v1/models/<path:model>"),
        ("DELETE", "/v1/responses/resp_1", "/v1/responses/<response_id>"),
        ("GET", "/v1/responses/resp_1/input_items", "/v1/responses/<response_id>/input_items"),
        ("POST", "/api/blobs/sha256:00", "/api/blobs/<digest>"),
        ("POST", "/api/blobs/a/b", None),  # a digest is one segment
        ("GET", "/nowhere", None),
    ],
)
def test_route_for(method: str, path: str, found: str | None) -> None:
    route = route_for(method, path)
    assert (route.path if route else None) == found


def test_dialects() -> None:
    assert dialect_of("/api/chat") is Dialect.NATIVE
    assert dialect_of("/v1/chat/completions") is Dialect.OPENAI
    assert dialect_of("/v1/messages/count_tokens") is Dialect.ANTHROPIC
    assert dialect_of("/v1/responses/resp_1") is Dialect.RESPONSES
    assert dialect_of("/v1/unknown") is Dialect.OPENAI


def test_allow_lists_the_methods_in_gins_order() -> None:
    assert allow_header("/") == "HEAD, GET"
    assert allow_header("/api/blobs/sha256:00") == "HEAD, POST"
    assert allow_header("/v1/responses/r") == "HEAD, GET, DELETE"
    assert allow_header("/nowhere") == ""
