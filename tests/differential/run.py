"""Send the corpus to both servers and reduce each answer (:mod:`shapes`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
from corpus import CORPUS, Case, names
from shapes import Reduced, content_type, differences, error_text, reduce_body

# A generation here takes well under a second; a load a few.  Generous for a busy machine.
TIMEOUT = httpx.Timeout(120.0)


@dataclass
class Compared:
    case: str
    ours: Reduced
    theirs: Reduced
    seconds: tuple[float, float]  # ours, theirs

    @property
    def differences(self) -> list[tuple[str, object, object]]:
        return differences(self.ours, self.theirs)


def send(client: httpx.Client, base: str, case: Case) -> Reduced:
    content = case.raw if case.raw is not None else (
        json.dumps(case.body).encode() if case.body is not None else None
    )  # fmt: skip
    headers = dict(case.headers)
    if content is not None:
        headers.setdefault("Content-Type", "application/json")
    response = client.request(case.method, base + case.path, content=content, headers=headers)
    media = content_type(response.headers.get("content-type", ""))
    body, parsed = reduce_body(media.split(";")[0], response.content)
    values = case.values(parsed) if case.values is not None and response.is_success else {}
    if response.status_code >= 400:
        values["error"] = parsed if isinstance(parsed, str) else error_text(parsed)
    elif (
        isinstance(parsed, list)
        and parsed
        and isinstance(parsed[-1], dict)
        and ("error" in parsed[-1])
    ):  # a stream that failed after its 200
        values["error"] = error_text(parsed[-1])
    headers_seen = {k.lower(): v for k, v in response.headers.items()}
    headers_seen["content-type"] = media
    return Reduced(response.status_code, headers_seen, body, values)


def _state_cases(after: str) -> list[Case]:
    return [
        Case(f"{after} → /api/ps", "GET", "/api/ps", values=names),
        Case(f"{after} → /api/tags", "GET", "/api/tags", values=names),
    ]


def wait_unloaded(client: httpx.Client, base: str, model: str, seconds: float = 30.0) -> None:
    """Until ``model`` is off the reference's ``/api/ps``.  Polled: the reference is another
    process, with nothing to wait on but its answers."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        listed = client.get(base + "/api/ps").json().get("models") or []
        if model not in {m.get("name") for m in listed}:
            return
        time.sleep(0.05)
    raise AssertionError(f"the reference still lists {model} {seconds:.0f} s after unloading it")


def run_corpus(ours: str, theirs: str) -> list[Compared]:
    """Each step to the reference first, then to ours; state checks after marked steps."""
    out: list[Compared] = []
    with httpx.Client(timeout=TIMEOUT) as client:
        for case in CORPUS:
            for step in [case, *(_state_cases(case.name) if case.state else [])]:
                started = time.monotonic()
                theirs_reduced = send(client, theirs, step)
                middle = time.monotonic()
                ours_reduced = send(client, ours, step)
                seconds = (time.monotonic() - middle, middle - started)
                out.append(Compared(step.name, ours_reduced, theirs_reduced, seconds))
                if step.unloads:
                    wait_unloaded(client, theirs, step.unloads)
    return out
