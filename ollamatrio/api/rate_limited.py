"""The 429 of a key over one of its quotas (:mod:`..auth.quotas`), in the route's dialect.

Each with ``Retry-After``: the whole seconds until the limit allows the request.  The
bodies are the ones each provider sends for its own rate limits, so that its SDK retries
as it does there: Anthropic's ``rate_limit_error`` (the dialect's error shape for 429),
OpenAI's ``{"error": {"message", "type": "requests" | "tokens", "param": null, "code":
"rate_limit_exceeded"}}`` (the ``type`` names the limit, as OpenAI's does), and Ollama's
``{"error": "..."}``.
"""

from __future__ import annotations

from typing import Any

from quart import Response

from ..auth.quotas import Limit, OverLimit
from ..wire import JSON, JSON_UTF8, json_bytes
from .error_shapes import SHAPES
from .table import Dialect, dialect_of

STATUS = 429
OPENAI_CODE = "rate_limit_exceeded"


def openai_rate_limit_object(over: OverLimit) -> dict[str, Any]:
    kind = "tokens" if over.limit is Limit.TPM else "requests"
    return {"error": {"message": over.message, "type": kind, "param": None, "code": OPENAI_CODE}}


def rate_limited_response(path: str, over: OverLimit) -> Response:
    """The refusal of a request to ``path``."""
    dialect = dialect_of(path)
    if dialect in (Dialect.OPENAI, Dialect.RESPONSES):
        body = openai_rate_limit_object(over)
    else:
        body = SHAPES[dialect](over.message, STATUS)
    return Response(
        json_bytes(body),
        status=STATUS,
        content_type=JSON_UTF8 if dialect is Dialect.NATIVE else JSON,
        headers={"Retry-After": str(over.retry_after)},
    )
