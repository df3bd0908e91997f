"""A small synchronous HTTP client for the server's native API, used by the commands.

Errors come back as :class:`CLIError` carrying the text the user sees after ``Error:``;
the server's own ``{"error": ...}`` message is passed through unchanged, as Ollama does.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import ssl
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx

from .errors import CLIError as CLIError
from .errors import ServerError as ServerError

# Generation can take as long as the model needs; only connecting is bounded.
_TIMEOUT = httpx.Timeout(None, connect=10.0)


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _trusted() -> ssl.SSLContext | bool:
    """The authorities an ``https://`` OLLAMA_HOST is verified against: ``SSL_CERT_FILE``
    (or ``SSL_CERT_DIR``) when set, as Go's clients (the ``ollama`` command) read them even
    for a server on this machine (httpx reads them only with ``trust_env``, which loopback
    addresses turn off); else the system's."""
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if not (cafile or capath):
        return True
    try:
        if cafile:
            return ssl.create_default_context(cafile=cafile)
        return ssl.create_default_context(capath=capath)
    except (OSError, ssl.SSLError) as exc:
        name = "SSL_CERT_FILE" if cafile else "SSL_CERT_DIR"
        raise CLIError(f"{name}={cafile or capath}: cannot use it: {exc}") from None


def _tls_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure behind a transport error, if that is what it is."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain is short (httpx over httpcore over ssl)
        if seen is None or isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class Client:
    """The server's ``/api`` endpoints over one connection pool."""

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        # Sent on every request when the server asks for keys (OLLAMATRIO_AUTH=required).
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = self._new_pool()

    def _new_pool(self) -> httpx.Client:
        # Like Go's ProxyFromEnvironment, never send loopback traffic through a proxy.
        return httpx.Client(
            base_url=self.base_url, timeout=_TIMEOUT, trust_env=not _is_loopback(self.base_url),
            headers=self._headers,
            verify=_trusted(),
        )  # fmt: skip

    def reset(self) -> None:
        """Drop every connection (after Ctrl-C interrupted a read mid-way)."""
        self._http.close()
        self._http = self._new_pool()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unreachable(self) -> CLIError:
        return CLIError(f"could not connect to ollamatrio server, is it running? ({self.base_url})")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content: bytes | Iterable[bytes] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One request, raising :class:`ServerError` for any 4xx/5xx answer."""
        try:
            response = self._http.request(method, path, json=body, content=content, headers=headers)
        except httpx.TransportError as exc:
            raise self._error_for(exc) from exc
        if response.is_error:
            raise _server_error(response)
        return response

    def json(self, method: str, path: str, body: Any = None) -> Any:
        response = self.request(method, path, body)
        return response.json() if response.content else None

    @contextmanager
    def stream(self, path: str, body: Any) -> Iterator[Iterator[dict[str, Any]]]:
        """POST ``body`` and iterate over the NDJSON objects of the answer.

        Leaving the block closes the connection, which cancels the work on the server
        (how Ctrl-C stops a generation)."""
        try:
            with self._http.stream("POST", path, json=body) as response:
                if response.is_error:
                    response.read()
                    raise _server_error(response)
                yield _ndjson(response)
        except httpx.TransportError as exc:
            raise self._error_for(exc) from exc

    @contextmanager
    def events(self, model: str) -> Iterator[EventStream | None]:
        """Subscribe to ``GET /api/events?model=``: the scheduler's events for ``model``.

        Yields None where the server has no such stream (Ollama answers 404) or cannot be
        asked; the caller then does without.  Once a stream is yielded the subscription
        exists (the server subscribes before it answers), so events of work started now
        are not missed.  A pool of its own: :meth:`EventStream.interrupt` shuts the
        connection down, which must never reach a connection the pool could reuse."""
        http = self._new_pool()
        response = None
        try:
            with contextlib.suppress(httpx.HTTPError):
                request = http.build_request("GET", "/api/events", params={"model": model})
                response = http.send(request, stream=True)
            sse = (
                response is not None
                and not response.is_error
                and response.headers.get("content-type", "").startswith("text/event-stream")
            )
            yield EventStream(response) if sse and response is not None else None
        finally:
            if response is not None:
                response.close()
            http.close()

    def _error_for(self, exc: httpx.TransportError) -> CLIError:
        if (tls := _tls_error(exc)) is not None:
            return CLIError(f"TLS with {self.base_url} failed: {tls} (SSL_CERT_FILE names the "
                            "certificate authority to trust)")  # fmt: skip
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return self._unreachable()
        return CLIError(f"lost the connection to the server: {exc}")


class EventStream:
    """An open ``/api/events`` answer: one thread iterates, another may interrupt."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Each event's ``data`` object, until the stream ends or is interrupted."""
        data: list[str] = []
        try:
            for line in self._response.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif not line and data:  # a blank line ends an event
                    event = json.loads("\n".join(data))
                    data.clear()
                    if isinstance(event, dict):
                        yield event
        except (httpx.HTTPError, httpx.StreamError, OSError, ValueError):
            # Interrupted, cut off or garbled: the events only ever decorate other work,
            # which reports its own errors, so they simply stop.
            return

    def interrupt(self) -> None:
        """End the iteration in the other thread: shut the socket down, which wakes a
        blocked read (closing it would not, on Linux)."""
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # already closed by the server
                sock.shutdown(socket.SHUT_RDWR)


def _ndjson(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CLIError(f"unexpected server response: {line[:200]!r}") from exc
        if isinstance(obj, dict) and obj.get("error"):
            raise ServerError(str(obj["error"]), 0)
        yield obj


def _server_error(response: httpx.Response) -> ServerError:
    message = ""
    try:
        body = response.json()
        if isinstance(body, dict):
            message = str(body.get("error") or "")
    except (json.JSONDecodeError, UnicodeDecodeError):
        message = response.text.strip()
    if not message:
        message = f"{response.status_code} {response.reason_phrase}".strip()
    return ServerError(message, response.status_code)
