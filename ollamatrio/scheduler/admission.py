"""What a request asks the scheduler for, and what it gets: the records of admission.

A :class:`ModelRequest` names the model and the options it wants loaded; a
:class:`PendingRequest` is one that waits for the placement task to find it a runner; a
:class:`Lease` is what ``Scheduler.lease`` yields once a runner is ready and a slot is held.
Plain records with synchronous transitions: the scheduler module owns the queue they sit
in, the policy module decides for them.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from ..engines.protocol import Engine
from ..gguf import GGUFInfo
from .fair_queue import Priority
from .options import LoadOptions
from .runner import Runner


@dataclass(frozen=True)
class ModelRequest:
    """What a request wants loaded.  ``options`` are the merged model + request options."""

    name: str
    model_path: str
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None  # None: keep the runner's current value
    adapters: tuple[str, ...] = ()
    projector: str | None = None
    draft: str | None = None  # a draft model's file for speculative decoding
    embedding_only: bool = False  # the model cannot generate (B13: one slot)
    embeddings: bool = False  # the request needs a runner in embedding mode
    shift: bool | None = None  # context shift (B27); None: the default for the model
    chat_template: str | None = None
    digest: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    # Whose request it is (the API key's name, else the client's address) and how urgent:
    # waiters for a slot are served round-robin between principals, weighted by ``cost``
    # (the prompt's tokens, estimated), batch behind the same principal's interactive ones.
    principal: str = ""
    priority: Priority = "interactive"
    cost: int = 1

    @property
    def key(self) -> str:
        """Runners are shared by model file (B2): one runner per file, whatever the name it
        was asked for by; a request the runner cannot serve as loaded reloads it."""
        return self.model_path


@dataclass
class Lease:
    """What ``Scheduler.lease`` yields: a ready engine and how long this request waited."""

    runner: Runner
    load_duration: float  # seconds spent waiting for a load (Ollama's load_duration)
    waited: float = 0.0  # seconds from asking to holding a slot: queue, load and slot waits

    @property
    def engine(self) -> Engine:
        assert self.runner.engine is not None
        return self.runner.engine


class PendingRequest:
    """A request waiting for the placement task to find it a runner."""

    def __init__(
        self, request: ModelRequest, info: GGUFInfo, load: LoadOptions, projector: int = 0
    ) -> None:
        self.request = request
        self.info = info
        self.load = load
        self.projector = projector  # the vision projector's predicted bytes, 0 without one
        self.draft_info: GGUFInfo | None = None  # the draft model's header, when it drafts
        self.runner: Runner | None = None  # set when attached to a (loading or ready) runner
        self.error: BaseException | None = None
        self.decided = trio.Event()
        self.evict_others = False  # B44: retry after evicting everything else
        self.oom_retried = False

    def attach(self, runner: Runner) -> None:
        self.runner = runner
        runner.add_waiter()
        self.decided.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.decided.set()
