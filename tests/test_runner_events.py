"""The runner's event lines (``runner/events.py``): what the runner writes, its client reads
back as the same record, and a line that is no event is named in a clear error."""

from __future__ import annotations

import pytest

from ollamatrio.runner.events import (
    MalformedEventError,
    RunnerFailed,
    RunnerMemory,
    RunnerReady,
    read_event,
)
from ollamatrio.runner.options import LoadPlan

PLAN = LoadPlan(
    ctx_per_slot=1024,
    n_ctx=2048,
    n_parallel=2,
    n_batch=512,
    n_ubatch=512,
    flash_attention="auto",
    kv_cache_type_k="q8_0",
    kv_cache_type_v="f16",
    use_mmap=True,
    embedding=False,
    pooling=None,
    n_gpu_layers=0,
    warnings=("num_ctx clamped",),
)


def test_a_ready_line_reads_back_as_the_record_written() -> None:
    ready = RunnerReady(
        socket="/tmp/ollamatrio-runner-x/llama.sock",
        pid=42,
        context_length=1024,
        memory=RunnerMemory(rss=100, uss=90, vram_by_gpu={"GPU-0": 7}),
        load_seconds=0.25,
        marks={"main": 1.5, "ready": 2.5},
        plan=PLAN,
    )
    assert read_event(ready.to_json()) == ready
    assert RunnerReady.from_json(ready.to_json().encode()) == ready


def test_a_failure_line_reads_back_as_the_record_written() -> None:
    failed = RunnerFailed(error="cudaMalloc failed: out of memory", oom=True)
    assert read_event(failed.to_json()) == failed


def test_a_minimal_ready_line_takes_the_defaults() -> None:
    line = b'{"event":"ready","socket":"/s.sock","pid":0,"context_length":8,"memory":{}}'
    assert read_event(line) == RunnerReady(socket="/s.sock", pid=0, context_length=8)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"llama.cpp says hello", "not JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"event":"bored"}', "unknown event 'bored'"),
        (b'{"event":"ready","pid":1,"context_length":8}', "a bad ready event: KeyError('socket')"),
        (b'{"event":"ready","socket":"/s","pid":"x","context_length":8}', "a bad ready event"),
    ],
)
def test_a_line_that_is_no_event_is_named_in_the_error(line: bytes, reason: str) -> None:
    with pytest.raises(MalformedEventError) as caught:
        read_event(line)
    message = str(caught.value)
    assert message.startswith(f"runner printed an unexpected line ({reason}")
    assert repr(line[:20])[2:-1] in message


def test_a_failure_is_not_a_ready_line() -> None:
    with pytest.raises(MalformedEventError, match="not a ready line"):
        RunnerReady.from_json(RunnerFailed(error="no").to_json())
