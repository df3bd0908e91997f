"""``python -m ollamatrio fleet ...``: the fleet's commands.

Today one: ``fleet gateway URL...`` serves the gateway on ``OLLAMA_HOST`` (Ollama's rules and
default, ``127.0.0.1:11434``) in front of the hosts listed, until SIGINT or SIGTERM; it prints
one ``ready: <url> (<n> of <m> hosts up)`` line once a host can answer.  The
``fleet up|down|status`` commands that deploy hosts with Ray Serve are not built yet
(docs/fleet.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
