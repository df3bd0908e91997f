"""The API dialects (native ``/api``, OpenAI ``/v1``), their routes and the Quart-Trio app that
serves them; errors become statuses in one place (:mod:`.errors`).

``create_app`` is looked up on first use: importing a module of this package (the start-up
path imports :mod:`.lazy`) must not import Quart."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app as create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
