"""``GET /metrics``: the server's Prometheus series, and every ready runner's own.

Where the numbers come from (docs/metrics.md lists every series); none costs anything per
token:

* scheduler events, through a synchronous listener on ``sched.events``: loads, load times,
  evictions;
* one observation per request, when it ends: status, queue wait, time to first token and
  the final chunk's token counts;
* reads at scrape time: queue depth, runners by state and memory from the scheduler, and
  each ready runner's llama.cpp ``/metrics``, fetched concurrently (each within
  :data:`RUNNER_SCRAPE_TIMEOUT`, the result cached for :data:`RUNNER_SCRAPE_TTL`) and
  re-exported with ``model`` and ``mode`` labels.

Each server has its own :class:`CollectorRegistry`: tests run many servers in one process.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ..errors import OllamatrioError
from ..scheduler.runner import RunnerState

if TYPE_CHECKING:
    from ..generation.relay import Generation
    from ..scheduler import Lease, Scheduler
    from ..scheduler.events import SchedulerEvent
    from ..scheduler.runner import Runner

log = logging.getLogger(__name__)

RUNNER_SCRAPE_TIMEOUT = 0.5  # seconds one runner's /metrics may take; then it is skipped
RUNNER_SCRAPE_TTL = 1.0  # a burst of scrapes within this costs one round trip per runner

#: What ``generate_latest`` writes (legacy metric names): the classic text format, which
#: every Prometheus reads.  prometheus-client's CONTENT_TYPE_LATEST now says 1.0.0.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: ``status`` of a request whose client left before any answer was sent (nginx's 499).
CLIENT_CLOSED = "499"

# ``ollamatrio_evictions_total`` reasons: an ``evicting`` event's own reason (memory, count,
# request, reload, oom), ``expired`` for a keep_alive that ran out, ``crash`` for a runner
# whose process died.
_EXPIRED = "expired"
_CRASH = "crash"

_RUNNER_STATES = ("loading", "ready", "unloading")
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
_LOAD_PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    """One server's series.  ``create_app`` makes it and registers it as a listener on
    the scheduler's event hub; the request paths call :meth:`request_done` once per
    request, and :meth:`generation_done` or :meth:`lease_taken` once per lease."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "ollamatrio_requests", "HTTP requests answered, by route template and status",
            ["endpoint", "status"], registry=registry,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "ollamatrio_queue_wait_seconds",
            "Time a request waited for a runner and a slot (queue, load, busy slots)",
            buckets=_WAIT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.loads = Counter(
            "ollamatrio_loads", "Model loads, by result (ok, error, oom, abandoned)",
            ["model", "result"], registry=registry,
        )  # fmt: skip
        self.load_seconds = Histogram(
            "ollamatrio_load_seconds", "Time a successful load took",
            buckets=_LOAD_BUCKETS, registry=registry,
        )  # fmt: skip
        self.evictions = Counter(
            "ollamatrio_evictions",
            "Runners sent away, by reason (memory, count, request, reload, oom, expired, crash)",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.load_phases = Histogram(
            "ollamatrio_load_phase_seconds",
            "Seconds each phase of a successful load took (admission, spawn, interpreter, "
            "engine_import, plan, model_load, ready, handshake; docs/metrics.md)",
            ["phase"], buckets=_LOAD_PHASE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "ollamatrio_time_to_first_token_seconds",
            "Time from a generation request's arrival to its first generated content",
            ["model"], buckets=_TTFT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "ollamatrio_tokens_generated", "Tokens generated (final eval_count of each request)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "ollamatrio_prompt_tokens",
            "Prompt tokens evaluated (of generations and embeddings; reused ones not counted)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.prompt_tokens_reused = Counter(
            "ollamatrio_prompt_tokens_reused",
            "Prompt tokens reused from the runner's slot or prompt cache instead of evaluated",
            ["model"], registry=registry,
        )  # fmt: skip
        self.draft_tokens = Counter(
            "ollamatrio_draft_tokens",
            "Tokens drafted by speculative decoding (final draft_count of each request)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.draft_tokens_accepted = Counter(
            "ollamatrio_draft_tokens_accepted",
            "Drafted tokens the model accepted (final draft_accepted_count of each request)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.malformed_tool_calls = Counter(
            "ollamatrio_malformed_tool_calls",
            "Tool calls a model wrote malformed (returned to the client as text instead)",
            ["model"], registry=registry,
        )  # fmt: skip
        scrape_errors = Counter(
            "ollamatrio_runner_scrape_errors",
            "Runner /metrics fetches that failed or timed out (the runner was skipped)",
            ["model"], registry=registry,
        )  # fmt: skip
        self.runners = RunnerSeries(scheduler, scrape_errors)
        registry.register(SchedulerState(scheduler))
        scheduler.events.add_listener(self.on_event)

    # -- observations (synchronous, once per event or request) --------------------------

    def on_event(self, event: SchedulerEvent) -> None:
        if event.kind == "loaded":
            self.loads.labels(event.model, "ok").inc()
            if event.seconds is not None:
                self.load_seconds.observe(event.seconds)
            for phase, seconds in (event.phases or {}).items():
                self.load_phases.labels(phase).observe(seconds)
        elif event.kind == "load_failed":
            self.loads.labels(event.model, event.reason or "error").inc()
        elif event.kind == "evicting":
            self.evictions.labels(event.reason or "request").inc()
        elif event.kind == "expired":
            self.evictions.labels(_EXPIRED).inc()
        elif event.kind == "crashed":
            self.evictions.labels(_CRASH).inc()

    def request_done(self, endpoint: str, status: int | None) -> None:
        self.requests.labels(endpoint, CLIENT_CLOSED if status is None else str(status)).inc()

    def lease_taken(self, lease: Lease) -> None:
        self.queue_wait.observe(lease.waited)

    def tokens_counted(self, model: str, prompt: int, generated: int = 0, reused: int = 0) -> None:
        """``prompt`` counts the tokens evaluated, ``reused`` those taken from a cache."""
        if prompt:
            self.prompt_tokens.labels(model).inc(prompt)
        if reused:
            self.prompt_tokens_reused.labels(model).inc(reused)
        if generated:
            self.tokens.labels(model).inc(generated)

    def generation_done(self, gen: Generation) -> None:
        """A generation's request ended (completed, failed or cut): its wait, TTFT, and
        the final chunk's counts if it got that far."""
        self.lease_taken(gen.lease)
        if gen.first_content_at is not None:
            self.ttft.labels(gen.lease.runner.name).observe(gen.first_content_at - gen.started)
        if gen.final is not None:
            final = gen.final
            cached = final.prompt_cached_count
            self.tokens_counted(
                gen.lease.runner.name, final.prompt_eval_count - cached, final.eval_count, cached
            )
            if final.draft_count is not None:
                self.draft_tokens.labels(gen.lease.runner.name).inc(final.draft_count)
                self.draft_tokens_accepted.labels(gen.lease.runner.name).inc(
                    final.draft_accepted_count or 0
                )
            if final.malformed_tool_calls:
                self.malformed_tool_calls.labels(gen.lease.runner.name).inc(
                    final.malformed_tool_calls
                )

    # -- the scrape ---------------------------------------------------------------------

    async def render(self) -> bytes:
        """The whole exposition, runner series included (fetched at most once per TTL)."""
        await self.runners.refresh()
        return generate_latest(self.registry) + self.runners.text


class SchedulerState(Collector):
    """Collector: gauges read from the scheduler at scrape time."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterable[Metric]:
        sched = self._scheduler
        depth = GaugeMetricFamily(
            "ollamatrio_queue_depth", "Requests waiting for a model: its load, room or a slot",
            labels=["model"],
        )  # fmt: skip
        for model, n in sorted(sched.queue_depth().items()):
            depth.add_metric([model], n)
        yield depth

        states = dict.fromkeys(_RUNNER_STATES, 0)
        for info in sched.ps():
            states[info.state] = states.get(info.state, 0) + 1
        runners = GaugeMetricFamily("ollamatrio_runners", "Runners by state", labels=["state"])
        for state, n in states.items():
            runners.add_metric([state], n)
        yield runners

        memory = GaugeMetricFamily(
            "ollamatrio_memory_bytes",
            "Memory of loaded models per device (a GPU id or cpu): predicted is what "
            "placement booked, measured what the runner reported once loaded",
            labels=["model", "device", "kind"],
        )
        # A model with a chat and an embedding runner is one model: their bytes add up.
        totals: dict[tuple[str, str, str], int] = {}
        for runner in sched.runners():
            _add_memory(totals, runner)
        for labels, value in sorted(totals.items()):
            memory.add_metric(list(labels), value)
        yield memory

        threads = GaugeMetricFamily(
            "ollamatrio_runner_threads",
            "CPU threads each loaded model may use now: the cores divided among the "
            "runners that generate",
            labels=["model"],
        )
        counts: dict[str, int] = {}  # a chat and an embedding runner of one model add up
        for info in sched.ps():
            if info.threads:
                counts[info.name] = counts.get(info.name, 0) + info.threads
        for model, count in sorted(counts.items()):
            threads.add_metric([model], count)
        yield threads

        held = GaugeMetricFamily(
            "ollamatrio_prompt_cache_bytes",
            "Host RAM each loaded model's prompt cache holds now (booked beside the model, "
            "not in ollamatrio_memory_bytes)",
            labels=["model"],
        )
        limit = GaugeMetricFamily(
            "ollamatrio_prompt_cache_limit_bytes",
            "Host RAM each loaded model's prompt cache may grow to (llama.cpp's cache_ram_mib; "
            "it grows only into memory no model has booked)",
            labels=["model"],
        )
        by_model: dict[str, tuple[int, int]] = {}
        for info in sched.ps():
            was_held, was_limit = by_model.get(info.name, (0, 0))
            by_model[info.name] = (
                was_held + info.prompt_cache,
                was_limit + info.prompt_cache_limit,
            )
        for model, (nbytes, most) in sorted(by_model.items()):
            held.add_metric([model], nbytes)
            limit.add_metric([model], most)
        yield held
        yield limit


def _add_memory(totals: dict[tuple[str, str, str], int], runner: Runner) -> None:
    def add(device: str, kind: str, nbytes: int) -> None:
        key = (runner.name, device, kind)
        totals[key] = totals.get(key, 0) + nbytes

    placement = runner.placement
    add("cpu", "predicted", placement.host_bytes)
    for gpu, nbytes in placement.vram_by_gpu.items():
        add(gpu, "predicted", nbytes)
    if runner.engine is not None:  # loaded: runner.memory is what it measured
        measured = runner.memory
        add("cpu", "measured", measured.total - measured.vram)
        for gpu, nbytes in measured.vram_by_gpu.items():
            add(gpu, "measured", nbytes)


class RunnerSeries(Collector):
    """Every ready runner's own series (llama.cpp's ``/metrics``), with ``model`` and
    ``mode`` (generate or embedding) labels added.  :meth:`refresh` fetches them and
    renders :attr:`text` once, so the scrapes that share a fetch only copy bytes; a runner
    that fails or is slow is skipped and counted in ``scrape_errors``."""

    def __init__(
        self, scheduler: Scheduler, scrape_errors: Counter, *,
        timeout: float = RUNNER_SCRAPE_TIMEOUT, ttl: float = RUNNER_SCRAPE_TTL,
    ) -> None:  # fmt: skip
        self._scheduler = scheduler
        self._errors = scrape_errors
        self.timeout = timeout
        self.ttl = ttl
        self._families: list[Metric] = []
        self.text = b""  # the families in the exposition format
        # Each runner's last text and its parse: an idle runner's text does not change.
        self._parsed: dict[Runner, tuple[str, list[Metric]]] = {}
        self._fresh_until = -math.inf
        self._fetched_from: list[Runner] = []  # the ready runners of the last fetch
        self._refreshing: trio.Event | None = None

    def collect(self) -> Iterable[Metric]:  # the collector protocol, to render text
        return self._families

    async def refresh(self) -> None:
        """Fetch again unless the last fetch is younger than the TTL and covered the same
        ready runners (a model that just loaded shows up at once)."""
        ready = [
            r for r in self._scheduler.runners()
            if r.state is RunnerState.READY and r.engine is not None
        ]  # fmt: skip
        if trio.current_time() < self._fresh_until and ready == self._fetched_from:
            return
        if self._refreshing is not None:  # another scrape is fetching: share its result
            await self._refreshing.wait()
            return
        done = self._refreshing = trio.Event()
        try:
            fetched: list[tuple[Runner, list[Metric]]] = []
            async with trio.open_nursery() as nursery:
                for runner in ready:
                    nursery.start_soon(self._fetch, runner, fetched)
            self._families = _merge(fetched)
            self.text = generate_latest(self)
            self._parsed = {r: self._parsed[r] for r in ready if r in self._parsed}
            self._fetched_from = ready
            self._fresh_until = trio.current_time() + self.ttl
        finally:
            self._refreshing = None
            done.set()

    async def _fetch(self, runner: Runner, into: list[tuple[Runner, list[Metric]]]) -> None:
        assert runner.engine is not None
        with trio.move_on_after(self.timeout):
            try:
                text = await runner.engine.metrics()
                last = self._parsed.get(runner)
                if last is None or last[0] != text:
                    last = self._parsed[runner] = (text, list(text_string_to_metric_families(text)))
                into.append((runner, last[1]))
                return
            except (OllamatrioError, ValueError) as exc:  # ValueError: unparsable text
                log.debug("metrics of runner %s skipped: %s", runner.name, exc)
        self._errors.labels(runner.name).inc()


def _merge(fetched: list[tuple[Runner, list[Metric]]]) -> list[Metric]:
    """One family per name (a name may appear once in an exposition), each runner's
    samples labelled with its model and mode."""
    merged: dict[str, Metric] = {}
    for runner, families in sorted(fetched, key=lambda f: (f[0].name, f[0].key)):
        extra = {"model": runner.name, "mode": "embedding" if runner.spec.embedding else "generate"}
        for family in families:
            out = merged.get(family.name)
            if out is None:
                out = Metric(family.name, family.documentation, family.type, family.unit)
                merged[family.name] = out
            out.samples.extend(s._replace(labels={**s.labels, **extra}) for s in family.samples)
    return list(merged.values())
