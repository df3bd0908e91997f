"""A small Ollama registry for tests and demos: manifests and blobs over HTTP/1.1.

It speaks the part of the OCI distribution protocol a pull uses (``GET``/``HEAD``
``/v2/<namespace>/<model>/manifests/<tag>`` and ``/v2/<namespace>/<model>/blobs/<digest>``,
with ``Range``), serves models added from memory or an Ollama models directory, and injects
the failures a real network has: a connection dropped after N bytes, a corrupt blob, a
stall, slow chunks, a redirect to another host (as registries redirect to a CDN).  It
counts requests and body bytes per blob, so tests can check what a resume fetched.

It takes pushes as Docker's registry (distribution) does: ``POST .../blobs/uploads/`` opens
an upload (202, ``Location``), ``PATCH`` appends a chunk (``Content-Range: <start>-<end>``,
which must start where the upload stands, else 416), ``GET`` on the upload says how far it
is (204, ``Range: 0-<last byte>``), ``PUT ...?digest=`` completes it (201, the digest
checked), and ``PUT .../manifests/<tag>`` publishes a manifest whose blobs it has.  A chunk
whose connection drops keeps the bytes that arrived, as distribution's do.  With ``token``
set, every ``/v2/`` request needs ``Authorization: Bearer <token>``; the 401 names a realm
on this server that hands the token out (the Docker token handshake), or none at all when
``token_realm`` is false (a registry the client has no way to satisfy).

::

    registry = FakeRegistry()
    name = registry.add_model("library/tiny:latest", layers=[(MEDIA_MODEL, gguf_path)])
    host = await nursery.start(registry.serve)          # "127.0.0.1:<port>", port 0
    async with pull_progress(store, f"{host}/library/tiny", insecure=True) as events: ...

``python -m ollamatrio.testing.fake_registry MODELS_DIR`` serves a models directory.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs

import h11
import trio

from ..store.manifest import CONFIG_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, Layer, Manifest, StoreError

_PATH_RE = re.compile(r"/v2/(?P<repo>[^/]+/[^/]+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)")
_UPLOAD_RE = re.compile(r"/v2/(?P<repo>[^/]+/[^/]+)/blobs/uploads/(?P<id>[^/]*)")
_CONTENT_RANGE_RE = re.compile(r"(\d+)-(\d+)")
_TOKEN_PATH = "/token"
_DIRECT_RE = re.compile(r"/direct/(?P<ref>sha256:[0-9a-f]{64})")
_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)")
_CHUNK = 64 << 10

BlobSource = bytes | Path


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    range: str | None
    status: int


@dataclass
class Stall:
    """Send ``after`` body bytes, then go quiet for ``seconds`` and drop the connection;
    ``began`` is set when the quiet starts."""

    after: int
    seconds: float
    began: trio.Event = field(default_factory=trio.Event, compare=False)


@dataclass
class FakeRegistry:
    """Serves manifests (by ``namespace/model:tag``) and blobs (by digest).

    Failure injection (each list entry applies to one GET of that blob, in order):
    ``drop_after[digest]`` byte counts after which the connection is closed;
    ``status_faults[digest or "namespace/model:tag"]`` error statuses answered to GETs
    instead of the content;
    ``stalls[digest]`` :class:`Stall` entries; ``corrupt`` digests served with one byte
    flipped; ``chunk_delay`` seconds before every body chunk; ``redirect_to_host`` makes
    blob requests answer 307 to ``/direct/<digest>`` on that host name (e.g. "localhost",
    another name for this server, like a CDN), and ``ignore_range`` answers 200 with the
    whole blob whatever the ``Range``.

    Pushes: ``push_faults[method]`` error statuses answered, in order, to that method's
    push requests (``HEAD`` of a blob, ``POST``/``PATCH``/``GET``/``PUT`` of uploads, ``PUT`` of
    a manifest); ``upload_drops`` sizes of an upload at which the ``PATCH`` that reaches them
    has its connection closed (each used once, in order; the bytes before it kept);
    ``upload_stall`` a :class:`Stall` whose ``after`` is such a size, where the ``PATCH`` goes
    quiet; ``uploads`` the open uploads' bytes and ``bytes_received`` every chunk byte that
    arrived.  (``push_faults["MANIFEST"]`` is the manifest's ``PUT``,
    ``push_faults["PUT"]`` an upload's.)
    """

    host: str = "127.0.0.1"
    manifests: dict[str, bytes] = field(default_factory=dict)
    blobs: dict[str, BlobSource] = field(default_factory=dict)
    drop_after: dict[str, list[int]] = field(default_factory=dict)
    stalls: dict[str, list[Stall]] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    status_faults: dict[str, list[int]] = field(default_factory=dict)
    chunk_delay: float = 0.0
    redirect_to_host: str | None = None
    ignore_range: bool = False
    push_faults: dict[str, list[int]] = field(default_factory=dict)
    upload_drops: list[int] = field(default_factory=list)
    upload_stall: Stall | None = None
    token: str | None = None
    token_realm: bool = True
    uploads: dict[str, bytearray] = field(default_factory=dict)
    bytes_received: int = 0
    requests: list[RequestRecord] = field(default_factory=list)
    bytes_served: Counter[str] = field(default_factory=Counter)
    active_streams: int = 0  # blob bodies being sent right now...
    peak_streams: int = 0  # ...and the most at any one time
    port: int = 0
    _streams_changed: trio.Event = field(default_factory=trio.Event, repr=False)

    # -- content ---------------------------------------------------------------------------

    def add_blob(self, source: BlobSource) -> Layer:
        """Serve ``source`` (bytes or a file); returns a layer (media type left empty)."""
        if isinstance(source, Path):
            digest, size = _hash_file(source), source.stat().st_size
        else:
            digest, size = "sha256:" + hashlib.sha256(source).hexdigest(), len(source)
        self.blobs[digest] = source
        return Layer(media_type="", digest=digest, size=size)

    def add_model(
        self,
        name: str,
        layers: Sequence[tuple[str, BlobSource]],
        *,
        config: bytes | None = None,
    ) -> Manifest:
        """Publish ``namespace/model:tag`` made of ``(media type, content)`` layers."""
        built = []
        for media_type, source in layers:
            layer = self.add_blob(source)
            built.append(Layer(media_type=media_type, digest=layer.digest, size=layer.size))
        config_bytes = config if config is not None else _default_config(built)
        config_layer = self.add_blob(config_bytes)
        manifest = Manifest(
            config=Layer(CONFIG_MEDIA_TYPE, config_layer.digest, config_layer.size),
            layers=tuple(built),
        )
        self.manifests[_repo_key(name)] = manifest.to_bytes()
        return manifest

    def add_models_dir(self, root: Path, *, host: str | None = None) -> list[str]:
        """Serve every model of an Ollama models directory (optionally of one host only)."""
        published = []
        for path in sorted((root / "manifests").glob("*/*/*/*")):
            reg_host, namespace, model, tag = path.relative_to(root / "manifests").parts
            if host is not None and reg_host != host:
                continue
            data = path.read_bytes()
            for layer in Manifest.parse(data).all_layers():
                self.blobs[layer.digest] = root / "blobs" / layer.digest.replace(":", "-")
            key = f"{namespace}/{model}:{tag}"
            self.manifests[key.lower()] = data
            published.append(key)
        return published

    async def wait_streams_idle(self) -> None:
        """Return once no blob body is being sent (e.g. after a client went away)."""
        while self.active_streams:
            await self._streams_changed.wait()

    def _streams_change(self, delta: int) -> None:
        self.active_streams += delta
        self.peak_streams = max(self.peak_streams, self.active_streams)
        self._streams_changed.set()
        self._streams_changed = trio.Event()

    def model_name(self, repo: str) -> str:
        """The pull name of ``namespace/model:tag`` on this server (after :meth:`serve`)."""
        return f"{self.host}:{self.port}/{repo}"

    # -- serving -------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on an ephemeral port; ``started()`` with ``"host:port"``."""
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(f"{self.host}:{self.port}")

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await _next_request(conn, stream)
                if request is None:
                    return
                keep_open = await self._respond(conn, stream, request)
                if not keep_open or conn.our_state is not h11.DONE:
                    return
                if conn.their_state is not h11.DONE:
                    return  # a body left unread: this connection is done
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return

    async def _respond(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request
    ) -> bool:
        method = request.method.decode()
        path, _, query = request.target.decode().partition("?")
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        range_header = headers.get("range") or headers.get("content-range")
        upload = _UPLOAD_RE.fullmatch(path)
        streamed = method == "PATCH" and upload is not None
        body = b"" if streamed else await _read_body(conn, stream)

        async def reply(status: int, body: bytes, extra: Sequence[tuple[str, str]] = ()) -> bool:
            self.requests.append(RequestRecord(method, path, range_header, status))
            if streamed and conn.their_state is not h11.DONE:
                await _read_body(conn, stream)  # an answer before the chunk: drain it
            hdrs = [("content-length", str(len(body))), *extra]
            await stream.send_all(conn.send(h11.Response(status_code=status, headers=hdrs)))
            if method != "HEAD":
                await stream.send_all(conn.send(h11.Data(data=body)))
            await stream.send_all(conn.send(h11.EndOfMessage()))
            return True

        if path == _TOKEN_PATH and method == "GET":
            token = json.dumps({"token": self.token, "access_token": self.token}).encode()
            return await reply(200, token, [("content-type", "application/json")])
        authorized = headers.get("authorization") == f"Bearer {self.token}"
        if self.token is not None and path.startswith("/v2/") and not authorized:
            unauthorized = _error_body("UNAUTHORIZED", "authentication required")
            return await reply(401, unauthorized, [("www-authenticate", self._challenge(path))])
        if upload is not None:
            return await self._upload(
                conn, stream, method, upload, query, body, headers.get("content-range"), reply
            )
        direct = _DIRECT_RE.fullmatch(path)
        match = _PATH_RE.fullmatch(path)
        if method == "PUT" and match is not None and match["kind"] == "manifests":
            return await self._put_manifest(f"{match['repo']}:{match['ref']}".lower(), body, reply)
        if method not in ("GET", "HEAD"):
            return await reply(405, b"")
        if path == "/v2/":
            return await reply(200, b"{}", [("content-type", "application/json")])
        if direct is None and match is None:
            return await reply(404, _error_body("NAME_UNKNOWN", "repository name not known"))
        key = (direct or match)["ref"]  # type: ignore[index]
        if match is not None and match["kind"] == "manifests":
            key = f"{match['repo']}:{match['ref']}".lower()
        faults = self.status_faults.get(key) if method == "GET" else self.push_faults.get(method)
        if faults:
            status = faults.pop(0)
            return await reply(status, _error_body("INJECTED", f"injected {status}"))
        if match is not None and match["kind"] == "manifests":
            data = self.manifests.get(key)
            if data is None:
                return await reply(404, _error_body("MANIFEST_UNKNOWN", "manifest unknown"))
            return await reply(200, data, [("content-type", MANIFEST_MEDIA_TYPE)])
        digest = (direct or match)["ref"]  # type: ignore[index]
        source = self.blobs.get(digest)
        if source is None:
            return await reply(404, _error_body("BLOB_UNKNOWN", "blob unknown to registry"))
        if match is not None and self.redirect_to_host is not None:
            location = f"http://{self.redirect_to_host}:{self.port}/direct/{digest}"
            return await reply(307, b"", [("location", location)])
        return await self._send_blob(conn, stream, method, path, range_header, digest, source)

    def _challenge(self, path: str) -> str:
        if not self.token_realm:
            return 'Basic realm="fake registry"'
        match = _PATH_RE.match(path) or _UPLOAD_RE.match(path)
        scope = f',scope="repository:{match["repo"]}:pull,push"' if match else ""
        realm = f"http://{self.host}:{self.port}{_TOKEN_PATH}"
        return f'Bearer realm="{realm}",service="fake-registry"{scope}'

    # -- pushes ----------------------------------------------------------------------------

    async def _upload(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        method: str,
        upload: re.Match[str],
        query: str,
        body: bytes,
        content_range: str | None,
        reply: Callable[..., Awaitable[bool]],
    ) -> bool:
        repo, upload_id = upload["repo"], upload["id"]
        faults = self.push_faults.get(method)
        if faults:
            status = faults.pop(0)
            return await reply(status, _error_body("INJECTED", f"injected {status}"))
        if method == "POST" and not upload_id:
            upload_id = f"u{len(self.requests)}-{secrets.token_hex(4)}"
            self.uploads[upload_id] = bytearray()
            return await reply(202, b"", self._upload_headers(repo, upload_id, "0-0"))
        data = self.uploads.get(upload_id)
        if data is None:
            return await reply(404, _error_body("BLOB_UPLOAD_UNKNOWN", "upload unknown"))
        if method == "GET":
            return await reply(204, b"", self._upload_headers(repo, upload_id))
        if method == "PATCH":
            return await self._patch(conn, stream, repo, upload_id, data, content_range, reply)
        if method == "PUT":
            self._receive(data, body)
            digest = parse_qs(query).get("digest", [""])[0]
            if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                return await reply(400, _error_body("DIGEST_INVALID", "digest did not match"))
            self.blobs[digest] = bytes(data)
            del self.uploads[upload_id]
            location = ("location", f"/v2/{repo}/blobs/{digest}")
            return await reply(201, b"", [location, ("docker-content-digest", digest)])
        return await reply(405, b"")

    def _upload_headers(
        self, repo: str, upload_id: str, held: str | None = None
    ) -> list[tuple[str, str]]:
        """Where the upload goes on (an absolute URL with a new ``_state`` each time, as
        distribution's: Ollama cannot follow a relative one), and how much of it is here
        (``0--1`` when nothing is, as distribution says)."""
        size = len(self.uploads[upload_id])
        base = f"http://{self.host}:{self.port}"
        location = f"{base}/v2/{repo}/blobs/uploads/{upload_id}?_state={size}"
        return [
            ("location", location),
            ("range", held if held is not None else f"0-{size - 1}"),
            ("docker-upload-uuid", upload_id),
        ]

    async def _patch(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        repo: str,
        upload_id: str,
        data: bytearray,
        content_range: str | None,
        reply: Callable[..., Awaitable[bool]],
    ) -> bool:
        parsed = _CONTENT_RANGE_RE.fullmatch(content_range or "")
        if parsed is not None and int(parsed[1]) != len(data):
            return await reply(416, _error_body("BLOB_UPLOAD_INVALID", "out of order"),
                               self._upload_headers(repo, upload_id))  # fmt: skip
        while (chunk := await _next_body_chunk(conn, stream)) is not None:
            end = len(data) + len(chunk)
            cut = self.upload_drops[0] if self.upload_drops else None
            stall = self.upload_stall
            if cut is not None and len(data) < cut <= end:
                self.upload_drops.pop(0)
                self._receive(data, chunk[: cut - len(data)])
                return False  # drop the connection mid-chunk; what came is kept
            if stall is not None and len(data) < stall.after <= end:
                self.upload_stall = None
                self._receive(data, chunk[: stall.after - len(data)])
                stall.began.set()
                await trio.sleep(stall.seconds)
                return False
            self._receive(data, chunk)
        return await reply(202, b"", self._upload_headers(repo, upload_id))

    def _receive(self, data: bytearray, chunk: bytes) -> None:
        data += chunk
        self.bytes_received += len(chunk)

    async def _put_manifest(
        self, key: str, body: bytes, reply: Callable[..., Awaitable[bool]]
    ) -> bool:
        faults = self.push_faults.get("MANIFEST")
        if faults:
            status = faults.pop(0)
            return await reply(status, _error_body("INJECTED", f"injected {status}"))
        try:
            manifest = Manifest.parse(body)
        except StoreError as exc:
            return await reply(400, _error_body("MANIFEST_INVALID", str(exc)))
        missing = sorted(d for d in manifest.digests() if d not in self.blobs)
        if missing:
            return await reply(400, _error_body("MANIFEST_BLOB_UNKNOWN", missing[0]))
        self.manifests[key] = body
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        return await reply(201, b"", [("docker-content-digest", digest)])

    async def _send_blob(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        method: str,
        path: str,
        range_header: str | None,
        digest: str,
        source: BlobSource,
    ) -> bool:
        size = source.stat().st_size if isinstance(source, Path) else len(source)
        start, stop, status = 0, size, 200
        headers = [("content-type", "application/octet-stream"), ("accept-ranges", "bytes")]
        if range_header and not self.ignore_range:
            parsed = _RANGE_RE.fullmatch(range_header.strip())
            if parsed is None or int(parsed[1]) >= size:
                self.requests.append(RequestRecord(method, path, range_header, 416))
                hdrs = [("content-length", "0"), ("content-range", f"bytes */{size}")]
                await stream.send_all(conn.send(h11.Response(status_code=416, headers=hdrs)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
                return True
            start = int(parsed[1])
            stop = min(int(parsed[2]) + 1, size) if parsed[2] else size
            status = 206
            headers.append(("content-range", f"bytes {start}-{stop - 1}/{size}"))
        headers.append(("content-length", str(stop - start)))
        self.requests.append(RequestRecord(method, path, range_header, status))
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
        if method == "HEAD":
            await stream.send_all(conn.send(h11.EndOfMessage()))
            return True

        drops = self.drop_after.get(digest)
        limit = drops.pop(0) if drops else None
        stalls = self.stalls.get(digest)
        stall = stalls.pop(0) if stalls else None
        self._streams_change(+1)
        try:
            return await self._send_body(conn, stream, digest, source, start, stop, limit, stall)
        finally:
            self._streams_change(-1)

    async def _send_body(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        digest: str,
        source: BlobSource,
        start: int,
        stop: int,
        limit: int | None,
        stall: Stall | None,
    ) -> bool:
        sent = 0
        offset = start
        while offset < stop:
            if stall is not None and sent >= stall.after:
                stall.began.set()
                await trio.sleep(stall.seconds)
                return False
            if limit is not None and sent >= limit:
                return False  # drop the connection mid-body
            n = min(_CHUNK, stop - offset)
            if limit is not None:
                n = min(n, limit - sent)
            if stall is not None:
                n = min(n, stall.after - sent) or n
            chunk = await _read(source, offset, n)
            if digest in self.corrupt and offset == 0:
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            if self.chunk_delay:
                await trio.sleep(self.chunk_delay)
            await stream.send_all(conn.send(h11.Data(data=chunk)))
            self.bytes_served[digest] += len(chunk)
            sent += len(chunk)
            offset += len(chunk)
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return True


async def _next_request(conn: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    """The next request's head (its body is read apart); None when the connection ends."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(_CHUNK)
            conn.receive_data(data)  # b"" marks the end of the connection
            continue
        if isinstance(event, h11.Request):
            return event
        if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _next_body_chunk(conn: h11.Connection, stream: trio.SocketStream) -> bytes | None:
    """The next piece of the request's body; None at its end."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(_CHUNK)
            if not data:
                raise trio.BrokenResourceError("the client left mid-body")
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            return None
        raise trio.BrokenResourceError(f"unexpected {event!r} in a request body")


async def _read_body(conn: h11.Connection, stream: trio.SocketStream) -> bytes:
    body = bytearray()
    while (chunk := await _next_body_chunk(conn, stream)) is not None:
        body += chunk
    return bytes(body)


async def _read(source: BlobSource, offset: int, n: int) -> bytes:
    if isinstance(source, bytes):
        return source[offset : offset + n]

    def read() -> bytes:
        with open(source, "rb") as f:
            f.seek(offset)
            return f.read(n)

    return await trio.to_thread.run_sync(read)


def _repo_key(name: str) -> str:
    repo, _, tag = name.partition(":")
    if "/" not in repo:
        repo = f"library/{repo}"
    return f"{repo}:{tag or 'latest'}".lower()


def _default_config(layers: Sequence[Layer]) -> bytes:
    body = {
        "model_format": "gguf",
        "model_family": "llama",
        "model_families": ["llama"],
        "model_type": "1M",
        "file_type": "F32",
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
    }
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"errors": [{"code": code, "message": message}]}).encode()


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve an Ollama models directory as a registry until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("models_dir", type=Path)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    async def run() -> None:
        registry = FakeRegistry(port=args.port)
        models = registry.add_models_dir(args.models_dir)
        async with trio.open_nursery() as nursery:
            address = await nursery.start(registry.serve)
            for model in models:
                print(f"ollama pull --insecure {address}/{model}", flush=True)

    trio.run(run)


if __name__ == "__main__":
    main()
