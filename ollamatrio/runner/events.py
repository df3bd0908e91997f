"""What a runner tells its client on stdout: the records of its event lines.

A spare runner (``--spare FOLDER``) first writes :data:`SPARE_LINE` once its imports are
done.  Then every runner writes exactly one line: :class:`RunnerReady` (loaded, serving on
its socket) or :class:`RunnerFailed`.  The runner writes them with ``to_json``; the client
(``engines/handshake.py``) parses a line once with :func:`read_event`, which names a
malformed line in its error.  Both sides import this module, so the two cannot drift.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ollamatrio.runner.options import LoadPlan

SPARE_FLAG = "--spare"  # followed by the spare's folder, made by its keeper
SPARE_LINE = b'{"event":"spare"}\n'  # one write, shorter than a pipe's atomic size


class MalformedEventError(ValueError):
    """A line on the runner's stdout that is no event of this protocol."""

    def __init__(self, line: bytes | str, reason: str) -> None:
        text = line if isinstance(line, bytes) else line.encode()
        super().__init__(f"runner printed an unexpected line ({reason}): {text[:200]!r}")


@dataclass(frozen=True)
class RunnerMemory:
    """What the loaded runner measured of itself (``runner/measure.py``), in bytes."""

    rss: int = 0
    uss: int = 0
    vram_by_gpu: Mapping[str, int] = field(default_factory=dict)  # GpuInfo.id -> bytes


@dataclass(frozen=True)
class RunnerReady:
    """The model is loaded and llama.cpp's server listens on ``socket``."""

    socket: str
    pid: int
    context_length: int  # per slot, as llama.cpp really allocated it
    memory: RunnerMemory = field(default_factory=RunnerMemory)
    load_seconds: float = 0.0
    # When each stretch of the start ended (time.monotonic, the same clock in both processes).
    marks: Mapping[str, float] = field(default_factory=dict)
    plan: LoadPlan | None = None  # the load parameters llama.cpp got
    threads: int = 0  # the engine's CPU threads (0: unknown)
    # Whether the runner obeys ``{"threads": n}`` lines on its stdin (runner/threads.py).
    thread_control: bool = False

    def to_json(self) -> str:
        return json.dumps({"event": "ready", **dataclasses.asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> RunnerReady:
        event = read_event(text)
        if not isinstance(event, RunnerReady):
            raise MalformedEventError(text, "not a ready line")
        return event


@dataclass(frozen=True)
class RunnerFailed:
    """The runner could not load the model (``oom``: for want of memory)."""

    error: str
    oom: bool = False

    def to_json(self) -> str:
        return json.dumps({"event": "error", **dataclasses.asdict(self)}, separators=(",", ":"))


def read_event(line: str | bytes) -> RunnerReady | RunnerFailed:
    """The record of one event line; :class:`MalformedEventError` for anything else."""
    try:
        raw = json.loads(line)
    except ValueError:
        raise MalformedEventError(line, "not JSON") from None
    if not isinstance(raw, dict):
        raise MalformedEventError(line, "not an object")
    kind = raw.pop("event", None)
    try:
        if kind == "ready":
            return _ready(raw)
        if kind == "error":
            return RunnerFailed(
                error=str(raw.get("error") or "unknown error"), oom=bool(raw.get("oom"))
            )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise MalformedEventError(line, f"a bad {kind} event: {exc!r}") from None
    raise MalformedEventError(line, f"unknown event {kind!r}")


def _ready(raw: dict[str, Any]) -> RunnerReady:
    memory = raw.get("memory") or {}
    plan = raw.get("plan")
    return RunnerReady(
        socket=str(raw["socket"]),
        pid=int(raw["pid"]),
        context_length=int(raw["context_length"]),
        memory=RunnerMemory(
            rss=int(memory.get("rss") or 0),
            uss=int(memory.get("uss") or 0),
            vram_by_gpu={str(k): int(v) for k, v in (memory.get("vram_by_gpu") or {}).items()},
        ),
        load_seconds=float(raw.get("load_seconds") or 0.0),
        marks={str(k): float(v) for k, v in (raw.get("marks") or {}).items()},
        plan=None
        if plan is None
        else LoadPlan(**{**plan, "warnings": tuple(plan.get("warnings", ()))}),
        threads=int(raw.get("threads") or 0),
        thread_control=bool(raw.get("thread_control")),
    )
