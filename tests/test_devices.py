from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
import trio

from ollamatrio.devices import (
    GpuInfo,
    Inventory,
    NvmlDevices,
    SimulatedDevices,
    SystemMemory,
    cgroup_cpu_quota,
    cgroup_memory_cap,
    device_source,
    parse_size,
    parse_version,
    read_system_memory,
    select_visible,
    usable_cores,
)
from ollamatrio.errors import OutOfMemoryError

GiB = 2**30
UUID_A = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbb2222-0000-0000-0000-000000000000"


def _nvml_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


NVML_PRESENT = _nvml_present()


def _fixed_system() -> SystemMemory:
    return SystemMemory(total=64 * GiB, free=48 * GiB, swap_free=GiB, cpu_count=8)


# --------------------------------------------------------------------------- fake NVML


@dataclass
class FakeGpu:
    uuid: str
    name: str
    total: int
    free: int
    compute: tuple[int, int]
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    broken: bool = False  # memory queries fail, like a GPU fallen off the bus


@dataclass
class FakeNvml:
    """Stands in for libnvidia-ml behind the pynvml functions the module calls."""

    gpus: list[FakeGpu]
    cuda_driver: int = 12040
    init_error: int | None = None
    refcount: int = 0
    inits: int = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.refcount += 1
        self.inits += 1

    def nvmlShutdown(self) -> None:
        assert self.refcount > 0, "shutdown without init"
        self.refcount -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check_open()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check_open()
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> bytes:
        return handle.name.encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        if handle.broken:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(
            total=handle.total, free=handle.free, used=handle.total - handle.free
        )

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:
        return handle.compute

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._check_open()
        return self.cuda_driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_driver

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=n) for pid, n in handle.processes]

    def _check_open(self) -> None:
        assert self.refcount > 0, "NVML used before nvmlInit"


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(
        gpus=[
            FakeGpu(UUID_A, "NVIDIA A100", 80 * GiB, 70 * GiB, (8, 0), [(1234, 3 * GiB)]),
            FakeGpu(UUID_B, "NVIDIA T4", 16 * GiB, 15 * GiB, (7, 5), [(1234, GiB), (99, GiB)]),
        ]
    )
    for name in dir(FakeNvml):
        if name.startswith("nvml"):
            monkeypatch.setattr(pynvml, name, getattr(fake, name))
    return fake


def _nvml(visible: str | None = None) -> NvmlDevices:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    return NvmlDevices(env=env, read_system=_fixed_system)


async def test_nvml_lists_every_gpu(fake_nvml: FakeNvml) -> None:
    with trio.fail_after(5):
        inventory = await _nvml().inventory()
    assert inventory.gpus == (
        GpuInfo(UUID_A, 0, "CUDA", "NVIDIA A100", 80 * GiB, 70 * GiB, False, (8, 0), (12, 4)),
        GpuInfo(UUID_B, 1, "CUDA", "NVIDIA T4", 16 * GiB, 15 * GiB, False, (7, 5), (12, 4)),
    )
    assert inventory.system == _fixed_system()
    assert fake_nvml.refcount == 0  # every nvmlInit was matched by nvmlShutdown


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1", [UUID_B]),
        ("1,0", [UUID_B, UUID_A]),
        (UUID_B, [UUID_B]),
        ("GPU-bbbb", [UUID_B]),  # UUID prefixes are accepted, as by CUDA
        ("bbbb2222", [UUID_B]),  # ... with or without "GPU-"
        (f"{UUID_A.upper()}, 1", [UUID_A, UUID_B]),
        ("0,7,1", [UUID_A]),  # the list ends at the first unknown entry
        ("0,0,1", [UUID_A]),  # ... or a repeated one
        ("GPU-", []),  # ambiguous prefix
        ("", []),
        ("-1", []),
        ("MIG-0123", []),
    ],
    ids=lambda v: repr(v) if isinstance(v, str) else None,
)
async def test_nvml_respects_cuda_visible_devices(
    fake_nvml: FakeNvml, visible: str, expected: list[str]
) -> None:
    with trio.fail_after(5):
        inventory = await _nvml(visible).inventory()
    assert [g.id for g in inventory.gpus] == expected
    assert [g.index for g in inventory.gpus] == list(range(len(expected)))  # runner ordinals


def test_select_visible_unset_means_all() -> None:
    assert select_visible(["a", "b", "c"], None) == [0, 1, 2]


async def test_nvml_reads_visible_devices_from_process_env(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with trio.fail_after(5):
        inventory = await NvmlDevices(read_system=_fixed_system).inventory()
    assert [g.id for g in inventory.gpus] == [UUID_B]


@pytest.mark.parametrize(
    ("version", "driver", "flash"),
    [(12040, (12, 4), True), (11080, (11, 8), True), (6050, (6, 5), False)],
    ids=["12.4", "11.8", "6.5-too-old"],
)
async def test_nvml_driver_version(
    fake_nvml: FakeNvml, version: int, driver: tuple[int, int], flash: bool
) -> None:
    fake_nvml.cuda_driver = version
    with trio.fail_after(5):
        inventory = await _nvml().inventory()
    assert {g.driver for g in inventory.gpus} == {driver}
    assert inventory.supports_flash_attention is flash


async def test_nvml_unknown_driver_version_disables_flash_attention(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def missing() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", missing)
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion", missing)
    with trio.fail_after(5):
        inventory = await _nvml().inventory()
    assert {g.driver for g in inventory.gpus} == {(0, 0)}
    assert not inventory.supports_flash_attention
    assert "CUDA driver version" in caplog.text


async def test_nvml_skips_a_failing_gpu_and_warns_once(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.gpus[0].broken = True
    source = _nvml()
    with trio.fail_after(5):
        first = await source.inventory()
        second = await source.inventory()
    assert [(g.id, g.index) for g in first.gpus] == [(UUID_B, 1)]  # keeps its CUDA ordinal
    assert second == first
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert UUID_A in warnings[0].getMessage()
    assert fake_nvml.refcount == 0


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, logging.INFO),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, logging.INFO),
        (pynvml.NVML_ERROR_NO_PERMISSION, logging.WARNING),
    ],
    ids=["library-not-found", "driver-not-loaded", "no-permission"],
)
async def test_nvml_init_failure_means_cpu_only_logged_once(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture, error: int, level: int
) -> None:
    fake_nvml.init_error = error
    caplog.set_level(logging.INFO, logger="ollamatrio.devices")
    source = _nvml()
    with trio.fail_after(5):
        for _ in range(3):
            inventory = await source.inventory()
            assert inventory == Inventory((), _fixed_system())
        assert await source.vram_used_by_pid(1234) == {}
    records = [r for r in caplog.records if r.name == "ollamatrio.devices"]
    assert [r.levelno for r in records] == [level]
    assert "CPU only" in records[0].getMessage()


async def test_nvml_vram_used_by_pid(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[1].processes.append((1234, None))  # driver could not attribute this one
    source = _nvml()
    with trio.fail_after(5):
        assert await source.vram_used_by_pid(1234) == {UUID_A: 3 * GiB, UUID_B: GiB}
        assert await source.vram_used_by_pid(99) == {UUID_B: GiB}
        assert await source.vram_used_by_pid(5) == {}
    assert fake_nvml.refcount == 0


@pytest.mark.skipif(NVML_PRESENT, reason="this machine has NVML")
async def test_real_nvml_absent_is_cpu_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ollamatrio.devices")
    source = NvmlDevices()
    with trio.fail_after(10):
        first = await source.inventory()
        await source.inventory()
        assert await source.vram_used_by_pid(1) == {}
    assert first.gpus == ()
    assert first.system.total > 0
    assert 0 < first.system.free <= first.system.total
    assert len([r for r in caplog.records if r.levelno == logging.INFO]) == 1


@pytest.mark.skipif(not NVML_PRESENT, reason="no NVML on this machine")
async def test_real_nvml_lists_gpus() -> None:
    with trio.fail_after(30):
        inventory = await NvmlDevices().inventory()
    assert inventory.gpus
    for gpu in inventory.gpus:
        assert gpu.id.startswith(("GPU-", "MIG-"))
        assert 0 < gpu.free <= gpu.total
        assert gpu.compute >= (3, 0)
        assert gpu.driver >= (10, 0)  # a CUDA driver version, not the kernel driver's 5xx


# --------------------------------------------------------------------------- host memory


def _cgroup_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V1_UNLIMITED = "9223372036854771712\n"


@pytest.mark.parametrize(
    ("files", "membership", "expected"),
    [
        pytest.param(
            {
                "cgroup.controllers": "memory\n",
                "memory.max": f"{8 * GiB}\n",
                "memory.current": f"{3 * GiB}\n",
            },
            "0::/\n",
            (8 * GiB, 5 * GiB),
            id="v2-root",
        ),
        pytest.param(
            {"cgroup.controllers": "memory\n", "memory.max": "max\n", "memory.current": "123\n"},
            "0::/\n",
            None,
            id="v2-unlimited",
        ),
        pytest.param(
            {
                "cgroup.controllers": "",
                "memory.max": f"{8 * GiB}\n",
                "memory.current": f"{3 * GiB}\n",
                "memory.stat": f"anon 5\ninactive_file {GiB}\n",
            },
            "0::/\n",
            (8 * GiB, 6 * GiB),
            id="v2-inactive-cache-is-free",
        ),
        pytest.param(
            {
                "cgroup.controllers": "",
                "memory.max": "max\n",
                "app/memory.max": f"{4 * GiB}\n",
                "app/memory.current": f"{GiB}\n",
                "app/job/memory.max": "max\n",
                "app/job/memory.current": f"{GiB}\n",
            },
            "0::/app/job\n",
            (4 * GiB, 3 * GiB),
            id="v2-parent-limit-binds",
        ),
        pytest.param(
            {
                "cgroup.controllers": "",
                "memory.max": f"{2 * GiB}\n",
                "memory.current": f"{GiB // 2}\n",
            },
            "0::/elsewhere/on/the/host\n",
            (2 * GiB, GiB + GiB // 2),
            id="v2-namespaced-root",
        ),
        pytest.param(
            {
                "memory/memory.limit_in_bytes": f"{6 * GiB}\n",
                "memory/memory.usage_in_bytes": f"{2 * GiB}\n",
                "memory/memory.stat": f"cache 7\ntotal_inactive_file {GiB}\n",
            },
            "4:memory:/\n0::/\n",
            (6 * GiB, 5 * GiB),
            id="v1",
        ),
        pytest.param(
            {
                "memory/memory.limit_in_bytes": V1_UNLIMITED,
                "memory/memory.usage_in_bytes": f"{2 * GiB}\n",
            },
            "4:memory:/\n",
            None,
            id="v1-unlimited-sentinel",
        ),
        pytest.param(
            {
                "memory/memory.limit_in_bytes": V1_UNLIMITED,
                "memory/svc/abc/memory.limit_in_bytes": f"{3 * GiB}\n",
                "memory/svc/abc/memory.usage_in_bytes": f"{4 * GiB}\n",
            },
            "5:cpu,cpuacct:/\n4:memory:/svc/abc\n",
            (3 * GiB, 0),
            id="v1-own-cgroup-over-limit",
        ),
        pytest.param({}, "", None, id="no-cgroup-files"),
    ],
)
def test_cgroup_memory_cap(
    tmp_path: Path,
    files: dict[str, str],
    membership: str,
    expected: tuple[int, int] | None,
) -> None:
    assert cgroup_memory_cap(_cgroup_tree(tmp_path, files), membership) == expected


@pytest.mark.parametrize(
    ("files", "membership", "expected"),
    [
        pytest.param({"cgroup.controllers": "", "cpu.max": "max 100000\n"}, "0::/\n", None,
                     id="v2-no-quota"),
        pytest.param(
            {"cgroup.controllers": "", "cpu.max": "max 100000\n",
             "app/cpu.max": "250000 100000\n", "app/job/cpu.max": "max 100000\n"},
            "0::/app/job\n", 3, id="v2-parent-quota-binds-rounded-up",
        ),
        pytest.param(
            {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n",
             "cpu/svc/cpu.cfs_quota_us": "100000\n", "cpu/svc/cpu.cfs_period_us": "100000\n"},
            "5:cpu,cpuacct:/svc\n4:memory:/\n", 1, id="v1",
        ),
        pytest.param({}, "", None, id="no-cgroup-files"),
    ],
)  # fmt: skip
def test_cgroup_cpu_quota(
    tmp_path: Path, files: dict[str, str], membership: str, expected: int | None
) -> None:
    assert cgroup_cpu_quota(_cgroup_tree(tmp_path, files), membership) == expected


def test_usable_cores_are_within_the_quota(tmp_path: Path) -> None:
    root = _cgroup_tree(tmp_path, {"cgroup.controllers": "", "cpu.max": "50000 100000\n"})
    membership = tmp_path / "self-cgroup"
    membership.write_text("0::/\n")
    assert usable_cores(root, membership) == 1
    assert 1 <= usable_cores(tmp_path / "none", membership) <= (os.cpu_count() or 1)


def test_read_system_memory_caps_by_cgroup(tmp_path: Path) -> None:
    root = _cgroup_tree(
        tmp_path,
        {"cgroup.controllers": "", "memory.max": f"{GiB}\n", "memory.current": f"{GiB // 4}\n"},
    )
    membership = tmp_path / "self-cgroup"
    membership.write_text("0::/\n")
    capped = read_system_memory(root, membership)
    assert capped.total == GiB
    assert capped.free == GiB - GiB // 4
    assert capped.cpu_count >= 1
    assert capped.swap_free >= 0


def test_read_system_memory_unlimited_is_host_memory(tmp_path: Path) -> None:
    import psutil

    root = _cgroup_tree(tmp_path, {"memory/memory.limit_in_bytes": V1_UNLIMITED})
    membership = tmp_path / "self-cgroup"
    membership.write_text("4:memory:/\n")
    system = read_system_memory(root, membership)
    assert system.total == psutil.virtual_memory().total
    assert 0 < system.free <= system.total


# --------------------------------------------------------------------------- flash attention


@pytest.mark.parametrize(
    ("library", "compute", "driver", "supported"),
    [
        ("CUDA", (8, 0), (12, 4), True),
        ("CUDA", (6, 0), (7, 0), True),
        ("CUDA", (5, 2), (12, 4), False),
        ("CUDA", (7, 2), (12, 4), False),
        ("CUDA", (7, 5), (12, 4), True),
        ("CUDA", (8, 6), (6, 5), False),
        ("ROCm", (0, 0), (0, 0), True),
        ("Metal", (0, 0), (0, 0), True),
        ("Vulkan", (1, 0), (1, 0), True),
    ],
    ids=[
        "cuda-ampere",
        "cuda-pascal-driver-7",
        "cuda-maxwell",
        "cuda-xavier-7.2",
        "cuda-turing",
        "cuda-old-driver",
        "rocm",
        "metal",
        "vulkan",
    ],
)
def test_supports_flash_attention(
    library: str, compute: tuple[int, int], driver: tuple[int, int], supported: bool
) -> None:
    gpu = GpuInfo("g", 0, library, "x", GiB, GiB, False, compute, driver)
    assert gpu.supports_flash_attention is supported
    system = _fixed_system()
    assert Inventory((gpu,), system).supports_flash_attention is supported
    fine = GpuInfo("h", 1, "CUDA", "y", GiB, GiB, False, (8, 9), (12, 8))
    assert Inventory((fine, gpu), system).supports_flash_attention is supported
    assert Inventory((), system).supports_flash_attention  # CPU only


# --------------------------------------------------------------------------- simulation


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (0, 0),
        (85899345920, 80 * GiB),
        ("80GiB", 80 * GiB),
        ("80 gib", 80 * GiB),
        ("1.5GiB", 3 * GiB // 2),
        ("512MiB", 512 * 2**20),
        ("4KiB", 4096),
        ("2TiB", 2 * 2**40),
        ("24GB", 24 * 10**9),
        ("500MB", 500 * 10**6),
        ("3KB", 3000),
        ("1TB", 10**12),
        ("100B", 100),
        ("100", 100),
    ],
    ids=repr,
)
def test_parse_size(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text", ["", "GiB", "12 parsecs", "-1GiB", "1e9", -5, 1.5, True, None, [8]], ids=repr
)
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "version"),
    [("8.6", (8, 6)), ("580.95.05", (580, 95)), ("12", (12, 0)), (9, (9, 0)), ([7, 5], (7, 5))],
    ids=repr,
)
def test_parse_version(text: object, version: tuple[int, int]) -> None:
    assert parse_version(text) == version


A100 = {
    "id": "sim0",
    "library": "CUDA",
    "name": "Sim A100",
    "total": "80GiB",
    "integrated": False,
    "compute": "8.0",
    "driver": "12.4",
    "reserved": 0,
}


async def test_simulated_full_spec() -> None:
    spec = [A100, {"total": 16 * GiB, "library": "ROCm", "reserved": "1GiB", "compute": "9.0"}]
    with trio.fail_after(5):
        inventory = await SimulatedDevices(json.dumps(spec), read_system=_fixed_system).inventory()
    assert inventory.gpus == (
        GpuInfo("sim0", 0, "CUDA", "Sim A100", 80 * GiB, 80 * GiB, False, (8, 0), (12, 4)),
        GpuInfo("sim1", 1, "ROCm", "Simulated GPU 1", 16 * GiB, 15 * GiB, False, (9, 0), (12, 4)),
    )
    assert inventory.system == _fixed_system()  # no "system": host memory is read


async def test_simulated_with_system_and_no_gpus() -> None:
    spec = {"gpus": [], "system": {"total": "64GiB", "free": "60GiB", "cpu_count": 4}}
    with trio.fail_after(5):
        inventory = await SimulatedDevices(json.dumps(spec)).inventory()
    assert inventory == Inventory((), SystemMemory(64 * GiB, 60 * GiB, 0, 4))


async def test_simulated_without_system_reads_the_host() -> None:
    with trio.fail_after(5):
        inventory = await SimulatedDevices("[]").inventory()
    assert inventory.gpus == ()
    assert 0 < inventory.system.free <= inventory.system.total


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("[{", "Expecting"),
        ('"sim"', "expected a list"),
        ("[3]", "GPU 0: expected an object"),
        ('[{"name": "x"}]', "'total' is required"),
        ('[{"total": "lots"}]', "not a size"),
        ('[{"total": "8GiB", "librari": "CUDA"}]', "unknown keys \\['librari'\\]"),
        ('[{"total": "8GiB", "library": "cuda"}]', "library 'cuda'"),
        ('[{"total": "8GiB", "reserved": "9GiB"}]', "reserved"),
        ('[{"total": "8GiB", "compute": "eight"}]', "not a version"),
        ('[{"total": "8GiB", "integrated": "no"}]', "integrated"),
        ('[{"total": 1, "id": "a"}, {"total": 1, "id": "a"}]', "ids repeat"),
        ('{"gpus": [], "systen": {}}', "unknown keys"),
        ('{"system": {"free": 1}}', "system: 'total' is required"),
        ('{"system": {"total": 1, "free": 2}}', "free 2 exceeds"),
        ('{"system": {"total": 1, "cpu_count": 0}}', "cpu_count"),
    ],
)
def test_simulated_rejects_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match="OLLAMATRIO_SIMULATED_GPUS") as info:
        SimulatedDevices(spec)
    assert info.match(message)


async def test_simulated_allocate_and_release() -> None:
    spec = {
        "gpus": [{"total": "10GiB", "reserved": "1GiB"}, {"total": "8GiB"}],
        "system": {"total": "32GiB", "free": "20GiB", "swap_free": "2GiB", "cpu_count": 8},
    }
    devices = SimulatedDevices(spec)

    async def free() -> tuple[list[int], int]:
        with trio.fail_after(5):
            inventory = await devices.inventory()
        return [g.free for g in inventory.gpus], inventory.system.free

    assert await free() == ([9 * GiB, 8 * GiB], 20 * GiB)
    devices.allocate("llama", "sim0", 2 * GiB)
    devices.allocate("llama", "sim0", GiB)  # cumulative
    devices.allocate("llama", "sim1", GiB)
    devices.allocate("qwen", "sim0", 4 * GiB)
    devices.allocate_host("llama", 5 * GiB)
    assert devices.usage("llama") == {"sim0": 3 * GiB, "sim1": GiB}
    assert await free() == ([2 * GiB, 7 * GiB], 15 * GiB)

    with pytest.raises(OutOfMemoryError, match="sim0"):
        devices.allocate("mistral", "sim0", 2 * GiB + 1)
    assert devices.usage("mistral") == {}  # a failed allocation holds nothing
    devices.allocate("mistral", "sim0", 2 * GiB)  # exactly what is left fits
    assert await free() == ([0, 7 * GiB], 15 * GiB)

    devices.release("llama")
    devices.release("llama")  # idempotent
    devices.release("never-allocated")
    assert devices.usage("llama") == {}
    assert await free() == ([3 * GiB, 8 * GiB], 20 * GiB)
    devices.release("qwen")
    devices.release("mistral")
    assert await free() == ([9 * GiB, 8 * GiB], 20 * GiB)


async def test_simulated_host_allocation_without_simulated_system() -> None:
    devices = SimulatedDevices([], read_system=_fixed_system)
    devices.allocate_host("llama", 8 * GiB)
    devices.allocate_host("llama", 100 * GiB)  # host memory overcommits; free floors at 0
    with trio.fail_after(5):
        assert (await devices.inventory()).system.free == 0
        devices.release("llama")
        assert (await devices.inventory()).system == _fixed_system()


@pytest.mark.parametrize(
    ("owner", "gpu", "nbytes", "error"),
    [("a", "sim9", 1, ValueError), ("a", "sim0", -1, ValueError)],
    ids=["unknown-gpu", "negative"],
)
def test_simulated_allocate_rejects(owner: str, gpu: str, nbytes: int, error: type) -> None:
    devices = SimulatedDevices([{"total": "1GiB"}])
    with pytest.raises(error):
        devices.allocate(owner, gpu, nbytes)
    with pytest.raises(ValueError, match="cannot allocate"):
        devices.allocate_host(owner, -1)


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class _Settings:
    simulated_gpus: str = ""


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("", NvmlDevices),
        ("  ", NvmlDevices),
        ("[]", SimulatedDevices),
        (json.dumps([A100]), SimulatedDevices),
    ],
    ids=["unset", "blank", "empty-list", "one-gpu"],
)
def test_device_source(raw: str, kind: type) -> None:
    assert isinstance(device_source(_Settings(raw)), kind)


def test_device_source_with_real_settings() -> None:
    from ollamatrio.config import Settings

    settings = Settings.from_env({"OLLAMATRIO_SIMULATED_GPUS": json.dumps([A100])})
    source = device_source(settings)
    assert isinstance(source, SimulatedDevices)
    assert [g.id for g in source.gpus] == ["sim0"]


def test_device_source_bad_json_names_the_variable() -> None:
    with pytest.raises(ValueError, match="invalid OLLAMATRIO_SIMULATED_GPUS"):
        device_source(_Settings("[{"))
