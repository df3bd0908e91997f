"""One exception tree for the whole server.

Every error a user can see derives from :class:`OllamatrioError`; the HTTP layer maps
the families to status codes in one place.  ``trio.Cancelled`` is never caught or wrapped.
"""

from __future__ import annotations


class OllamatrioError(Exception):
    """Root of every error raised on purpose by ollamatrio."""


class InvalidRequestError(OllamatrioError):
    """The request itself is wrong (bad option type, bad name, bad duration): HTTP 400."""


class RequestTooLargeError(InvalidRequestError):
    """A request body above the limit: HTTP 413."""


class ModelNotFoundError(OllamatrioError):
    """No such model in the store, or its file is gone: HTTP 404."""


class NoSuchModelError(ModelNotFoundError):
    """No model of that name in the store at all (not one with a file gone)."""


class CapabilityError(InvalidRequestError):
    """The model lacks what the request needs (e.g. embeddings from a chat-only model): 400."""


class QueueFullError(OllamatrioError):
    """Too many requests are waiting: HTTP 503 with Ollama's exact text."""

    MESSAGE = "server busy, please try again.  maximum pending requests exceeded"

    def __init__(self, message: str = MESSAGE) -> None:
        super().__init__(message)


class GGUFError(OllamatrioError):
    """A file is not a GGUF model, is truncated, or has an implausible header."""


class RunnerError(OllamatrioError):
    """Something went wrong with a runner subprocess."""


class RunnerStartError(RunnerError):
    """The runner failed to load its model (llama.cpp's own error text when known)."""


class OutOfMemoryError(RunnerStartError):
    """Loading or running a model ran out of device or host memory."""


class RunnerCrashedError(RunnerError):
    """The runner process exited while it was serving (e.g. abort() -> SIGABRT)."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


class SchedulerClosedError(OllamatrioError):
    """The scheduler is shutting down and takes no new work."""


class ServerShuttingDownError(SchedulerClosedError):
    """Shutdown's grace period ended before the request did: HTTP 503, or the last line of
    a stream that was already under way."""

    MESSAGE = "server shutting down"

    def __init__(self, message: str = MESSAGE) -> None:
        super().__init__(message)


class InsufficientMemoryError(OllamatrioError):
    """The model cannot fit in the memory this machine has, even with nothing else loaded."""


class ModelLimitError(OllamatrioError):
    """A model cannot load because every resident model is pinned and the model count
    (``OLLAMA_MAX_LOADED_MODELS``) is reached: waiting would be forever."""


class ResponseNotFoundError(ModelNotFoundError):
    """A stored ``/v1/responses`` response that does not exist or has expired: HTTP 404 (a
    model-not-found's family, so that every dialect maps it to the same status)."""


class TransportError(OllamatrioError):
    """HTTP/1.1 to another process of the server failed: a runner's llama.cpp server, a
    fleet's host (``http1/client.py``).  Where a request meets it, its engine or the gateway
    turns it into that request's error (``RunnerClient.server_error``)."""


class PeerConnectionError(TransportError):
    """The peer could not be reached, or its connection failed, closed or broke HTTP/1.1
    framing before the response's end (it may have died)."""


class PeerStatusError(TransportError):
    """The peer answered with an HTTP error status (``body``: its answer)."""

    def __init__(self, message: str, status: int, body: bytes) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class PeerReportedError(TransportError):
    """The peer's answer reports an error (an error event in a stream, an answer that does
    not add up): its message, its HTTP-like ``code`` and its ``kind``."""

    def __init__(self, message: str, code: int = 500, kind: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind
