"""The API dialects (native ``/api``, OpenAI ``/v1``), their routes and the Quart-Trio app that
serves them; errors become statuses in one place (:mod:`.errors`)."""

from .app import create_app as create_app

__all__ = ["create_app"]
