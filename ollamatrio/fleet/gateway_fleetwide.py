"""The gateway's own answers about the whole fleet, where one host's answer would be wrong.

* ``GET /api/ps``: every host's loaded models, one row per host that holds a model, each
  row with ``"replica"`` (Ray's replica id, else the host's address) and ``"node"`` (its
  Ray node, else the host's address).  A host that does not answer is left out.
* ``GET /metrics``: the gateway's series (Prometheus text): routing decisions by kind, the
  duplicate-load counter, hosts up, and one info series per host (its address is the
  scrape target for that host's own ``/metrics``).
* ``GET /api/events``: every host's scheduler events as one SSE stream, each event's data
  tagged with ``host``, ``replica`` and ``node`` (the host table's watchers already read
  every host's events; a subscriber gets them from the table).

``/api/tags``, ``/api/version`` and ``/`` stay one host's answer: the hosts share one model
store, so any host answers them for all.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..wire import SSE
from .gateway_hosts import Host, HostTable
from .gateway_upstream import HostConnectionError

log = logging.getLogger(__name__)

ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]

PS_TIMEOUT: Final = 5.0  # seconds a host gets to answer /api/ps
DECISION_KINDS: Final = ("warm", "loading", "cold", "spill", "saturated")
FLEETWIDE: Final = frozenset({"/api/ps", "/metrics", "/api/events"})


async def host_ps(host: Host) -> list[dict[str, Any]]:
    """``host``'s ``/api/ps`` rows, tagged with its replica and node; [] if it fails."""
    with trio.move_on_after(PS_TIMEOUT):
        try:
            status, body = await host.pool.get("/api/ps")
            rows = orjson.loads(body).get("models") or [] if status == 200 else []
        except (HostConnectionError, orjson.JSONDecodeError, AttributeError) as exc:
            log.debug("/api/ps of %s: %s", host.name, exc)
            return []
        return [
            {**row, "replica": host.replica or host.name, "node": host.node or host.name}
            for row in rows
            if isinstance(row, dict)
        ]
    return []


async def fleet_ps(table: HostTable) -> list[dict[str, Any]]:
    """Every up host's rows, asked at once, in the table's order of hosts."""
    hosts = table.up()
    answers: list[list[dict[str, Any]]] = [[] for _ in hosts]

    async def ask(index: int, host: Host) -> None:
        answers[index] = await host_ps(host)

    async with trio.open_nursery() as nursery:
        for index, host in enumerate(hosts):
            nursery.start_soon(ask, index, host)
    return [row for rows in answers for row in rows]


class _GatewayCollector(Collector):
    def __init__(self, table: HostTable) -> None:
        self.table = table

    def collect(self) -> list[Metric]:
        decisions = CounterMetricFamily(
            "ollamatrio_fleet_routing_decisions",
            "Requests the gateway routed, by the policy's kind of choice.",
            labels=["kind"],
        )
        for kind in DECISION_KINDS:
            decisions.add_metric([kind], self.table.decisions.get(kind, 0))
        duplicates = CounterMetricFamily(
            "ollamatrio_fleet_duplicate_loads",
            "Loads of a model on a host while another host, not saturated, held it.",
        )
        duplicates.add_metric([], self.table.duplicate_loads)
        up = GaugeMetricFamily("ollamatrio_fleet_hosts_up", "Hosts the gateway routes to.")
        up.add_metric([], len(self.table.up()))
        hosts = GaugeMetricFamily(
            "ollamatrio_fleet_host",
            "One series per host (1 when up): its address is a scrape target of its own.",
            labels=["host", "replica", "node"],
        )
        for host in self.table.hosts.values():
            labels = [host.name, host.replica or "", host.node or ""]
            hosts.add_metric(labels, 1 if host.up else 0)
        return [decisions, duplicates, up, hosts]


def metrics_text(table: HostTable) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_GatewayCollector(table))
    return generate_latest(registry)


async def answer(table: HostTable, path: str, receive: ASGIReceive, send: ASGISend) -> None:
    """The fleet-wide answer for ``GET path`` (one of :data:`FLEETWIDE`)."""
    if path == "/api/ps":
        body = orjson.dumps({"models": await fleet_ps(table)})
        await _whole(send, b"application/json; charset=utf-8", body)
    elif path == "/metrics":
        await _whole(send, b"text/plain; version=0.0.4; charset=utf-8", metrics_text(table))
    else:
        await _events(table, receive, send)


async def _whole(send: ASGISend, content_type: bytes, body: bytes) -> None:
    await send({
        "type": "http.response.start", "status": 200,
        "headers": [(b"content-type", content_type)],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def _events(table: HostTable, receive: ASGIReceive, send: ASGISend) -> None:
    """The merged stream until the client leaves (or falls too far behind)."""
    events = table.subscribe()
    headers = [(b"content-type", SSE.encode()), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    left = False
    async with events, trio.open_nursery() as nursery:

        async def watch_disconnect() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch_disconnect)
        async for event in events:
            kind = str(event.get("event", "message"))
            line = b"event: %b\ndata: %b\n\n" % (kind.encode(), orjson.dumps(event))
            await send({"type": "http.response.body", "body": line, "more_body": True})
        nursery.cancel_scope.cancel()  # cut off: the subscriber fell behind
    if not left:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
