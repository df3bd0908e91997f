"""A registry's token handshake: its ``401`` with ``WWW-Authenticate: Bearer realm=...``.

The Docker/OCI token flow, as an ``httpx.Auth`` on the registry client
(:func:`.registry.open_registry_client`), so pulls and pushes share it.  A 401 that carries
a Bearer challenge fetches a token from the realm (``GET realm?service=...&scope=...``) and
sends the request again once with ``Authorization: Bearer <token>``; the token is kept for
the host's next requests.  The realm must be on the registry's own host, as Ollama requires,
so no token is asked from, or sent to, another site.

A 401 without a Bearer challenge (a registry that wants credentials this client does not
have) or a second 401 stands as the answer, for the caller to report.  A realm elsewhere,
or one that refuses, fails the request with :class:`RegistryAuthError`.  Ollama's own
registry signs the token request with the user's Ollama key; that signature is not made
here, so pushing to ollama.com is refused by it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncGenerator, Generator

import httpx

from ..errors import OllamatrioError

log = logging.getLogger("ollamatrio.store.registry_auth")

_PARAM_RE = re.compile(r'(\w+)="([^"]*)"')


class RegistryAuthError(OllamatrioError):
    """The registry's token handshake failed; the message says where and why."""


def parse_challenge(header: str) -> dict[str, str] | None:
    """The parameters of a ``Bearer`` challenge (``realm``, ``service``, ``scope``), or
    None when the header asks for another scheme (``Basic``) or names no realm."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    params = dict(_PARAM_RE.findall(rest))
    return params if params.get("realm") else None


class RegistryAuth(httpx.Auth):
    """Answers a registry's Bearer challenge once per request, keeping tokens per host.

    Request bodies are sent again after the token arrives, so an upload's chunk must be
    an iterable that starts over when iterated again (not a generator)."""

    def __init__(self) -> None:
        self._tokens: dict[str, str] = {}

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response]:
        raise RuntimeError("RegistryAuth is for httpx.AsyncClient")

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        host = request.url.netloc.decode()
        token = self._tokens.get(host)
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code != 401:
            return
        challenge = parse_challenge(response.headers.get("www-authenticate", ""))
        if challenge is None:
            return  # no way to answer it: the 401 is the caller's to report
        realm = request.url.join(challenge["realm"])
        if realm.netloc.decode() != host:
            raise RegistryAuthError(
                f"registry authorization: realm host {realm.netloc.decode()!r} does not "
                f"match the registry's {host!r}"
            )
        params: dict[str, str | list[str]] = {}
        if challenge.get("service"):
            params["service"] = challenge["service"]
        if challenge.get("scope"):
            params["scope"] = challenge["scope"].split(" ")
        token_response = yield httpx.Request(
            "GET", realm.copy_merge_params(params), headers={"User-Agent": _agent(request)}
        )
        # Read whole (httpx reads it again before the next request): the realm is on the
        # registry's own host, and its answer is a few hundred bytes.
        body = await token_response.aread()
        if token_response.status_code >= 400:
            text = body.decode(errors="replace").strip()[:512]
            raise RegistryAuthError(
                f"registry authorization: {token_response.status_code}: {text}".rstrip(": ")
            )
        self._tokens[host] = _token_of(body)
        log.info("got a token from %s for %s", realm.host, challenge.get("scope", "the registry"))
        request.headers["Authorization"] = f"Bearer {self._tokens[host]}"
        yield request


def _agent(request: httpx.Request) -> str:
    return str(request.headers.get("User-Agent", "ollamatrio"))


def _token_of(body: bytes) -> str:
    """``token`` (Docker's name) or ``access_token`` (OAuth2's) of the realm's answer."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        for key in ("token", "access_token"):
            token = answer.get(key)
            if isinstance(token, str) and token:
                return token
    raise RegistryAuthError("registry authorization: the realm's answer holds no token")
