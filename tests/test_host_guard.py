"""The DNS-rebinding guard as pure functions (``ollamatrio.http.host_guard``), with Ollama's
``allowedHostsMiddleware`` answers (Go's ``netip.Addr`` loopback, private and unspecified
sets, not Python's broader ``is_private``), and the head check every route shares."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from ollamatrio.http import host_guard
from ollamatrio.http.host_guard import (
    MALFORMED_HOST,
    TOO_MANY_HOSTS,
    TOO_MANY_ORIGINS,
    allowed_host,
    head_problem,
    is_loopback_bind,
    valid_host,
)


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
        # Go's IsPrivate: 10/8, 172.16/12, 192.168/16, fc00::/7, and nothing else.
        ("172.16.0.1", True),
        ("172.31.255.255:80", True),
        ("172.32.0.1", False),
        ("[fd12::1]:11434", True),
        ("[fc00::1]", True),
        ("169.254.169.254", False),  # link-local: the cloud metadata address
        ("192.0.2.1", False),  # documentation (TEST-NET-1)
        ("198.18.0.1", False),  # benchmarking
        ("100.64.0.1", False),  # shared address space
        ("0.0.0.1", False),  # "this network", but not unspecified
        ("[2001:db8::1]", False),  # documentation
        ("[fe80::1]:11434", False),  # link-local
        ("[::ffff:10.0.0.1]", True),  # IPv4-mapped: read as the IPv4 address
        ("[::ffff:127.0.0.1]:11434", True),
        ("[::ffff:192.0.2.1]", False),
        ("[::]", True),
        ("127.255.255.254", True),
    ],
)
def test_only_names_of_this_machine_pass(header: str, allowed: bool) -> None:
    assert allowed_host(header) is allowed


def test_the_machines_own_addresses_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ollama's isLocalIP: an address of one of this machine's interfaces (zone aside)."""
    own = [
        SimpleNamespace(family=socket.AF_INET, address="203.0.113.7"),
        SimpleNamespace(family=socket.AF_INET6, address="2001:db8::7%eth0"),
        SimpleNamespace(family=socket.AF_PACKET, address="52:54:00:12:34:56"),
    ]
    monkeypatch.setattr(host_guard.psutil, "net_if_addrs", lambda: {"eth0": own})
    assert allowed_host("203.0.113.7:11434")
    assert allowed_host("[2001:db8::7]:11434")
    assert not allowed_host("203.0.113.8")


def test_the_machines_own_name_passes() -> None:
    assert allowed_host(socket.gethostname().upper() + ":11434")


@pytest.mark.parametrize(
    ("header", "valid"),
    [
        ("", True),
        ("localhost", True),
        ("localhost:11434", True),
        ("localhost:", True),  # RFC 3986: the port may be empty
        ("localhost.", True),  # a fully qualified name
        ("127.0.0.1:11434", True),
        ("[::1]:11434", True),
        ("[fe80::1%25eth0]", True),
        ("::1", True),  # bare, as Ollama's guard reads it
        ("host.docker.internal", True),
        ("my_box", True),  # Go takes "_" (the guard then decides)
        ("a" * 63 + ".localhost", True),
        (".".join(["a" * 63] * 3) + "." + "a" * 61, True),  # 253 bytes
        ("a..localhost", False),
        ("127..0.1", False),
        (".", False),
        ("..", False),
        (".localhost", False),
        ("a" * 64, False),
        ("a" * 64 + ".localhost", False),
        (".".join(["a" * 63] * 4), False),  # 255 bytes
        ("localhost:abc", False),
        ("localhost:123456", False),
        ("[::1", False),
        ("[::1]x", False),
        ("[::1]:x", False),
        ("[127.0.0.1]", False),
        ("[nothing]", False),
        ("a]b", False),
        ("ho st", False),
        ("local/host", False),
        ("user@localhost", False),
        ("h\u00e9.localhost", False),
        ("localhost\x00", False),
    ],
)
def test_a_host_header_parses_as_a_host_name(header: str, valid: bool) -> None:
    assert valid_host(header) is valid


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ([(b"host", b"localhost")], None),
        ([], None),
        ([(b"host", b"a"), (b"origin", b"http://a"), (b"x", b"y")], None),
        ([(b"host", b"a"), (b"host", b"a")], TOO_MANY_HOSTS),
        ([(b"host", b"evil.com"), (b"host", b"127.0.0.1")], TOO_MANY_HOSTS),
        ([(b"host", b"a"), (b"origin", b"http://a"), (b"origin", b"http://a")], TOO_MANY_ORIGINS),
        ([(b"host", b"a..b")], MALFORMED_HOST),
        ([(b"host", "h\u00e9".encode())], MALFORMED_HOST),
    ],
)
def test_the_head_check(headers: list[tuple[bytes, bytes]], problem: str | None) -> None:
    assert head_problem(headers) == problem
