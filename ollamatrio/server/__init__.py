"""The HTTP layer: Ollama's native API on Quart-Trio, errors mapped to statuses in one place."""

from .app import create_app as create_app

__all__ = ["create_app"]
