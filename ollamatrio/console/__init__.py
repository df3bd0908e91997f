"""The console: a page in the browser (``GET /ui``) that shows what the server is doing.

Static files shipped in the package (``static/``: HTML, CSS and plain JavaScript modules, no
build step, nothing fetched from elsewhere); the page reads the server's own API
(``/api/ps``, ``/api/events``, ``/metrics``, ``/api/tags``) and acts through it
(docs/console.md).  This module only serves the files: answered at once, like the liveness
routes, so the page comes up before the API app is built.
"""

from __future__ import annotations

from .assets import PREFIX, answer_console, console_asset

__all__ = ["PREFIX", "answer_console", "console_asset"]
