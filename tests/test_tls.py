"""HTTPS on the front door (``OLLAMATRIO_TLS_CERT``/``_KEY``, http/tls.py): the API over TLS
with a certificate authority the test makes, the hand-over to hypercorn kept over TLS, plain
HTTP and broken handshakes on the port refused without disturbing it, the command-line
client over ``https://``, and unusable files refused at start-up."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from ollamatrio.config import Settings
from ollamatrio.serve import StartupError, tls_context
from ollamatrio.testing.certificates import Certificates, make_certificates, openssl_available

pytestmark = pytest.mark.skipif(not openssl_available(), reason="needs the openssl command")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


def trusting(certificates: Certificates) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certificates.ca)


def tls_failure(error: BaseException | None) -> BaseException | None:
    while error is not None and not isinstance(error, ssl.SSLError):
        error = error.__cause__ or error.__context__
    return error


def tls_options(certificates: Certificates) -> dict[str, Any]:
    return {"tls_cert": certificates.cert, "tls_key": certificates.key}


async def tls_stream(url: str, ca: Path) -> trio.SSLStream[trio.SocketStream]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2", "http/1.1"])
    # https_compatible: the server closes without a close_notify, as HTTPS servers may.
    return await trio.open_ssl_over_tcp_stream(
        parts.hostname, parts.port, ssl_context=context, https_compatible=True
    )


async def read_answer(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def test_generate_and_a_streamed_chat_over_https(api_server, certificates) -> None:
    async with api_server(**tls_options(certificates)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        async with httpx.AsyncClient(base_url=server.url, verify=trusting(certificates)) as client:
            answer = await client.post(
                "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False}
            )
            assert answer.status_code == 200
            assert answer.json()["done"] is True
            lines = []
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
            async with client.stream("POST", "/api/chat", json=body) as streamed:
                assert streamed.status_code == 200
                async for line in streamed.aiter_lines():
                    if line:
                        lines.append(json.loads(line))
            assert len(lines) > 2
            assert lines[-1]["done"] is True
            assert "".join(line["message"]["content"] for line in lines)
        # A client that does not trust the authority is refused by its own verification.
        async with httpx.AsyncClient(base_url=server.url) as untrusting:
            with pytest.raises(httpx.ConnectError) as refused:
                await untrusting.get("/api/version")
            assert isinstance(tls_failure(refused.value), ssl.SSLCertVerificationError)


async def test_alpn_offers_http11_alone(api_server, certificates) -> None:
    async with api_server(**tls_options(certificates)) as server:
        stream = await tls_stream(server.url, certificates.ca)
        async with stream:
            await stream.do_handshake()
            assert stream.selected_alpn_protocol() == "http/1.1"
            await stream.send_all(
                b"GET /api/version HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
            )
            answer = await read_answer(stream)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"server:" not in answer.lower()  # the front door answered


async def test_a_handed_over_connection_stays_on_tls(api_server, certificates) -> None:
    """Pipelined requests go to hypercorn: it serves them over the same TLS stream."""
    async with api_server(**tls_options(certificates)) as server:
        stream = await tls_stream(server.url, certificates.ca)
        request = b"GET /api/version HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
        last = b"GET /api/version HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
        async with stream:
            await stream.send_all(request + last)
            answer = await read_answer(stream)
    assert answer.count(b"HTTP/1.1 200 ") == 2
    assert b"server: hypercorn-h11" in answer.lower()


async def test_plain_http_on_the_https_port_is_told_so(api_server, certificates) -> None:
    async with api_server(**tls_options(certificates)) as server:
        parts = urlsplit(server.url)
        plain = await trio.open_tcp_stream(parts.hostname, parts.port)  # type: ignore[arg-type]
        async with plain:
            await plain.send_all(b"GET /api/version HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            answer = await read_answer(plain)
        assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n")
        assert answer.endswith(b"Client sent an HTTP request to an HTTPS server.\n")
        # Garbage instead of a handshake, and a client that never speaks: closed, quietly.
        junk = await trio.open_tcp_stream(parts.hostname, parts.port)  # type: ignore[arg-type]
        async with junk:
            await junk.send_all(b"\x16\x03\x01\x00\x05hello")
            assert await read_answer(junk) == b""
        async with await trio.open_tcp_stream(parts.hostname, parts.port):  # type: ignore[arg-type]
            # The server goes on serving HTTPS meanwhile.
            async with httpx.AsyncClient(verify=trusting(certificates)) as client:
                answer = await client.get(f"{server.url}/api/version")
                assert answer.status_code == 200


async def test_the_command_line_client_trusts_ssl_cert_file(api_server, certificates) -> None:
    async with api_server(**tls_options(certificates)) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OLLAMA_HOST": server.url}
        for var in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
            env.pop(var, None)
        untrusted = await trio.run_process(
            [sys.executable, "-m", "ollamatrio", "list"], env=env, capture_stdout=True,
            capture_stderr=True, check=False,
        )  # fmt: skip
        assert untrusted.returncode == 1
        assert b"CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
        assert b"SSL_CERT_FILE" in untrusted.stderr
        env["SSL_CERT_FILE"] = str(certificates.ca)
        trusted = await trio.run_process(
            [sys.executable, "-m", "ollamatrio", "list"], env=env, capture_stdout=True,
            capture_stderr=True, check=False,
        )  # fmt: skip
        assert trusted.returncode == 0, trusted.stderr
        assert b"tiny" in trusted.stdout


async def test_a_stalled_body_is_answered_408_over_tls(api_server, certificates) -> None:
    async with api_server(body_timeout=0.5, **tls_options(certificates)) as server:
        stream = await tls_stream(server.url, certificates.ca)
        async with stream:
            await stream.send_all(
                b"POST /api/show HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 10\r\n\r\n{"
            )
            answer = await read_answer(stream)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")


def test_certificate_and_key_go_together() -> None:
    with pytest.raises(ValueError, match="OLLAMATRIO_TLS_CERT and OLLAMATRIO_TLS_KEY go together"):
        Settings.from_env({"OLLAMATRIO_TLS_CERT": "/x/cert.pem"})
    settings = Settings.from_env({"OLLAMATRIO_TLS_CERT": "a.pem", "OLLAMATRIO_TLS_KEY": "b.pem"})
    assert (settings.tls_cert, settings.tls_key) == (Path("a.pem"), Path("b.pem"))
    assert tls_context(Settings()) is None


def test_unusable_files_are_start_up_errors(tmp_path, certificates) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(StartupError, match=f"TLS: no such file: {missing}"):
        tls_context(Settings(tls_cert=missing, tls_key=certificates.key))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(StartupError, match="TLS: cannot use the certificate"):
        tls_context(Settings(tls_cert=not_pem, tls_key=certificates.key))
    with pytest.raises(StartupError, match="TLS: cannot use the certificate"):  # wrong key
        tls_context(
            Settings(tls_cert=certificates.cert, tls_key=certificates.cert.parent / "ca.key")
        )


def test_serve_says_so_and_exits(tmp_path) -> None:
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "OLLAMA_HOST": "127.0.0.1:0",
        "OLLAMA_MODELS": str(tmp_path / "models"), "OLLAMATRIO_TLS_CERT": str(tmp_path / "no.pem"),
        "OLLAMATRIO_TLS_KEY": str(tmp_path / "no.key"),
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "ollamatrio", "serve"], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"TLS: no such file: {tmp_path / 'no.pem'}" in done.stderr
    assert "Traceback" not in done.stderr
