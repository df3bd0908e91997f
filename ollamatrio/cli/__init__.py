"""The ``ollamatrio`` command line: Ollama's commands, talking to a server over HTTP.

Every command except ``serve`` is a client of a running server, found through
``OLLAMA_HOST`` exactly as Ollama's CLI finds its server.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ollamatrio.config import Settings, parse_duration

from . import commands, keys
from .errors import CLIError

if TYPE_CHECKING:  # the HTTP client (httpx) loads for the client commands only, not serve
    from .client import Client

Handler = Callable[["Client", argparse.Namespace], int | None]

_THINK_LEVELS = ("high", "medium", "low")


def _keep_alive(text: str | None) -> str | int | None:
    """``--keepalive``: a Go duration; negative means "keep forever" (sent as -1)."""
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    return -1 if seconds < 0 or math.isinf(seconds) else text


def _think(text: str | None) -> bool | str | None:
    if text is None:
        return None
    value = text.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    if value in _THINK_LEVELS:
        return value
    raise CLIError(
        f"invalid value for --think: {text!r} (must be true, false, high, medium, or low)"
    )


def _cmd_run(client: Client, args: argparse.Namespace) -> int:
    from .run import RunOptions, run

    opts = RunOptions(
        model=args.model,
        keep_alive=_keep_alive(args.keepalive),
        format=args.format or None,
        verbose=args.verbose,
        think=_think(args.think),
        hide_thinking=args.hidethinking,
    )
    return run(client, opts, args.prompt, insecure=args.insecure)


def _cmd_show(client: Client, args: argparse.Namespace) -> None:
    chosen = [name for name in commands.SHOW_FIELDS if getattr(args, name)]
    if len(chosen) > 1:
        raise CLIError(
            "only one of '--license', '--modelfile', '--parameters', '--system', "
            "or '--template' can be specified"
        )
    commands.show(client, args.model, chosen[0] if chosen else None)


_HANDLERS: dict[str, Handler] = {
    "run": _cmd_run,
    "show": _cmd_show,
    "create": lambda c, a: commands.create(c, a.name, a.file, quantize=a.quantize),
    "pull": lambda c, a: commands.pull(c, a.model, insecure=a.insecure),
    "push": lambda c, a: commands.push(c, a.model, insecure=a.insecure),
    "list": lambda c, a: commands.list_models(c, a.prefix),
    "ps": lambda c, a: commands.list_running(c, a.prefix),
    "stop": lambda c, a: commands.stop(c, a.model),
    "rm": lambda c, a: commands.remove(c, a.models),
    "cp": lambda c, a: commands.copy(c, a.source, a.destination),
}


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The root parser and the ``run`` parser (which is re-used to parse the prompt words
    and flags in any order, as ``ollama run m --verbose hello`` allows)."""
    parser = argparse.ArgumentParser(
        prog="ollamatrio",
        description="Large language model runner (Ollama-compatible, built on Trio)",
    )
    parser.add_argument("-v", "--version", action="store_true", help="Show version information")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("serve", help="Start ollamatrio", aliases=["start"])

    p = sub.add_parser("create", help="Create a model from a Modelfile")
    p.add_argument("name", metavar="MODEL")
    p.add_argument("-f", "--file", help='Name of the Modelfile (default "Modelfile")')
    p.add_argument("-q", "--quantize", help="Quantize model to this level (e.g. q4_K_M, q8_0)")

    p = sub.add_parser("show", help="Show information for a model")
    p.add_argument("model", metavar="MODEL")
    for name in commands.SHOW_FIELDS:
        p.add_argument(f"--{name}", action="store_true", help=f"Show {name} of a model")

    p = run_parser = sub.add_parser("run", help="Run a model")
    # MODEL is checked by hand: argparse would also call the optional PROMPT "required".
    p.add_argument("model", metavar="MODEL", nargs="?")
    p.add_argument("prompt", metavar="PROMPT", nargs="*")
    p.add_argument("--keepalive", help="Duration to keep a model loaded (e.g. 5m)")
    p.add_argument("--verbose", action="store_true", help="Show timings for response")
    p.add_argument("--insecure", action="store_true", help="Use an insecure registry")
    p.add_argument("--nowordwrap", action="store_true", help="Don't wrap words to the next line")
    p.add_argument("--format", help="Response format (e.g. json)")
    p.add_argument(
        "--think",
        help="Enable thinking mode: true/false or high/medium/low (bare --think means true)",
    )
    p.add_argument("--hidethinking", action="store_true", help="Hide thinking output")

    p = sub.add_parser("stop", help="Stop a running model")
    p.add_argument("model", metavar="MODEL")

    p = sub.add_parser("pull", help="Pull a model from a registry")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--insecure", action="store_true", help="Use an insecure registry")

    p = sub.add_parser("push", help="Push a model to a registry")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--insecure", action="store_true", help="Use an insecure registry")

    p = sub.add_parser("list", help="List models", aliases=["ls"])
    p.add_argument("prefix", nargs="?", metavar="PREFIX")

    p = sub.add_parser("ps", help="List running models")
    p.add_argument("prefix", nargs="?", metavar="PREFIX")

    p = sub.add_parser("cp", help="Copy a model", aliases=["copy"])
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("destination", metavar="DESTINATION")

    p = sub.add_parser("rm", help="Remove a model", aliases=["delete"])
    p.add_argument("models", metavar="MODEL", nargs="+")

    keys.add_parser(sub.add_parser)
    return parser, run_parser


_ALIASES = {"ls": "list", "copy": "cp", "delete": "rm", "start": "serve"}


def _normalise(argv: Sequence[str]) -> list[str]:
    # Cobra's NoOptDefVal: a bare --think means --think=true; a value needs "=".
    return ["--think=true" if arg == "--think" else arg for arg in argv]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ollamatrio`` and ``python -m ollamatrio``; returns the exit status."""
    words = _normalise(sys.argv[1:] if argv is None else argv)
    parser, run_parser = build_parser()
    args, extra = parser.parse_known_args(words)
    if args.command == "run":
        # Root options take no values, so the first "run" word is the command itself.
        start = next(i for i, word in enumerate(words) if word == "run") + 1
        args = run_parser.parse_intermixed_args(
            words[start:], argparse.Namespace(version=args.version, command="run")
        )
        if args.model is None:
            run_parser.error("the following arguments are required: MODEL")
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    command = _ALIASES.get(args.command, args.command)
    try:
        if command == "serve":
            commands.serve()
            return 0
        if not args.version and command is None:
            parser.print_help()
            return 0
        try:
            settings = Settings.from_env(os.environ)
        except ValueError as exc:
            raise CLIError(str(exc)) from exc
        if command == "keys":  # the key table itself, in the server's state folder
            from ollamatrio.auth.keys import KeyStore

            keys.run(KeyStore.in_folder(settings.state_dir), args)
            return 0
        from .client import Client

        with Client(settings.base_url, api_key=api_key_from(os.environ)) as client:
            if args.version:
                commands.version(client)
                return 0
            return _HANDLERS[command](client, args) or 0
    except CLIError as exc:
        sys.stdout.flush()
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output went to a pipe that closed (e.g. `| head`): not an error of ours.
        _silence_stdout()
        return 0


def api_key_from(env: Mapping[str, str]) -> str | None:
    """The key the client commands send: OLLAMA_API_KEY, else OLLAMATRIO_API_KEY."""
    for name in ("OLLAMA_API_KEY", "OLLAMATRIO_API_KEY"):
        if key := env.get(name, "").strip():
            return key
    return None


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


__all__ = ["build_parser", "main"]
