"""The DNS-rebinding guard as pure functions (``ollamatrio.http.host_guard``), with Ollama's
``allowedHostsMiddleware`` answers."""

from __future__ import annotations

import socket

import pytest

from ollamatrio.http.host_guard import allowed_host, is_loopback_bind


@pytest.mark.parametrize(
    ("host", "guarded"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("", False),
    ],
)
def test_the_guard_applies_to_loopback_binds(host: str, guarded: bool) -> None:
    assert is_loopback_bind(host) is guarded


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("127.0.0.1:11434", True),
        ("localhost:11434", True),
        ("LOCALHOST", True),
        ("[::1]:11434", True),
        ("10.0.0.7", True),  # private addresses
        ("192.168.1.5:8080", True),
        ("0.0.0.0:11434", True),
        ("", True),  # no Host: HTTP/1.0 clients
        ("ollama.localhost", True),
        ("box.local:11434", True),
        ("host.docker.internal", True),
        ("evil.example.com", False),
        ("evil.example.com:11434", False),
        ("8.8.8.8", False),
        ("localhost.evil.com", False),
    ],
)
def test_only_names_of_this_machine_pass(header: str, allowed: bool) -> None:
    assert allowed_host(header) is allowed


def test_the_machines_own_name_passes() -> None:
    assert allowed_host(socket.gethostname().upper() + ":11434")
