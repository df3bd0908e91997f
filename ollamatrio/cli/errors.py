"""The command line's errors (no HTTP client here: ``serve`` never imports one)."""

from __future__ import annotations


class CLIError(Exception):
    """A failure to report as ``Error: <message>`` with exit status 1."""


class ServerError(CLIError):
    """The server answered with an error; ``status`` is 0 for an error line mid-stream."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
