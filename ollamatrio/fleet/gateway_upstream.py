"""HTTP/1.1 from the gateway to one host: the project's client (``http1/client.py``) over
TCP, with a keep-alive pool sized for a host.

The hosts are ollamatrio servers (their front door keeps a connection alive for 30 s between
requests, ``serve.hypercorn_config``), so a pooled connection is trusted for a little less.
A response that is abandoned half-way (the client left) closes its connection: that is how
the host learns that its client went away and frees the generation's slot.  Bodies are
handed on without being parsed (:class:`~ollamatrio.http1.client.BodyReader` only tracks
where they end).
"""

from __future__ import annotations

from functools import partial
from typing import Final

import trio

from ..errors import PeerConnectionError
from ..http.fleet_secret import header_line
from ..http1.client import Connection, Pool
from ..http1.framing import ResponseHead

MAX_IDLE: Final = 32  # pooled connections per host
IDLE_LIMIT: Final = 25.0  # seconds: a little under the host's keep-alive timeout (30 s)

#: The client's connection errors, as the gateway names them: the host could not be
#: reached, or its connection failed or closed mid-response.
HostConnectionError = PeerConnectionError


class HostPool(Pool):
    """Connections to one host (``address``: host and port), the idle ones kept; every
    request sent carries the fleet secret, when the fleet has one (``fleet_secret``)."""

    def __init__(self, address: tuple[str, int], fleet_secret: str = "") -> None:
        self.address = address
        self.authority = f"{address[0]}:{address[1]}".encode()
        self._secret_line = header_line(fleet_secret) if fleet_secret else b""
        super().__init__(
            partial(trio.open_tcp_stream, *address), peer="the host", max_idle=MAX_IDLE,
            idle_limit=IDLE_LIMIT, where=self.authority.decode(),
        )  # fmt: skip

    def signed(self, message: bytes) -> bytes:
        """``message`` (a request head, its body perhaps after it) with the fleet secret's
        header after its request line."""
        if not self._secret_line:
            return message
        end = message.index(b"\r\n") + 2
        return message[:end] + self._secret_line + message[end:]

    async def send(self, message: bytes) -> tuple[Connection, ResponseHead]:
        return await super().send(self.signed(message))

    async def get(self, path: str) -> tuple[int, bytes]:
        """A plain ``GET``: (status, body)."""
        message = b"GET %b HTTP/1.1\r\nhost: %b\r\n\r\n" % (path.encode(), self.authority)
        head, body = await self.request(message)
        return head.status, body
