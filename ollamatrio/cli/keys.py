"""``ollamatrio keys create|list|revoke``: the API keys, managed without a server.

They open the key table in the server's state folder, found from the same environment as the
server (``OLLAMATRIO_DATA``, else beside ``OLLAMA_MODELS``); a running server sees a change
within a second.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TextIO

from ollamatrio.auth.keys import SCOPES, SECRET_PREFIX, KeyRequestError, KeyStore, Limits

from .errors import CLIError
from .humanize import human_time, render_table


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    """``keys`` and its three commands, added by ``add`` (the commands' ``add_parser``)."""
    p = add("keys", help="Manage API keys (OLLAMATRIO_AUTH=required)")
    keys = p.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)
    c = keys.add_parser("create", help="Create an API key and print its secret once")
    c.add_argument("name", metavar="NAME")
    c.add_argument(
        "--scope", action="append", choices=SCOPES, required=True, dest="scopes",
        help="What the key may do (repeat for several)",
    )  # fmt: skip
    c.add_argument("--rpm", type=int, default=0, help="Requests per minute (0: no limit)")
    c.add_argument("--tpm", type=int, default=0, help="Tokens per minute (0: no limit)")
    c.add_argument("--concurrency", type=int, default=0, help="Requests at once (0: no limit)")
    keys.add_parser("list", help="List API keys", aliases=["ls"])
    r = keys.add_parser("revoke", help="Revoke an API key", aliases=["rm"])
    r.add_argument("name", metavar="NAME")


def run(store: KeyStore, args: argparse.Namespace, out: TextIO = sys.stdout) -> None:
    command = {"ls": "list", "rm": "revoke"}.get(args.keys_command, args.keys_command)
    if command == "create":
        create(store, args.name, args.scopes, Limits(args.rpm, args.tpm, args.concurrency), out)
    elif command == "list":
        list_keys(store, out)
    else:
        revoke(store, args.name, out)


def create(store: KeyStore, name: str, scopes: Sequence[str], limits: Limits, out: TextIO) -> None:
    try:
        key, secret = store.create(name, scopes, limits)
    except KeyRequestError as exc:
        raise CLIError(str(exc)) from exc
    out.write(f"{secret}\n")
    out.write(
        f"Key {key.name!r} ({', '.join(sorted(key.scopes))}) created: store this secret now, "
        "it will not be shown again.\n"
    )


def list_keys(store: KeyStore, out: TextIO, now: datetime | None = None) -> None:
    """NAME, PREFIX, SCOPES, RPM, TPM, CONCURRENCY, CREATED, LAST USED."""
    rows = [
        [
            key.name,
            SECRET_PREFIX + key.prefix,
            ",".join(sorted(key.scopes)),
            _limit(key.limits.rpm),
            _limit(key.limits.tpm),
            _limit(key.limits.concurrency),
            human_time(_when(key.created_at), "Never", now),
            human_time(_when(key.last_used_at), "Never", now),
        ]
        for key in store.list()
    ]
    headers = ["NAME", "PREFIX", "SCOPES", "RPM", "TPM", "CONCURRENCY", "CREATED", "LAST USED"]
    out.write(render_table(rows, headers))


def revoke(store: KeyStore, name: str, out: TextIO) -> None:
    if not store.revoke(name):
        raise CLIError(f"no API key named {name!r}")
    out.write(f"revoked '{name}'\n")


def _limit(value: int) -> str:
    return str(value) if value else "-"


def _when(at: float | None) -> datetime | None:
    return None if at is None else datetime.fromtimestamp(at, UTC)
