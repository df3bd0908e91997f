"""A cold load explains itself: a real runner's load phases in the ``loaded`` event, the log
line and ``/metrics``, adding up to the load's time, and ``load_duration`` consistent with
them (the request waited for the load, and only a little longer: reading the header)."""

from __future__ import annotations

import logging

import httpx
import pytest
import trio

from ollamatrio.engines.process import LOAD_PHASES, ProcessEngineFactory, load_phases
from ollamatrio.scheduler.events import SchedulerEvent

PHASES = ("admission", *LOAD_PHASES)


async def test_a_cold_load_reports_its_phases(api_server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ollamatrio")
    loaded: list[SchedulerEvent] = []
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
        ):
            srv.scheduler.events.add_listener(
                lambda e: loaded.append(e) if e.kind == "loaded" else None
            )
            body = {"model": "tiny", "prompt": "hi", "raw": True, "stream": False,
                    "options": {"num_predict": 2}}  # fmt: skip
            answer = (await c.post("/api/generate", json=body)).json()
            metrics = (await c.get("/metrics")).text
    (event,) = loaded
    assert event.phases is not None
    assert tuple(event.phases) == PHASES
    assert all(seconds >= 0 for seconds in event.phases.values())
    assert event.seconds is not None
    assert sum(event.phases.values()) == pytest.approx(event.seconds, abs=0.005)
    assert event.phases["model_load"] > 0
    assert event.as_json()["phases"] == event.phases
    load_duration = answer["load_duration"] / 1e9
    assert sum(event.phases.values()) <= load_duration + 0.005
    assert load_duration - event.seconds < 0.5  # the header read and the placement pass
    for phase in PHASES:
        assert f'ollamatrio_load_phase_seconds_count{{phase="{phase}"}} 1.0' in metrics
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded tiny")]
    assert "model_load " in line
    assert "interpreter " in line


def test_phases_from_marks_skip_a_missing_mark() -> None:
    """A runner that sends no marks (an older one) still gets the server's own phases; a
    missing mark's stretch goes to the next phase that has one."""
    marks = {"opened": 10.0, "spawned": 10.01, "main": 10.2, "model_load": 10.6, "handshake": 10.7}
    assert load_phases(marks) == {
        "spawn": 0.01, "interpreter": 0.19, "model_load": 0.4, "handshake": 0.1,
    }  # fmt: skip
    assert load_phases({"spawned": 1.0}) == {}
