"""The engine's devices are asked, not assumed: a probe process, and what ``serve`` does with
its answer next to NVML's GPUs.  NVML is faked as in ``test_devices.py``; the probe answer is
injected, except where the real probe process is the subject."""

from __future__ import annotations

import json
import logging
import os
from functools import partial
from pathlib import Path

import httpx
import pytest
import test_devices
import trio
from test_devices import UUID_A, UUID_B, FakeNvml

from ollamatrio.config import Settings
from ollamatrio.devices import NvmlDevices, SimulatedDevices
from ollamatrio.engines import capability
from ollamatrio.engines.capability import (
    PROBE_TIMEOUT,
    EngineDevice,
    EngineProbeError,
    EngineReport,
    WithoutGpus,
    engine_device_source,
    parse_probe_output,
    probe_engine,
)
from ollamatrio.serve import serve
from ollamatrio.store import ModelStore, import_gguf

fake_nvml = test_devices.fake_nvml  # the fixture faking two NVIDIA GPUs, shared

GiB = 1 << 30
CPU = EngineDevice("CPU", "AMD EPYC", "CPU", 64 * GiB, 64 * GiB)
CUDA0 = EngineDevice("CUDA0", "NVIDIA A100", "GPU", 80 * GiB, 79 * GiB, "0000:01:00.0")
CUDA1 = EngineDevice("CUDA1", "NVIDIA T4", "GPU", 16 * GiB, 15 * GiB, "0000:02:00.0")
CPU_ONLY = EngineReport("2026.10.11549", (CPU,))
WITH_CUDA = EngineReport("2026.10.11549", (CUDA0, CUDA1, CPU))


def _probe(report: EngineReport | Exception):
    async def probe() -> EngineReport:
        await trio.lowlevel.checkpoint()
        if isinstance(report, Exception):
            raise report
        return report

    return probe


def _messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


# -- the probe's answer ----------------------------------------------------------------------


def test_parse_probe_output() -> None:
    line = {
        "version": "2026.10.11549",
        "devices": [
            {"name": "CUDA0", "description": "NVIDIA A100", "type": "GPU",
             "memory_total": 80 * GiB, "memory_free": 79 * GiB, "device_id": "0000:01:00.0"},
            {"name": "BLAS", "description": "OpenBLAS", "type": "ACCEL",
             "memory_total": 0, "memory_free": 0, "device_id": ""},
            {"name": "CPU", "description": "AMD EPYC", "type": "CPU",
             "memory_total": 64 * GiB, "memory_free": 64 * GiB, "device_id": ""},
        ],
    }  # fmt: skip
    report = parse_probe_output("llama.cpp noise\n" + json.dumps(line) + "\n")
    assert report.backends == ("CUDA", "BLAS", "CPU")
    assert report.gpus("CUDA") == (CUDA0.__class__(**line["devices"][0]),)
    assert report.gpus("BLAS") == report.gpus("Vulkan") == ()
    assert report.describe() == "xllamacpp 2026.10.11549, backends: CUDA (NVIDIA A100), BLAS, CPU"
    assert CPU_ONLY.describe() == "xllamacpp 2026.10.11549, backends: CPU"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "unreadable answer"),
        ("Segmentation fault\n", "unreadable answer"),
        ('{"error": "ImportError: libcudart.so.13: cannot open"}\n', "libcudart.so.13"),
        ('{"version": "1"}\n', "unexpected answer"),
        ('{"devices": [{"nom": "CPU"}]}\n', "unexpected answer"),
    ],
)
def test_parse_probe_output_rejects(text: str, reason: str) -> None:
    with pytest.raises(EngineProbeError, match=reason):
        parse_probe_output(text)


async def test_real_probe_lists_the_cpu() -> None:
    with trio.fail_after(60):
        report = await probe_engine()
    assert report.version
    assert "CPU" in report.backends  # on every build, with or without GPUs
    assert all(d.type in ("CPU", "GPU", "IGPU", "ACCEL") for d in report.devices)


FAKE_ENGINE = """\
import os, threading
with open(os.environ["FAKE_ENGINE_RECORD"], "a") as record:
    record.write(f"main={threading.current_thread() is threading.main_thread()}\\n")
if os.environ["FAKE_ENGINE_MODE"] == "abort":
    os.abort()
raise ImportError("libcudart.so.13: cannot open shared object file")
"""


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("raise", "the engine failed to load: ImportError: libcudart.so.13"), ("abort", "SIGABRT")],
)
async def test_probe_of_a_broken_engine(tmp_path: Path, mode: str, reason: str) -> None:
    (tmp_path / "xllamacpp").mkdir()
    (tmp_path / "xllamacpp" / "__init__.py").write_text(FAKE_ENGINE)
    record = tmp_path / "record.txt"
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "FAKE_ENGINE_RECORD": str(record),
        "FAKE_ENGINE_MODE": mode,
    }
    with trio.fail_after(60), pytest.raises(EngineProbeError, match=reason):
        await probe_engine(env=env)
    assert record.read_text() == "main=True\n"  # imported in the probe's main thread


# -- what serve makes of it ------------------------------------------------------------------


def _process_settings(**overrides: object) -> Settings:
    return Settings(engine="process", **overrides)  # type: ignore[arg-type]


async def test_cpu_only_engine_on_a_gpu_machine_places_on_the_cpu(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ollamatrio")
    with trio.fail_after(10):
        devices = await engine_device_source(_process_settings(), probe=_probe(CPU_ONLY))
        inventory = await devices.inventory()
    assert isinstance(devices, WithoutGpus)
    assert isinstance(devices.inner, NvmlDevices)
    assert inventory.gpus == ()
    assert inventory.system.total > 0  # host memory is still the real one
    assert _messages(caplog, logging.INFO) == ["engine: xllamacpp 2026.10.11549, backends: CPU"]
    (warning,) = _messages(caplog, logging.WARNING)
    assert "cannot use the 2 NVIDIA GPUs NVML reports (NVIDIA A100, NVIDIA T4)" in warning
    assert "every model will run on the CPU" in warning
    assert 'the "GPU" section of README.md' in warning


async def test_cuda_engine_keeps_nvml_gpus(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ollamatrio")
    with trio.fail_after(10):
        devices = await engine_device_source(_process_settings(), probe=_probe(WITH_CUDA))
        inventory = await devices.inventory()
    assert isinstance(devices, NvmlDevices)
    assert [g.id for g in inventory.gpus] == [UUID_A, UUID_B]
    assert _messages(caplog, logging.WARNING) == []
    assert _messages(caplog, logging.INFO) == [
        "engine: xllamacpp 2026.10.11549, backends: CUDA (NVIDIA A100, NVIDIA T4), CPU"
    ]


async def test_engine_seeing_fewer_gpus_warns(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    report = EngineReport("1", (CUDA0, CPU))
    with trio.fail_after(10):
        devices = await engine_device_source(_process_settings(), probe=_probe(report))
    assert isinstance(devices, NvmlDevices)
    (warning,) = _messages(caplog, logging.WARNING)
    assert "the engine sees 1 CUDA device but NVML reports 2 GPUs" in warning


async def test_cpu_only_engine_without_gpus_is_just_logged(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ollamatrio")
    fake_nvml.gpus.clear()
    with trio.fail_after(10):
        devices = await engine_device_source(_process_settings(), probe=_probe(CPU_ONLY))
    assert isinstance(devices, NvmlDevices)
    assert _messages(caplog, logging.WARNING) == []
    assert _messages(caplog, logging.INFO) == ["engine: xllamacpp 2026.10.11549, backends: CPU"]


async def test_engine_gpus_that_nvml_does_not_list_are_named(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.gpus.clear()
    rocm = EngineDevice("ROCm0", "AMD Radeon RX 7900 XTX", "GPU", 24 * GiB, 23 * GiB)
    with trio.fail_after(10):
        await engine_device_source(
            _process_settings(), probe=_probe(EngineReport("1", (rocm, CPU)))
        )
    (warning,) = _messages(caplog, logging.WARNING)
    assert warning.startswith("the engine can use ROCm0 (AMD Radeon RX 7900 XTX), but ollamatrio")
    assert "every model will run on the CPU" in warning


async def test_failed_probe_trusts_nvml(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    failure = EngineProbeError("the engine failed to load: ImportError: x")
    with trio.fail_after(10):
        devices = await engine_device_source(_process_settings(), probe=_probe(failure))
        inventory = await devices.inventory()
    assert len(inventory.gpus) == 2
    (warning,) = _messages(caplog, logging.WARNING)
    assert warning == (
        "could not ask the engine which devices it can use "
        "(the engine failed to load: ImportError: x); trusting NVML"
    )


async def test_probe_that_hangs_is_abandoned(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture, autojump_clock: trio.abc.Clock
) -> None:
    cancelled = []

    async def hang() -> EngineReport:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(trio.current_time())
        raise AssertionError("unreachable")

    devices = await engine_device_source(_process_settings(), probe=hang)
    assert cancelled == [PROBE_TIMEOUT]
    assert isinstance(devices, NvmlDevices)
    (warning,) = _messages(caplog, logging.WARNING)
    assert f"no answer within {PROBE_TIMEOUT:g} s" in warning


@pytest.mark.parametrize(
    "settings",
    [Settings(engine="simulated"), Settings(engine="process", simulated_gpus='[{"total": 8}]')],
    ids=["simulated-engine", "simulated-gpus"],
)
async def test_simulations_are_not_probed(settings: Settings) -> None:
    devices = await engine_device_source(settings, probe=_probe(AssertionError("probed")))
    assert isinstance(devices, SimulatedDevices if settings.simulated_gpus else NvmlDevices)


async def test_serve_places_on_the_cpu_with_a_cpu_only_engine(
    tmp_path: Path,
    tiny_gguf,
    fake_nvml: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """End to end: NVML reports two GPUs, the engine none; the model really runs on the CPU,
    and /api/ps says so instead of claiming the GPU."""
    caplog.set_level(logging.INFO, logger="ollamatrio")
    monkeypatch.setattr(capability, "probe_engine", _probe(CPU_ONLY))
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
    store = ModelStore(settings.models_dir)
    for _ in import_gguf(store, "tiny", tiny_gguf()):
        pass
    stop = trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            (url,) = await nursery.start(partial(serve, settings, shutdown_trigger=stop.wait))
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                body = {"model": "tiny", "prompt": "hi", "stream": False}
                body["options"] = {"num_predict": 2}
                assert (await client.post("/api/generate", json=body)).status_code == 200
                (model,) = (await client.get("/api/ps")).json()["models"]
            stop.set()
    assert model["size_vram"] == 0
    assert model["size"] > 0
    assert sum("every model will run on the CPU" in m for m in _messages(caplog, 30)) == 1
    assert sum(m.startswith("engine: ") for m in _messages(caplog, logging.INFO)) == 1


async def test_without_gpus_the_probe_runs_beside_the_server(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """No GPU for the probe to drop: the devices come back at once and the probe only logs,
    in the nursery given, so the listener does not wait for a process importing the engine."""
    fake_nvml.gpus.clear()
    caplog.set_level(logging.INFO, logger="ollamatrio")
    asked = trio.Event()

    async def probe() -> EngineReport:
        asked.set()
        return CPU_ONLY

    with trio.fail_after(10):
        async with trio.open_nursery() as background:
            devices = await engine_device_source(
                _process_settings(), probe=probe, background=background
            )
            assert isinstance(devices, NvmlDevices)
            assert not asked.is_set()  # not yet: it runs once this task lets it
            await asked.wait()
    assert _messages(caplog, logging.INFO)[-1] == "engine: xllamacpp 2026.10.11549, backends: CPU"


async def test_with_gpus_the_probe_is_waited_for_even_with_a_background(
    fake_nvml: FakeNvml,
) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as background:
            devices = await engine_device_source(
                _process_settings(), probe=_probe(CPU_ONLY), background=background
            )
    assert isinstance(devices, WithoutGpus)
