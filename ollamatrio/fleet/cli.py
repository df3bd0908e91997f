"""``python -m ollamatrio fleet ...``: the fleet's commands.

``fleet gateway URL...`` serves the gateway on ``OLLAMA_HOST`` (Ollama's rules and default,
``127.0.0.1:11434``) in front of the hosts listed, until SIGINT or SIGTERM; it prints one
``ready: <url> (<n> of <m> hosts up)`` line once a host can answer.

``fleet up|down|status`` deploy, remove and list a fleet on a Ray cluster
(``fleet/ray_cli.py``); they need the ``fleet`` extra (``ray[serve]``), imported only then.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from socket import socket

import trio

from ..config import Settings
from ..log import configure_logging
from ..serve import StartupError, listen
from .gateway import serve_gateway
from .gateway_hosts import parse_address

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ollamatrio fleet", description="The fleet's commands.")
    commands = parser.add_subparsers(dest="command", required=True)
    gateway = commands.add_parser(
        "gateway",
        help="serve one address (OLLAMA_HOST) in front of running ollamatrio hosts",
        description="Route each request to a host by its model: loaded hosts first, then "
        "the model's rendezvous-hashed host.",
    )
    gateway.add_argument("hosts", nargs="+", metavar="URL", help="a host: http://HOST:PORT")
    up = commands.add_parser("up", help="deploy the fleet onto a running Ray cluster")
    _address(up)
    count = up.add_mutually_exclusive_group()
    count.add_argument("--replicas", type=int, help="hosts (default 1)")
    count.add_argument("--min-replicas", type=int, help="autoscale from this many hosts")
    up.add_argument("--max-replicas", type=int, help="autoscale up to this many hosts")
    up.add_argument("--config", type=Path, help="fleet.toml: [fleet] settings, [env] of hosts")
    _address(commands.add_parser("down", help="remove the gateway, the hosts and runners"))
    status = commands.add_parser("status", help="list hosts, nodes, loaded models, queues")
    _address(status)
    status.add_argument("--json", action="store_true", help="the status as one JSON object")
    return parser


def _address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default=None, help="Ray cluster (RAY_ADDRESS, else auto)")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command != "gateway":
        try:
            from . import ray_cli
        except ImportError as exc:
            print(f"Error: fleet {args.command} needs Ray Serve: pip install "
                  f"'ollamatrio[fleet]' ({exc})", file=sys.stderr)  # fmt: skip
            return 1
        return ray_cli.run(args)
    try:
        for url in args.hosts:
            parse_address(url)
        settings = Settings.from_env(os.environ)
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings)
    try:
        with listen(settings) as listener:
            trio.run(_serve_until_signal, args.hosts, settings, listener)
    except StartupError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve_until_signal(hosts: list[str], settings: Settings, listener: socket) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_on_signal, stop)
        running = await nursery.start(
            lambda task_status: serve_gateway(
                hosts, settings, shutdown_trigger=stop.wait, listener=listener,
                task_status=task_status,
            )
        )  # fmt: skip
        log.info("fleet gateway listening on %s for %d hosts", running.url, len(hosts))
        # Ready once a host can answer: until then every request would be refused.
        while not running.table.up():
            await running.table.wait_changed()
        up = len(running.table.up())
        print(f"ready: {running.url} ({up} of {len(hosts)} hosts up)", flush=True)


async def _set_on_signal(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            stop.set()
            return
