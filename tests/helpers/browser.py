"""A real browser for the console's tests: Debian's Chromium driven by Playwright for Python
(its sync API, in a worker thread, while the server runs in the test's Trio loop).

No browser is downloaded: Playwright's wheel brings its driver, and the system's Chromium
(``apt-get install chromium``) is launched through ``executable_path``.  Without either, the
tests marked ``browser`` skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import trio

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Page

T = TypeVar("T")

_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    """The system's Chromium: ``OLLAMATRIO_CHROMIUM``, else the first on ``PATH``."""
    given = os.environ.get("OLLAMATRIO_CHROMIUM")
    if given:
        return given if os.access(given, os.X_OK) else None
    for name in _CANDIDATES:
        found = shutil.which(name) or (
            f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None
        )
        if found:
            return found
    return None


def no_browser_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright)"
    if chromium_path() is None:
        return "no Chromium installed (apt-get install chromium)"
    return None


@dataclass
class Problems:
    """What the page complained of: console errors and uncaught exceptions."""

    errors: list[str] = field(default_factory=list)

    def console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text} ({message.location})")

    def page_error(self, error: Exception) -> None:
        self.errors.append(f"page: {error}")


@contextmanager
def open_page(
    url: str, *, color_scheme: str = "light", ready: bool = True, **context: Any
) -> Iterator[tuple[Page, Problems]]:
    """A fresh headless Chromium on ``url``'s console (once it has read the server, unless
    ``ready`` is false), and the problems it reports."""
    from playwright.sync_api import sync_playwright

    problems = Problems()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            page = browser.new_page(color_scheme=color_scheme, **context)  # type: ignore[arg-type]
            page.on("console", problems.console)
            page.on("pageerror", problems.page_error)
            page.set_default_timeout(15_000)
            page.goto(url + "/ui")
            if ready:
                page.wait_for_selector("body[data-ready=true]")
            yield page, problems
            page.close()
        finally:
            browser.close()


def wait_until(page: Page, expression: str, timeout: float = 15.0) -> None:
    """Poll ``expression`` until it is true.  (Playwright's ``wait_for_function`` evaluates
    its predicate with ``eval`` inside the page, which the console's policy forbids;
    ``page.evaluate`` goes through the debugger protocol instead.)"""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"never true: {expression}")
        time.sleep(0.05)


async def in_browser(scenario: Callable[[], T]) -> T:
    """Run ``scenario`` (which drives the browser) in a worker thread; the server keeps
    running in this Trio loop, and the scenario reaches it with ``trio.from_thread``."""
    return await trio.to_thread.run_sync(scenario)
