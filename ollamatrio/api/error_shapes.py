"""Each dialect's error shape, chosen one way for every route: by the route table's dialect.

The status of an error is the same on every route (:mod:`.errors`); its body is the
dialect's: Ollama's ``{"error": ...}``, OpenAI's ``{"error": {"message", "type", ...}}`` (also
for the Responses API), Anthropic's ``{"type": "error", "error": {...}}``.
"""

from __future__ import annotations

from quart import Response

from .anthropic import wire as anthropic_wire
from .errors import ErrorShape, native_error_object, response_for
from .openai import wire as openai_wire
from .table import Dialect, dialect_of

SHAPES: dict[Dialect, ErrorShape] = {
    Dialect.NATIVE: native_error_object,
    Dialect.OPENAI: openai_wire.error_object,
    Dialect.RESPONSES: openai_wire.error_object,
    Dialect.ANTHROPIC: anthropic_wire.error_object,
}


def error_for_route(path: str, exc: BaseException) -> Response:
    """The answer to ``exc`` raised while serving ``path``, in that path's dialect."""
    return response_for(exc, SHAPES[dialect_of(path)])
