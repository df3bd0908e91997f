"""Seeded soak traffic against a running server (``scripts/soak.py``, ``tests/test_soak.py``).

``run_clients(soak)`` runs ``soak.clients`` concurrent clients, one keep-alive
``httpx.AsyncClient`` each, until ``soak.requests`` requests were sent or
``soak.max_seconds`` passed.  Each client draws from its own ``random.Random`` (seeded from
``soak.seed`` and its index) a mix of native ``/api/generate``, ``/api/chat``,
``/api/embed``, OpenAI ``/v1/chat/completions`` and ``/v1/completions`` requests, streaming
or not, with a random ``keep_alive`` (0, 1s, 2s, 5m, -1) and ``num_ctx`` (256, 512, 1024)
on native requests, plus ``/api/ps`` polls.  Some clients leave mid-stream after 1-3 lines
(``disconnects``, a fraction of streaming requests) or before the response
(``early_disconnects``).  A request that takes longer than ``timeout`` seconds is
abandoned and recorded as a ``"timeout"``: a hang.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

KEEP_ALIVES: tuple[Any, ...] = (0, "1s", "2s", "5m", -1)
NUM_CTXS = (256, 512, 1024)
_TEXT = "the quick brown fox jumps over a lazy dog while seven small birds sing about rivers"
WORDS = tuple(_TEXT.split(" "))
# (endpoint, weight); "/api/ps" is a GET poll.
MIX: tuple[tuple[str, int], ...] = (
    ("/api/generate", 22),
    ("/api/chat", 22),
    ("/api/embed", 10),
    ("/v1/chat/completions", 18),
    ("/v1/completions", 14),
    ("/api/ps", 6),
)
# The only 5xx the server is designed to answer under load: 503 on a full queue.
DESIGNED_5XX = ("server busy",)
# stream_error: an error object in a 200 response, or a line or body that is not JSON.
OUTCOMES = ("ok", "4xx", "5xx", "stream_error", "transport", "timeout", "disconnect")


@dataclass
class Result:
    endpoint: str
    model: str
    stream: bool
    keep_alive: Any
    outcome: str  # one of OUTCOMES
    latency: float  # seconds
    status: int = 0
    message: str = ""


@dataclass
class Soak:
    """What to send, and what came back (``results`` grows while the clients run)."""

    url: str
    models: Sequence[str]  # chat models: generate, chat, /v1
    embed_models: Sequence[str]  # embedding models: /api/embed
    requests: int
    clients: int = 16
    seed: int = 1
    timeout: float = 60.0
    max_seconds: float = 1800.0
    disconnects: float = 0.2
    early_disconnects: float = 0.03
    mix: tuple[tuple[str, int], ...] = MIX
    on_hang: Callable[[Result], None] | None = None
    results: list[Result] = field(default_factory=list)
    issued: int = 0

    def undesigned_5xx(self) -> list[Result]:
        return [
            r
            for r in self.results
            if r.outcome == "5xx" and not any(d in r.message for d in DESIGNED_5XX)
        ]

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.results)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))


def request_body(endpoint: str, model: str, stream: bool, rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 48)
    keep_alive = rng.choice(KEEP_ALIVES)
    options = {"num_ctx": rng.choice(NUM_CTXS), "num_predict": n, "seed": rng.randint(0, 9999)}
    messages = [{"role": "user", "content": _prompt(rng)}]
    if endpoint == "/api/generate":
        return {"model": model, "prompt": _prompt(rng), "stream": stream,
                "keep_alive": keep_alive, "options": options}  # fmt: skip
    if endpoint == "/api/chat":
        return {"model": model, "messages": messages, "stream": stream,
                "keep_alive": keep_alive, "options": options}  # fmt: skip
    if endpoint == "/api/embed":
        inputs = [_prompt(rng) for _ in range(rng.randint(1, 3))]
        del options["num_predict"]
        return {"model": model, "input": inputs, "keep_alive": keep_alive, "options": options}
    if endpoint == "/v1/chat/completions":
        return {"model": model, "messages": messages, "stream": stream, "max_tokens": n}
    return {"model": model, "prompt": _prompt(rng), "stream": stream, "max_tokens": n}


def error_message(text: str) -> str:
    """The message of a native or OpenAI error body (or the text itself)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:200]
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        err = err.get("message", err)
    return str(err)[:200]


def _line_error(line: str, sse: bool) -> str | None:
    """The error an in-stream NDJSON line or SSE event carries, if any."""
    if sse:
        if not line.startswith("data: ") or line == "data: [DONE]":
            return None
        line = line[len("data: ") :]
    if not line.strip():
        return None
    obj = json.loads(line)
    if isinstance(obj, dict) and "error" in obj:
        return error_message(line)
    return None


def _status_outcome(status: int) -> str:
    return "5xx" if status >= 500 else "4xx"


async def one_request(
    client: httpx.AsyncClient, endpoint: str, body: dict[str, Any], leave_after: int | None
) -> tuple[str, int, str]:
    """Send one request: ``(outcome, status, message)``.  ``leave_after``: lines of a
    stream to read before disconnecting."""
    if endpoint == "/api/ps":
        r = await client.get(endpoint)
        if r.status_code != 200:
            return _status_outcome(r.status_code), r.status_code, error_message(r.text)
        r.json()
        return "ok", 200, ""
    async with client.stream("POST", endpoint, json=body) as r:
        if r.status_code >= 400:
            text = (await r.aread()).decode(errors="replace")
            return _status_outcome(r.status_code), r.status_code, error_message(text)
        if not body.get("stream"):
            try:
                json.loads(await r.aread())
            except ValueError as exc:
                return "stream_error", r.status_code, f"unparseable body: {exc}"
            return "ok", r.status_code, ""
        sse = endpoint.startswith("/v1/")
        seen = 0
        lines = _lines(r)
        async with contextlib.aclosing(lines):
            async for line in lines:
                try:
                    message = _line_error(line.decode(), sse)
                except ValueError as exc:
                    return "stream_error", r.status_code, f"unparseable line: {exc}"
                if message is not None:
                    return "stream_error", r.status_code, message
                seen += 1
                if leave_after is not None and seen >= leave_after:
                    return "disconnect", r.status_code, ""
        return "ok", r.status_code, ""


async def _lines(response: httpx.Response) -> AsyncGenerator[bytes, None]:
    """The lines of a stream, split at "\n" only.  (httpx's ``aiter_lines`` also splits at
    U+0085, U+2028 and U+2029, which JSON text may hold unescaped, as the text of a model
    with random weights can.)"""
    buffer = b""
    async for data in response.aiter_bytes():
        buffer += data
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line
    if buffer:
        yield buffer


async def _client(soak: Soak, index: int, deadline: float) -> None:
    rng = random.Random(soak.seed * 1000 + index)
    endpoints = [e for e, _ in soak.mix]
    weights = [w for _, w in soak.mix]
    async with httpx.AsyncClient(base_url=soak.url, timeout=None) as client:
        while soak.issued < soak.requests and time.monotonic() < deadline:
            soak.issued += 1
            endpoint = rng.choices(endpoints, weights)[0]
            model = rng.choice(soak.embed_models if endpoint == "/api/embed" else soak.models)
            stream = endpoint != "/api/embed" and rng.random() < 0.5
            body = request_body(endpoint, model, stream, rng)
            leave_after: int | None = None
            leave_before: float | None = None
            roll = rng.random()
            if stream and roll < soak.disconnects:
                leave_after = rng.randint(1, 3)
            elif endpoint != "/api/ps" and roll > 1 - soak.early_disconnects:
                leave_before = rng.uniform(0.01, 1.0)
            started = time.monotonic()
            outcome, status, message = "timeout", 0, ""
            with trio.move_on_after(leave_before or soak.timeout) as scope:
                try:
                    outcome, status, message = await one_request(
                        client, endpoint, body, leave_after
                    )
                except httpx.TransportError as exc:
                    outcome, message = "transport", f"{type(exc).__name__}: {exc}"[:200]
            if scope.cancelled_caught and leave_before is not None:
                outcome = "disconnect"
            result = Result(
                endpoint, model, stream, body.get("keep_alive"), outcome,
                time.monotonic() - started, status, message,
            )  # fmt: skip
            soak.results.append(result)
            if outcome == "timeout" and soak.on_hang is not None:
                soak.on_hang(result)


async def run_clients(soak: Soak) -> None:
    """Run the clients until ``soak.requests`` were sent or ``soak.max_seconds`` passed;
    every request is bounded by ``soak.timeout``."""
    deadline = time.monotonic() + soak.max_seconds
    async with trio.open_nursery() as nursery:
        for index in range(soak.clients):
            nursery.start_soon(_client, soak, index, deadline)
