"""``python -m ollamatrio fleet up|down|status``: the fleet on a running Ray cluster.

* ``up`` deploys the Serve application of ``fleet/ray_app.py`` (the hosts and the gateway)
  onto the cluster at ``--address`` (else ``RAY_ADDRESS``, else ``auto``), the gateway on
  ``OLLAMA_HOST`` on this node, then prints one ``ready: <url> (<n> replicas)`` line and
  returns once the gateway answers with every host up.  The gateway and the hosts get the
  fleet secret (``OLLAMATRIO_FLEET_SECRET``, a new random one if unset) in Ray's runtime
  environment: every host refuses a request without it (401), so only the gateway is served.
  Without Ray's token authentication (``RAY_AUTH_MODE=token``) it warns.
* ``down`` deletes the application: Serve stops each host replica, whose destructor stops
  its ``ollamatrio serve`` (which unloads its runners), then the gateway.  Serve itself is
  shut down too when no other application is left on the cluster.  The cluster stays up:
  nothing here ever runs ``ray stop`` (it would kill every Ray process on the machine).
* ``status`` lists the hosts: replica, node, address, loaded models and their queues.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tomllib
import urllib.request
from typing import Any, Final

import ray
from ray import serve
from ray.exceptions import AuthenticationError

from .ray_app import (
    APP_NAME,
    FLEET_SECRET_VAR,
    GATEWAY,
    FleetOptions,
    build,
    fleet_secret,
    host_env,
    node_ip,
)

AUTH_MODE_VAR: Final = "RAY_AUTH_MODE"
READY_TIMEOUT: Final = 120.0  # seconds for every host to come up after Serve says running
_SETTINGS: Final = ("replicas", "min_replicas", "max_replicas", "target_requests",
                    "upscale_delay_s", "downscale_delay_s", "metrics_interval_s",
                    "look_back_period_s", "num_cpus", "num_gpus")  # fmt: skip


class FleetError(Exception):
    """A fleet command that cannot go on; its message is for the operator."""


def options_from(args: argparse.Namespace, environ: dict[str, str]) -> FleetOptions:
    """``fleet up``'s flags over its ``--config`` over the defaults.

    Raises:
        FleetError: a bad combination or file.
    """
    settings: dict[str, Any] = {}
    env = host_env(environ)
    if args.config is not None:
        try:
            data = tomllib.loads(args.config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise FleetError(f"cannot read {args.config}: {exc}") from None
        fleet = data.get("fleet", {})
        unknown = set(fleet) - set(_SETTINGS)
        if unknown:
            raise FleetError(f"{args.config}: unknown [fleet] keys: {', '.join(sorted(unknown))}")
        settings.update(fleet)
        env.update({str(k): str(v) for k, v in data.get("env", {}).items()})
    secret = fleet_secret({**environ, **env})  # [env] may set it too
    env.pop(FLEET_SECRET_VAR, None)
    for name in ("replicas", "min_replicas", "max_replicas"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    if args.replicas is not None:
        settings.pop("min_replicas", None)
        settings.pop("max_replicas", None)
    low, high = settings.get("min_replicas"), settings.get("max_replicas")
    if (low is None) != (high is None):
        raise FleetError("--min-replicas and --max-replicas go together")
    if low is not None and not 1 <= low <= high:
        raise FleetError("need 1 <= --min-replicas <= --max-replicas")
    if settings.get("replicas", 1) < 1:
        raise FleetError("--replicas must be at least 1")
    return FleetOptions(
        **settings, env=env, gateway_bind=environ.get("OLLAMA_HOST") or "127.0.0.1:11434",
        gateway_node_ip=node_ip(), fleet_secret=secret,
    )  # fmt: skip


def niceness_warning(status: dict[str, Any]) -> str | None:
    """A warning for the operator when hosts' servers run niced (Ray starts its workers at
    niceness 15, and the servers inherit it): on a busy node anything else comes first."""
    niced = sorted({h["niceness"] for h in status["hosts"] if (h.get("niceness") or 0) > 0})
    if not niced:
        return None
    count = sum(1 for h in status["hosts"] if (h.get("niceness") or 0) > 0)
    levels = "/".join(str(n) for n in niced)
    return (
        f"warning: {count} of {len(status['hosts'])} hosts run at niceness {levels}, so any "
        "other busy process on their nodes comes first; start each Ray node with "
        "RAY_worker_niceness=0 in its environment (docs/fleet.md)"
    )


def _connect(args: argparse.Namespace) -> None:
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except AuthenticationError as exc:
        raise FleetError(
            f"the Ray cluster at {address} requires its token: set RAY_AUTH_MODE=token and "
            f"RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token): {exc}"
        ) from None
    except (ConnectionError, RuntimeError) as exc:
        raise FleetError(f"no Ray cluster at {address}: {exc}") from None


def ray_auth_warning(environ: dict[str, str]) -> str | None:
    """A warning for the operator when this command spoke to Ray without its token
    authentication (Ray 2.60: ``RAY_AUTH_MODE=token``, which the cluster's ``ray start``
    must have too): whoever reaches the cluster's ports can run code on it (docs/fleet.md)."""
    if environ.get(AUTH_MODE_VAR, "").strip().lower() == "token":
        return None
    return (
        f"warning: Ray token authentication is off ({AUTH_MODE_VAR} is not 'token'): whoever "
        "reaches the cluster's ports (GCS 6379, dashboard 8265, the nodes' object manager and "
        "worker ports) can run code on it; start every node and run fleet commands with "
        f"{AUTH_MODE_VAR}=token (docs/fleet.md)"
    )


def up(args: argparse.Namespace) -> int:
    _connect(args)
    options = options_from(args, dict(os.environ))
    serve.start(proxy_location="Disabled")
    serve.run(build(options), name=APP_NAME, route_prefix=None)
    gateway = serve.get_deployment_handle(GATEWAY, app_name=APP_NAME)
    wanted = options.min_replicas if options.autoscaling else options.replicas
    assert wanted is not None
    up_count = gateway.wait_hosts.remote(wanted, READY_TIMEOUT).result()
    status = gateway.status.remote().result()
    if up_count < wanted:
        raise FleetError(f"only {up_count} of {wanted} hosts came up")
    url = status["url"]
    with urllib.request.urlopen(f"{url}/api/version", timeout=10) as answer:
        answer.read()
    print(f"ready: {url} ({up_count} replicas)", flush=True)
    if (warning := ray_auth_warning(dict(os.environ))) is not None:
        print(warning, file=sys.stderr)
    if (warning := niceness_warning(status)) is not None:
        print(warning, file=sys.stderr)
    return 0


def down(args: argparse.Namespace) -> int:
    _connect(args)
    if APP_NAME in serve.status().applications:
        serve.delete(APP_NAME)
        print(f"removed {APP_NAME}")
    else:
        print(f"{APP_NAME} is not deployed")
    if not serve.status().applications:
        serve.shutdown()  # type: ignore[no-untyped-call]
    return 0


def status(args: argparse.Namespace) -> int:
    _connect(args)
    if APP_NAME not in serve.status().applications:
        raise FleetError(f"{APP_NAME} is not deployed")
    state = serve.get_deployment_handle(GATEWAY, app_name=APP_NAME).status.remote().result()
    if args.json:
        print(json.dumps(state))
        return 0
    print(f"gateway {state['url']}")
    print(f"{'REPLICA':<12} {'NODE':<14} {'UP':<4} {'ADDRESS':<26} MODELS (queued/active)")
    for host in state["hosts"]:
        models = ", ".join(
            f"{m['name']} {m['state']} ({m['queued']}/{m['active']})" for m in host["models"]
        )
        print(f"{host['replica'] or '-':<12} {(host['node'] or '-')[:12]:<14} "
              f"{'yes' if host['up'] else 'no':<4} {host['url']:<26} {models or '-'}")  # fmt: skip
    if (warning := niceness_warning(state)) is not None:
        print(warning, file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    commands = {"up": up, "down": down, "status": status}
    try:
        return commands[args.command](args)
    except FleetError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
