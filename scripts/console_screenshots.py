#!/usr/bin/env python3
"""Take the console's screenshots for docs/console.md: light and dark, with SmolLM2 loaded,
an answer in the playground and a minute of chart history.

A real server (scripts/console_server.py) serves SmolLM2; a few chats from another client
feed the charts, then one is asked from the page's own playground, and the system's
Chromium (Playwright, headless) saves ``docs/console-light.png`` and ``docs/console-dark.png``
(and a phone-width one, ``docs/console-phone.png``).

    .venv/bin/python scripts/console_screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import httpx
from console_server import MODEL, ROOT, chromium, serving
from playwright.sync_api import Page, expect, sync_playwright

QUESTION = "Name three colours of the rainbow."


def chat(url: str, stop: threading.Event) -> None:
    """Another client's chats, one every few seconds, so the charts have a history."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}]}
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            client.post("/api/chat", json={**body, "stream": False, "options": {"num_predict": 48}})
            stop.wait(3)


def ask(page: Page) -> None:
    page.select_option("#chat-model", f"{MODEL}:latest")
    page.fill("#chat-input", QUESTION)
    page.click("#chat-send")
    expect(page.locator("#chat-stats")).to_contain_text("tokens/s", timeout=60_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--history", type=float, default=40, help="seconds of chart history")
    args = parser.parse_args()
    with serving(OLLAMA_KEEP_ALIVE="30m") as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True)
        stop = threading.Event()
        feeder = threading.Thread(target=chat, args=(server.url, stop))
        try:
            pages = {}
            for scheme in ("light", "dark"):
                page = browser.new_page(
                    color_scheme=scheme, viewport={"width": 1280, "height": 900}
                )
                page.goto(server.url + "/ui")
                page.wait_for_selector("body[data-ready=true]")
                pages[scheme] = page
            # Loaded while the pages watch: the load's events are in their logs.
            httpx.post(server.url + "/api/generate", json={"model": MODEL}, timeout=120)
            feeder.start()
            time.sleep(args.history)
            stop.set()
            feeder.join()
            for scheme, page in pages.items():
                ask(page)
                time.sleep(5.5)  # one more reading of /metrics
                page.screenshot(path=args.out / f"console-{scheme}.png", full_page=True)
            phone = browser.new_page(color_scheme="light", viewport={"width": 390, "height": 844})
            phone.goto(server.url + "/ui")
            phone.wait_for_selector("body[data-ready=true]")
            expect(phone.locator("li.model")).to_have_count(1)
            phone.screenshot(path=args.out / "console-phone.png")
        finally:
            stop.set()
            if feeder.is_alive():
                feeder.join()
            browser.close()
    for name in ("light", "dark", "phone"):
        print(args.out / f"console-{name}.png")


if __name__ == "__main__":
    main()
