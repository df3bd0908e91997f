#!/usr/bin/env python3
"""What the console costs the server: its CPU with one console open and idle, and while a
stream runs, each against the same without a console.

A real server (scripts/console_server.py: ``python -m ollamatrio serve`` with SmolLM2) and
the system's Chromium (Playwright, headless).  Four phases of ``--seconds`` each:

* idle, no console;
* idle, one console open (``/ui``: its event stream, ``/api/ps`` and ``/metrics`` every
  5 s, the countdowns drawn in the page);
* streaming, no console: one ``/api/chat`` stream after another (``--tokens`` each);
* streaming, one console open.

Reported per phase: the server process's CPU (user + system, as a share of one core; the
runner process that generates is not counted, its work is the same with or without a
console), the tokens streamed, and the requests the console made per minute.

    .venv/bin/python scripts/bench_console.py [--seconds 30] [--tokens 128]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import httpx
import psutil
from console_server import MODEL, chromium, serving
from playwright.sync_api import Browser, Page, sync_playwright


@dataclass
class Phase:
    name: str
    cpu: float  # share of one core
    tokens: int
    console_requests_per_minute: float | None


class Streams:
    """One chat stream after another, in a thread, counting the tokens."""

    def __init__(self, url: str, tokens: int) -> None:
        self.url = url
        self.body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
            "options": {"num_predict": tokens},
        }
        self.tokens = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=300) as client:
            while not self._stop.is_set():
                with client.stream("POST", "/api/chat", json=self.body) as response:
                    for line in response.iter_lines():
                        if line and '"done":false' in line.replace(" ", ""):
                            self.tokens += 1

    def __enter__(self) -> Streams:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def console(browser: Browser, url: str) -> Iterator[tuple[Page, list[str]]]:
    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(url + "/ui")
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_timeout(2000)  # its first readings done
    requests.clear()
    try:
        yield page, requests
    finally:
        page.close()


def measure(
    name: str, server: psutil.Process, seconds: float, browser: Browser, url: str,
    *, with_console: bool, streams: Streams | None,
) -> Phase:  # fmt: skip
    opened = console(browser, url) if with_console else nullcontext(None)
    with opened as held, streams or nullcontext():
        if streams is not None:
            time.sleep(2)  # past the first stream's start
            streams.tokens = 0
        before = server.cpu_times()
        started = time.monotonic()
        if held is not None:
            held[0].wait_for_timeout(seconds * 1000)  # lets Playwright count the requests
        else:
            time.sleep(seconds)
        after = server.cpu_times()
        wall = time.monotonic() - started
        tokens = streams.tokens if streams is not None else 0
        rate = len(held[1]) * 60 / wall if held is not None else None
    cpu = (after.user - before.user + after.system - before.system) / wall
    return Phase(name, cpu, tokens, rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    with serving(OLLAMA_KEEP_ALIVE="-1") as srv, sync_playwright() as p:
        httpx.post(srv.url + "/api/generate", json={"model": MODEL}, timeout=120)
        server = psutil.Process(srv.pid)
        browser = p.chromium.launch(executable_path=chromium(), headless=True)
        try:
            phases = [
                measure("idle", server, args.seconds, browser, srv.url,
                        with_console=False, streams=None),
                measure("idle, console open", server, args.seconds, browser, srv.url,
                        with_console=True, streams=None),
                measure("streaming", server, args.seconds, browser, srv.url,
                        with_console=False, streams=Streams(srv.url, args.tokens)),
                measure("streaming, console open", server, args.seconds, browser, srv.url,
                        with_console=True, streams=Streams(srv.url, args.tokens)),
            ]  # fmt: skip
        finally:
            browser.close()
    columns = ("server CPU", "tokens", "CPU ms/token", "console req/min")
    print(f"{'phase':<26} {columns[0]:>11} {columns[1]:>7} {columns[2]:>13} {columns[3]:>16}")
    for phase in phases:
        per_token = f"{1000 * phase.cpu * args.seconds / phase.tokens:.3f}" if phase.tokens else "–"
        requests = (
            f"{phase.console_requests_per_minute:.1f}"
            if phase.console_requests_per_minute is not None
            else "–"
        )
        cpu = f"{100 * phase.cpu:.2f}%"
        print(f"{phase.name:<26} {cpu:>11} {phase.tokens:>7} {per_token:>13} {requests:>16}")


if __name__ == "__main__":
    main()
