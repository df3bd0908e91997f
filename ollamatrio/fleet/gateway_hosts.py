"""The gateway's table of hosts: which are up, which models each has loaded or loading, and
what the gateway itself has sent where.

Each host is watched by one task: it subscribes to the host's ``/api/events`` (the
scheduler's events as SSE), then reads ``/api/ps`` once to start from the whole state (an
event between the two is in both and applying it twice changes nothing), then applies each
event as it comes: ``loading``, ``loaded``, ``evicting``/``expired`` (no longer warm) and
``load_failed``/``crashed``/``unloaded`` (gone).  When the stream ends or fails the host is
down (routed to no more) until a new subscription works; the watcher tries again after a
back-off, since a host that is gone sends nothing to wait for.

The gateway's own knowledge fills the gaps the events leave:

* requests in flight per host and model: a host with a request for a model it has not
  loaded yet is loading it, as far as routing is concerned (so concurrent first requests
  for a cold model all go where the first went);
* where a cold model was just sent (for ``RECENT_SECONDS``, or until the host says what
  became of it), for the moment between a request's end and the host's ``loaded`` event;
* a host that answered 503 (its queue is full) is saturated until one of the requests the
  gateway has in flight there ends.

Model names are compared as the store compares them (``tiny`` is ``tiny:latest``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from typing import Any, Final

import trio

from ..engines.runner_http import parse_event
from ..http1.client import BodyReader
from ..store.names import InvalidModelNameError, ModelName
from .gateway_upstream import HostConnectionError, HostPool
from .routing import Choice, HostView, route

log = logging.getLogger(__name__)

RECENT_SECONDS: Final = 30.0
FIRST_BACKOFF: Final = 0.25  # seconds before watching a lost host again
MAX_BACKOFF: Final = 5.0

# The events after which a host's free memory is no longer what it said: memory booked for
# a load, or given back; the gateway reads its /api/ps again (one GET per load or unload).
_MEMORY_EVENTS: Final = frozenset({"loading", "loaded", "load_failed", "crashed", "unloaded"})

# What each event says of the model's runner on that host (None: it is gone).
_EVENT_STATES: Final[dict[str, str | None]] = {
    "loading": "loading",
    "loaded": "ready",
    "evicting": "unloading",
    "expired": "unloading",
    "load_failed": None,
    "crashed": None,
    "unloaded": None,
}


def model_key(name: str) -> str:
    """A model's name as the store compares it."""
    try:
        return "/".join(ModelName.parse(name).folded())
    except InvalidModelNameError:
        return name.lower()


def parse_address(url: str) -> tuple[str, int]:
    """``http://host:port`` (or ``host:port``) → (host, port).

    Raises:
        ValueError: not an http address with a port.
    """
    rest = url.removeprefix("http://").rstrip("/")
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit() or "/" in rest:
        raise ValueError(f"not a host address (http://HOST:PORT): {url!r}")
    return host.strip("[]"), int(port)


class Host:
    """One host as the gateway knows it."""

    def __init__(
        self, url: str, replica: str | None = None, node: str | None = None,
        fleet_secret: str = "",
    ) -> None:  # fmt: skip
        self.address = parse_address(url)
        self.name = f"http://{self.address[0]}:{self.address[1]}"
        self.replica = replica  # Ray's replica id, when Ray runs the host
        self.node = node  # its Ray node (id or address)
        self.niceness: int | None = None  # its server's scheduling niceness (Ray hosts)
        self.seen = 0.0  # when its owner last said it exists (trio time; Ray hosts)
        self.watcher = trio.CancelScope()  # the watch task's scope; cancelled on removal
        self.pool = HostPool(self.address, fleet_secret)
        self.up = False
        self.models: dict[str, str] = {}  # model key → loading | ready | unloading
        self.inflight: dict[str, int] = {}  # model key → the gateway's requests there
        self.refused = False  # answered 503 since the last of our requests there ended
        # Bytes a new load could use per device, from the host's /api/ps (None: not said).
        self.free_memory: tuple[int, ...] | None = None

    def view(self) -> HostView:
        ready = frozenset(m for m, state in self.models.items() if state == "ready")
        loading = {m for m, state in self.models.items() if state == "loading"}
        loading |= {m for m, n in self.inflight.items() if n and m not in ready}
        return HostView(
            host=self.name,
            loaded=ready,
            loading=frozenset(loading),
            free_memory=self.free_memory,
            saturated=self.refused,
            load=sum(self.inflight.values()),
        )

    def resync(self, ps: dict[str, Any]) -> None:
        """Start again from ``/api/ps``."""
        self.models = {}
        for row in ps.get("models") or []:
            state = row.get("state", "ready")
            if state in ("loading", "ready", "unloading"):
                self.models[model_key(str(row.get("name") or row.get("model")))] = state
        self.read_free_memory(ps)

    def read_free_memory(self, ps: dict[str, Any]) -> None:
        """The free bytes per device of ``/api/ps``; a host that does not say them (an
        older server, another implementation) fits every model as far as routing goes."""
        rows = ps.get("free_memory")
        try:
            free = tuple(int(row["free"]) for row in rows) if isinstance(rows, list) else None
        except (TypeError, KeyError, ValueError):
            free = None
        self.free_memory = free if free else None

    def apply(self, event: dict[str, Any]) -> str | None:
        """One scheduler event; the model it is about if it changed what the host holds."""
        kind = event.get("event")
        if kind not in _EVENT_STATES or not isinstance(event.get("model"), str):
            return None
        model = model_key(event["model"])
        state = _EVENT_STATES[kind]
        if state is None:
            self.models.pop(model, None)
        else:
            self.models[model] = state
        return model


@dataclass
class Sending:
    """One request's attempt at one host."""

    refused: bool = False  # the host answered 503


class HostTable:
    """Every host, and the routing decisions over them.

    A static fleet lists its hosts up front; a dynamic one (Ray) starts empty and learns
    them with :meth:`add` and :meth:`remove` once :meth:`run` is running.
    """

    def __init__(self, urls: list[str], *, dynamic: bool = False, fleet_secret: str = "") -> None:
        self.fleet_secret = fleet_secret  # sent to every host (http/fleet_secret.py)
        self.hosts: dict[str, Host] = {}
        for url in urls:
            host = Host(url, fleet_secret=fleet_secret)
            self.hosts[host.name] = host
        if not self.hosts and not dynamic:
            raise ValueError("a fleet needs at least one host")
        self._recent: dict[str, tuple[str, float]] = {}  # model key → (host, when sent)
        self._changed = trio.Event()
        self.decisions: dict[str, int] = {}  # routing decisions by kind
        # A model started loading on a host while another, unsaturated host held it.
        self.duplicate_loads = 0
        self._nursery: trio.Nursery | None = None
        self._subscribers: set[trio.MemorySendChannel[dict[str, Any]]] = set()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch every host (those listed, then those added) until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for host in self.hosts.values():
                    nursery.start_soon(self.watch, host)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for host in self.hosts.values():
                host.pool.close()

    def add(self, url: str, replica: str | None = None, node: str | None = None) -> Host:
        """A host that exists (again): watched from now on; said again, only refreshed."""
        address = parse_address(url)
        name = f"http://{address[0]}:{address[1]}"
        host = self.hosts.get(name)
        if host is None:
            assert self._nursery is not None, "add() needs run() running"
            host = self.hosts[name] = Host(url, replica, node, self.fleet_secret)
            self._nursery.start_soon(self.watch, host)
            log.info("host %s added (replica %s, node %s)", host.name, replica, node)
        host.replica, host.node = replica or host.replica, node or host.node
        host.seen = trio.current_time()
        return host

    def remove(self, name: str) -> None:
        """A host that is gone: no more requests, its watcher and connections closed."""
        host = self.hosts.pop(name, None)
        if host is not None:
            host.watcher.cancel()
            host.pool.close()
            log.info("host %s removed", name)
            self._notify()

    def forget_silent(self, older_than: float) -> None:
        """Remove the hosts that are down and were last said to exist before
        ``older_than`` (trio time): a replica killed outright never says goodbye."""
        for host in list(self.hosts.values()):
            if not host.up and host.seen < older_than:
                self.remove(host.name)

    def subscribe(self, capacity: int = 256) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        """Every host's scheduler events from now on, each tagged with ``host``,
        ``replica`` and ``node``; a subscriber that falls ``capacity`` behind is cut off."""
        send, receive = trio.open_memory_channel[dict[str, Any]](capacity)
        self._subscribers.add(send)
        return receive

    def _publish(self, host: Host, event: dict[str, Any]) -> None:
        tagged = {**event, "host": host.name, "replica": host.replica, "node": host.node}
        for channel in list(self._subscribers):
            try:
                channel.send_nowait(tagged)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.discard(channel)
                channel.close()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Until the table changes (a host up or down, a model's state, a request sent)."""
        await self._changed.wait()

    def up(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.up]

    def recent(self) -> dict[str, str]:
        now = trio.current_time()
        for model, (_, when) in list(self._recent.items()):
            if now - when > RECENT_SECONDS:
                del self._recent[model]
        return {model: host for model, (host, _) in self._recent.items()}

    def needs_size(self, model: str) -> bool:
        """Whether routing ``model`` (a key) may go cold: no host that is up holds it (loaded
        or loading) without being saturated for it.  Only then does its size matter."""
        recent = self.recent().get(model)
        for host in self.up():
            holds = host.models.get(model) in ("ready", "loading") or host.inflight.get(model)
            if (holds or host.name == recent) and not host.refused:
                return False
        return True

    def choose(self, model: str, size: int | None = None) -> list[Choice]:
        """The hosts that are up, in the order to try them for ``model`` (a key) of
        predicted ``size`` bytes (None: unknown)."""
        return route(model, [h.view() for h in self.up()], size=size, recent=self.recent())

    def default(self) -> list[Host]:
        """For a request that names no model: the hosts that are up, as listed."""
        return self.up()

    @contextmanager
    def sending(self, host: Host, model: str | None, kind: str | None) -> Iterator[Sending]:
        """A request in flight to ``host`` (counted synchronously on both sides, so a
        decision taken meanwhile sees it)."""
        if model is not None:
            host.inflight[model] = host.inflight.get(model, 0) + 1
            if kind in ("cold", "spill"):
                self._recent[model] = (host.name, trio.current_time())
        if kind is not None:
            self.decisions[kind] = self.decisions.get(kind, 0) + 1
        self._notify()  # a request in flight changes what a host counts as loading
        attempt = Sending()
        try:
            yield attempt
        finally:
            if model is not None:
                host.inflight[model] -= 1
                if not host.inflight[model]:
                    del host.inflight[model]
            # A request the host took has ended: a place in its queue is free again.  The
            # request it refused freed nothing.
            if host.refused and not attempt.refused:
                host.refused = False
                self._notify()

    def refused(self, host: Host, attempt: Sending) -> None:
        """``host`` answered ``attempt`` 503: saturated until a request it took ends."""
        attempt.refused = True
        host.refused = True
        self._notify()

    def _set_up(self, host: Host, up: bool) -> None:
        if host.up != up:
            log.info("host %s is %s", host.name, "up" if up else "down")
        host.up = up
        if not up:
            host.models = {}
        self._notify()

    def _heard(self, host: Host, model: str) -> None:
        """The host said what became of ``model``: the memory of sending it there is done."""
        sent = self._recent.get(model)
        if sent is not None and sent[0] == host.name:
            del self._recent[model]
        self._notify()

    def _count_duplicate(self, host: Host, event: dict[str, Any]) -> None:
        """A second copy: ``host`` starts loading a model that another host, up and not
        saturated, holds already."""
        if not isinstance(event.get("model"), str):
            return
        model = model_key(event["model"])
        if host.models.get(model) in ("loading", "ready"):
            return  # a progress report of a load already counted
        for other in self.up():
            if other is not host and other.models.get(model) == "ready" and not other.refused:
                self.duplicate_loads += 1
                return

    async def watch(self, host: Host) -> None:
        """Follow ``host`` for as long as the gateway runs (or until it is removed)."""
        with host.watcher:
            await self._watch(host)

    async def _watch(self, host: Host) -> None:
        backoff = FIRST_BACKOFF
        while True:
            try:
                async with aclosing(self._events(host)) as events:
                    async for event in events:
                        backoff = FIRST_BACKOFF
                        self._publish(host, event)
                        if event.get("event") == "loading":
                            self._count_duplicate(host, event)
                        model = host.apply(event)
                        if model is not None:
                            self._heard(host, model)
            except HostConnectionError as exc:
                log.debug("watching %s: %s", host.name, exc)
            self._set_up(host, False)
            await trio.sleep(backoff)  # an external host: nothing to wait on but time
            backoff = min(MAX_BACKOFF, backoff * 2)

    async def _events(self, host: Host) -> AsyncGenerator[dict[str, Any], None]:
        """Subscribe to the host's events, resync from ``/api/ps``, then yield each event
        until the stream ends."""
        message = b"GET /api/events HTTP/1.1\r\nhost: %b\r\n\r\n" % host.pool.authority
        conn, head = await host.pool.send(message)
        try:
            if head.status != 200:
                raise HostConnectionError(f"/api/events answered {head.status}")
            ps = await self._read_ps(host)
            try:
                host.resync(ps)
            except AttributeError as exc:
                raise HostConnectionError(f"/api/ps answered no list of models: {exc}") from None
            self._set_up(host, True)
            reader = BodyReader(conn, head, no_body=False)
            pending = bytearray()
            while not reader.done:
                pending += await reader.next()
                memory_changed = False
                while (end := pending.find(b"\n\n")) >= 0:
                    raw, pending[:] = bytes(pending[:end]), pending[end + 2 :]
                    try:
                        event = parse_event(raw)
                    except ValueError:
                        continue
                    if event is not None:
                        memory_changed |= event.get("event") in _MEMORY_EVENTS
                        yield event
                if memory_changed:  # once for the events of one read, not once each
                    await self._reread_free_memory(host)
        finally:
            conn.close()

    async def _reread_free_memory(self, host: Host) -> None:
        host.read_free_memory(await self._read_ps(host))
        self._notify()

    @staticmethod
    async def _read_ps(host: Host) -> dict[str, Any]:
        status, body = await host.pool.get("/api/ps")
        if status != 200:
            raise HostConnectionError(f"/api/ps answered {status}")
        try:
            ps = json.loads(body)
        except ValueError as exc:
            raise HostConnectionError(f"/api/ps answered no JSON: {exc}") from None
        if not isinstance(ps, dict):
            raise HostConnectionError("/api/ps answered no JSON object")
        return ps
