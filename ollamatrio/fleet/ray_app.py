"""The fleet on Ray Serve: the hosts as one deployment, the gateway as another.

* :class:`FleetHost`: one replica per host (``max_replicas_per_node=1``; give it
  ``num_gpus`` and Ray sets ``CUDA_VISIBLE_DEVICES``, which the server's inventory honours).
  The replica supervises an unchanged ``ollamatrio serve`` (``fleet/host_process.py``) on
  its node's address; ``check_health`` is that process alive and answering
  ``/api/version``; ``record_autoscaling_stats`` reports its queued and running requests
  (``/api/ps``), which :func:`requests_policy` scales on; its destructor stops the server
  with SIGTERM (the server's own drain) within ``graceful_shutdown_timeout_s``.  Each health
  check also tells the gateway the host exists (a heartbeat): a restarted gateway relearns
  every host within one period.
* :class:`FleetGateway`: one replica on the node ``fleet up`` ran on, running the Trio
  gateway (``fleet/gateway.py``) in its own thread on ``OLLAMA_HOST``.  Serve restarts it
  if it dies (its health check is that thread alive).  Its host table learns the hosts from
  the host replicas: their addresses, Ray replica ids and nodes.

No request goes through Serve's proxy or handles (their per-token cost is what the
gateway avoids, docs/fleet.md): Serve places, checks, restarts and scales; the gateway
carries the bytes.  Deployable with Ray's own tooling too: ``serve run
ollamatrio.fleet.ray_app:app_builder replicas=2`` (settings from the environment).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import threading
from dataclasses import dataclass, field
from socket import socket
from typing import Any, Final

import ray
import trio
from ray import serve
from ray.serve.config import AutoscalingContext

from ..config import Settings
from ..serve import GRACEFUL_TIMEOUT, listen
from .gateway import serve_gateway
from .gateway_fleetwide import fleet_ps
from .gateway_hosts import HostTable
from .host_process import STOP_TIMEOUT, HostProcess

log = logging.getLogger(__name__)

APP_NAME: Final = "ollamatrio-fleet"
HOSTS: Final = "FleetHost"
GATEWAY: Final = "FleetGateway"
HEALTH_PERIOD: Final = 2.0  # seconds between health checks (and heartbeats) of a host
HEALTH_TIMEOUT: Final = 10.0
# A host that is down and silent for this long is dropped from the gateway's table.
SILENT_SECONDS: Final = 5 * HEALTH_PERIOD
FLEET_SECRET_VAR: Final = "OLLAMATRIO_FLEET_SECRET"
REQUESTS_METRIC: Final = "ollamatrio_requests"  # queued + running, per host
TARGET_REQUESTS: Final = 4.0  # requests per host the autoscaling policy aims for
NICENESS_ADVICE: Final = (
    "ollamatrio serve %d runs at niceness %d (Ray starts its workers at 15), so any other busy "
    "process on this node comes first; start the Ray nodes with RAY_worker_niceness=0"
)


@dataclass(frozen=True)
class FleetOptions:
    """What ``fleet up`` deploys (from its flags and ``--config fleet.toml``)."""

    replicas: int = 1
    min_replicas: int | None = None  # both set: autoscaling between them
    max_replicas: int | None = None
    target_requests: float = TARGET_REQUESTS
    # Serve's autoscaling pace (seconds): how long a wish to scale must hold, how often
    # hosts report their requests and over how long a window those reports are averaged.
    upscale_delay_s: float = 2.0
    downscale_delay_s: float = 10.0
    metrics_interval_s: float = 1.0
    look_back_period_s: float = 4.0
    num_cpus: float = 0.0  # per host replica; Ray's default of 1 would idle a core
    num_gpus: float = 0.0
    gateway_bind: str = "127.0.0.1:11434"  # OLLAMA_HOST of the gateway
    gateway_node_ip: str | None = None  # pin the gateway to this node (fleet up's own)
    env: dict[str, str] = field(default_factory=dict)  # the hosts' environment
    # OLLAMATRIO_FLEET_SECRET of the gateway and the hosts, given to them in Ray's runtime
    # environment (env_vars), never in the deployment's arguments or on a command line.
    fleet_secret: str = field(default="", repr=False)

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None and self.max_replicas is not None


def requests_policy(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    """Serve autoscaling policy: as many hosts as the fleet's queued and running requests
    need at the target per host (Serve applies the bounds, delays and factors)."""
    per_replica = (ctx.aggregated_metrics or {}).get(REQUESTS_METRIC, {})
    total = sum(per_replica.values())
    target = TARGET_REQUESTS
    if ctx.config is not None:
        target = float(ctx.config.get_target_ongoing_requests())
    return max(1, math.ceil(total / target)), {}


def node_ip() -> str:
    """This node's address as Ray knows it."""
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


class FleetGatewayImpl:
    """The gateway replica: the Trio gateway in a thread of its own."""

    def __init__(self, bind: str) -> None:
        settings = Settings.from_env({**os.environ, "OLLAMA_HOST": bind})
        scheme = "https" if settings.tls_cert else "http"
        self.url = f"{scheme}://{settings.bind}"
        self.table = HostTable([], dynamic=True, fleet_secret=settings.fleet_secret)
        self._listener: socket = listen(settings)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(settings, started), name="fleet-gateway", daemon=True
        )
        self._thread.start()
        started.wait()
        if self._token is None:
            raise RuntimeError("the fleet gateway did not start")

    def _run(self, settings: Settings, started: threading.Event) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(
                        lambda task_status: serve_gateway(
                            self.table, settings, shutdown_trigger=self._stop_wait,
                            listener=self._listener, task_status=task_status,
                        )
                    )  # fmt: skip
                    started.set()
            finally:
                started.set()

        try:
            trio.run(main)
        except BaseException:
            log.exception("the fleet gateway failed")

    async def _stop_wait(self) -> None:
        assert self._stop is not None
        await self._stop.wait()

    def _in_trio(self, fn: Any, *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def register(self, url: str, replica: str, node: str, niceness: int | None = None) -> None:
        """A host replica says it exists (at start and at each of its health checks)."""

        def add() -> None:
            self.table.add(url, replica, node).niceness = niceness
            self.table.forget_silent(trio.current_time() - SILENT_SECONDS)

        self._in_trio(add)

    def unregister(self, url: str) -> None:
        """A host replica is stopping."""
        self._in_trio(lambda: self.table.remove(url.rstrip("/")))

    def status(self) -> dict[str, Any]:
        """The gateway's address and every host: replica, node, up, loaded models, queues."""

        async def collect() -> dict[str, Any]:
            rows = await fleet_ps(self.table)
            hosts = [
                {
                    "url": h.name, "replica": h.replica, "node": h.node, "up": h.up,
                    "niceness": h.niceness,
                    "models": [
                        {k: r.get(k) for k in ("name", "state", "queued", "active", "slots")}
                        for r in rows if r["replica"] == (h.replica or h.name)
                    ],
                }
                for h in self.table.hosts.values()
            ]  # fmt: skip
            return {"url": self.url, "hosts": hosts, "decisions": dict(self.table.decisions)}

        result: dict[str, Any] = trio.from_thread.run(collect, trio_token=self._token)
        return result

    def wait_hosts(self, count: int, timeout: float) -> int:
        """Until ``count`` hosts are up (or ``timeout`` seconds): how many are."""

        async def wait() -> int:
            with trio.move_on_after(timeout):
                while len(self.table.up()) < count:
                    await self.table.wait_changed()
            return len(self.table.up())

        result: int = trio.from_thread.run(wait, trio_token=self._token)
        return result

    def check_health(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the fleet gateway's thread has ended")

    def __del__(self) -> None:
        if self._token is not None and self._thread.is_alive():
            try:
                self._in_trio(lambda: self._stop.set() if self._stop else None)
            except trio.RunFinishedError:
                pass
            self._thread.join(GRACEFUL_TIMEOUT + 5)
        self._listener.close()


class FleetHostImpl:
    """One host replica: supervises ``ollamatrio serve`` on its node's address."""

    def __init__(self, gateway: Any, env: dict[str, str]) -> None:
        self.gateway = gateway  # a DeploymentHandle of FleetGateway
        self.node_ip = node_ip()
        self.node = ray.get_runtime_context().get_node_id()
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.server = HostProcess(self.node_ip, env)
        log.info("host replica %s: ollamatrio serve %d at %s", self.replica,
                 self.server.pid, self.server.url)  # fmt: skip
        if self.server.niceness > 0:
            log.warning(NICENESS_ADVICE, self.server.pid, self.server.niceness)

    async def _register(self) -> None:
        await self.gateway.register.remote(
            self.server.url, self.replica, self.node, self.server.niceness
        )

    async def check_health(self) -> None:
        problem = self.server.healthy()
        if problem is not None:
            raise RuntimeError(problem)
        await self._register()

    def record_autoscaling_stats(self) -> dict[str, float]:
        return {REQUESTS_METRIC: self.server.requests()}

    def info(self) -> dict[str, Any]:
        return {"url": self.server.url, "pid": self.server.pid, "replica": self.replica,
                "node": self.node, "node_ip": self.node_ip,
                "niceness": self.server.niceness}  # fmt: skip

    def __del__(self) -> None:
        try:
            self.gateway.unregister.remote(self.server.url)
        except Exception:  # the gateway may be gone first (fleet down)
            log.debug("could not unregister %s", self.server.url, exc_info=True)
        self.server.stop()


def build(options: FleetOptions) -> Any:
    """The Serve application for ``options`` (``serve.run`` it)."""
    secret_env = {"env_vars": {FLEET_SECRET_VAR: options.fleet_secret}}
    runtime_env = secret_env if options.fleet_secret else {}
    gateway_actor: dict[str, Any] = {"num_cpus": 0, "runtime_env": runtime_env}
    if options.gateway_node_ip:
        gateway_actor["resources"] = {f"node:{options.gateway_node_ip}": 0.001}
    gateway = serve.deployment(
        name=GATEWAY, num_replicas=1, ray_actor_options=gateway_actor,
        health_check_period_s=HEALTH_PERIOD, graceful_shutdown_timeout_s=GRACEFUL_TIMEOUT + 5,
    )(FleetGatewayImpl).bind(options.gateway_bind)  # fmt: skip
    scaling: dict[str, Any] = {}
    if options.autoscaling:
        scaling["autoscaling_config"] = {
            "min_replicas": options.min_replicas,
            "max_replicas": options.max_replicas,
            "initial_replicas": options.min_replicas,
            "target_ongoing_requests": options.target_requests,
            "upscale_delay_s": options.upscale_delay_s,
            "downscale_delay_s": options.downscale_delay_s,
            "metrics_interval_s": options.metrics_interval_s,
            "look_back_period_s": options.look_back_period_s,
            "policy": {"policy_function": f"{__name__}:requests_policy"},
        }
    else:
        scaling["num_replicas"] = options.replicas
    hosts = serve.deployment(
        name=HOSTS, max_replicas_per_node=1,
        ray_actor_options={
            "num_cpus": options.num_cpus, "num_gpus": options.num_gpus, "runtime_env": runtime_env,
        },
        health_check_period_s=HEALTH_PERIOD, health_check_timeout_s=HEALTH_TIMEOUT,
        graceful_shutdown_timeout_s=STOP_TIMEOUT + 5, **scaling,
    )(FleetHostImpl)  # fmt: skip
    return hosts.bind(gateway, options.env)


def host_env(environ: dict[str, str]) -> dict[str, str]:
    """The hosts' environment from ``fleet up``'s: every ``OLLAMA_*`` and ``OLLAMATRIO_*``
    setting but the address (each host listens on its node's) and the fleet secret (in Ray's
    runtime environment instead, :func:`build`)."""
    return {
        k: v for k, v in environ.items()
        if k.startswith(("OLLAMA_", "OLLAMATRIO_")) and k not in ("OLLAMA_HOST", FLEET_SECRET_VAR)
    }  # fmt: skip


def fleet_secret(environ: dict[str, str]) -> str:
    """``OLLAMATRIO_FLEET_SECRET`` when set, else a new one (256 random bits)."""
    return environ.get(FLEET_SECRET_VAR, "").strip() or secrets.token_urlsafe(32)


def app_builder(args: dict[str, str]) -> Any:
    """For Ray's own tooling: ``serve run ollamatrio.fleet.ray_app:app_builder
    replicas=2`` (the gateway on OLLAMA_HOST, the hosts' settings from the environment)."""
    environ = dict(os.environ)
    return build(FleetOptions(
        replicas=int(args.get("replicas", 1)),
        gateway_bind=environ.get("OLLAMA_HOST", "127.0.0.1:11434"), env=host_env(environ),
        fleet_secret=fleet_secret(environ),
    ))  # fmt: skip
