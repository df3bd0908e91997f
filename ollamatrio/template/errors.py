"""A template's errors: :class:`TemplateError`, its message naming line and column."""

from __future__ import annotations

from ..errors import InvalidRequestError


class TemplateError(InvalidRequestError):
    """A template that cannot be parsed or executed (a 400, with the position)."""


def _position(source: str, pos: int) -> str:
    line = source.count("\n", 0, pos) + 1
    column = pos - (source.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}"


def error_at(source: str, pos: int, message: str) -> TemplateError:
    return TemplateError(f"template: {_position(source, pos)}: {message}")
