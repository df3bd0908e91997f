"""HTTPS on the front door's one listener (``OLLAMATRIO_TLS_CERT`` / ``OLLAMATRIO_TLS_KEY``).

Each accepted connection is wrapped in a server-side :class:`trio.SSLStream` and its
handshake done in the connection's own task (:func:`handshake`), bounded by
:data:`HANDSHAKE_TIMEOUT`: the accept loop never waits on a client.  A connection whose
handshake fails is closed with one debug line; a client that speaks plain HTTP to the port
is answered as Go's server answers it (400, "Client sent an HTTP request to an HTTPS
server."), so ``curl http://…`` says what is wrong instead of "empty reply".

ALPN offers ``http/1.1`` alone: the front door and the hypercorn connections it hands over
(``http/front.py``) speak HTTP/1.1 only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
from pathlib import Path
from typing import Final

import trio

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT: Final = 10.0  # seconds from accept to a finished TLS handshake
ALPN: Final = ["http/1.1"]
_TLS_HANDSHAKE_RECORD: Final = 0x16  # the first byte of every TLS ClientHello
_PLAIN_HTTP_ANSWER: Final = (
    b"HTTP/1.0 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
)


class TLSConfigError(Exception):
    """The certificate or key cannot be used; the message names the file and why."""


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for HTTPS from PEM files: the certificate (its chain after it) and
    its private key.

    Raises:
        TLSConfigError: a file is missing, unreadable, not PEM, or the key does not match.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.set_alpn_protocols(ALPN)
    for path in (cert, key):  # load_cert_chain's own errors do not say which file
        try:
            path.open("rb").close()
        except FileNotFoundError:
            raise TLSConfigError(f"TLS: no such file: {path}") from None
        except OSError as exc:
            raise TLSConfigError(f"TLS: cannot read {path}: {exc.strerror or exc}") from None
    try:
        context.load_cert_chain(certfile=cert, keyfile=key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(
            f"TLS: cannot use the certificate {cert} with the key {key}: "
            f"{getattr(exc, 'reason', None) or exc}"
        ) from None
    return context


async def handshake(
    stream: trio.SocketStream, context: ssl.SSLContext
) -> trio.SSLStream[trio.SocketStream] | None:
    """``stream`` with its TLS handshake done, or None: the client sent plain HTTP (answered
    400), failed the handshake or took longer than :data:`HANDSHAKE_TIMEOUT`; the caller
    closes it then."""
    # https_compatible: no close_notify exchange, and a client that closes without one is
    # an end of stream, as HTTP clients and servers treat it.
    secure = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
    with trio.move_on_after(HANDSHAKE_TIMEOUT):
        try:
            if await _plain_http(stream):
                return None
            await secure.do_handshake()
            return secure
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("TLS handshake failed: %s", exc.__cause__ or exc, extra=_client(stream))
            return None
    log.debug("TLS handshake took over %gs: closed", HANDSHAKE_TIMEOUT, extra=_client(stream))
    return None


async def _plain_http(stream: trio.SocketStream) -> bool:
    """Whether the client's first byte says plain HTTP (it is read without being taken);
    if so it is answered 400 in plain HTTP, as Go's server does."""
    first = await stream.socket.recv(1, socket.MSG_PEEK)
    if not first or first[0] == _TLS_HANDSHAKE_RECORD or not first.isalpha():
        return False  # a TLS client, or something the handshake will refuse
    log.debug("plain HTTP on the HTTPS port: answered 400", extra=_client(stream))
    with contextlib.suppress(OSError):
        fd = stream.socket.fileno()
        os.write(fd, _PLAIN_HTTP_ANSWER)  # a fresh socket's buffer takes it
        stream.socket.shutdown(socket.SHUT_WR)
        # The request read (not waited for), so that closing does not reset the connection
        # before the client has read the answer.
        os.read(fd, 65536)
    return True


def _client(stream: trio.SocketStream) -> dict[str, str]:
    try:
        return {"client": str(stream.socket.getpeername()[0])}
    except OSError:
        return {"client": ""}
