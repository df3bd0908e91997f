"""CORS decisions as pure functions (``ollamatrio.http.cors``), checked against what
gin-contrib/cors v1.7.2 does with Ollama's configuration."""

from __future__ import annotations

import pytest

from ollamatrio.config import parse_origins
from ollamatrio.http.cors import (
    ALLOW_HEADERS,
    CorsAnswer,
    OriginPolicy,
    canonical_header_key,
    cors_answer,
    origin_allowed,
)

DEFAULT = OriginPolicy.from_origins(parse_origins(""))


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost", True),
        ("https://127.0.0.1:8080", True),
        ("http://0.0.0.0:3000", True),
        ("app://anything", True),
        ("vscode-webview://abc", True),
        ("tauri://localhost", True),
        ("http://localhost.evil.com", False),  # "http://localhost:*" needs the colon
        ("http://example.com", False),
        ("null", False),
        ("", False),
    ],
)
def test_default_origins(origin: str, allowed: bool) -> None:
    assert origin_allowed(origin, DEFAULT) is allowed


def test_ollama_origins_entries() -> None:
    policy = OriginPolicy.from_origins(
        parse_origins("https://App.Example.com, https://*.corp.example,chrome-extension://*")
    )
    assert origin_allowed("https://app.example.com", policy)  # entries are lower-cased
    assert origin_allowed("https://a.b.corp.example", policy)
    assert not origin_allowed("https://corp.example", policy)
    assert origin_allowed("chrome-extension://abcdef", policy)
    assert not origin_allowed("https://app.example.com.evil", policy)
    # Only "*" is special: no glob classes or "?" as fnmatch would have them.
    odd = OriginPolicy.from_origins(["https://a?.example", "https://[ab].example"])
    assert origin_allowed("https://a?.example", odd)
    assert not origin_allowed("https://ab.example", odd)
    assert not origin_allowed("https://a.example", odd)
    assert origin_allowed("https://anything", OriginPolicy.from_origins(parse_origins("*")))


def test_cors_answers() -> None:
    host = "127.0.0.1:11434"
    assert cors_answer(None, host, "GET", DEFAULT) == CorsAnswer(None, [])
    # fetch() sends the page's own origin: not a CORS request, whatever the policy.
    assert cors_answer(f"http://{host}", host, "GET", DEFAULT) == CorsAnswer(None, [])
    assert cors_answer("https://evil.example", host, "OPTIONS", DEFAULT) == CorsAnswer(403, [])
    assert cors_answer("https://evil.example", host, "GET", DEFAULT) == CorsAnswer(403, [])
    plain = cors_answer("http://localhost:3000", host, "POST", DEFAULT)
    assert plain == CorsAnswer(
        None, [("Vary", "Origin"), ("Access-Control-Allow-Origin", "http://localhost:3000")]
    )
    preflight = cors_answer("http://localhost:3000", host, "OPTIONS", DEFAULT)
    assert preflight.status == 204
    assert dict(preflight.headers)["Access-Control-Allow-Headers"] == ALLOW_HEADERS
    assert [v for k, v in preflight.headers if k == "Vary"] == [
        "Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers"
    ]  # fmt: skip


def test_canonical_header_key() -> None:
    assert canonical_header_key("x-stainless-lang") == "X-Stainless-Lang"
    assert canonical_header_key("OpenAI-Beta") == "Openai-Beta"
    assert canonical_header_key("content-TYPE") == "Content-Type"
