"""The runner child: load-time rules, llama.cpp error text, and the process protocol."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import httpx
import psutil
import pytest
import trio
from helpers.runner_process import (
    RawRunner,
    start_raw_runner,
    start_raw_runner_in_short_lived_thread,
)

from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.engines.simulated import SimulatedEngineFactory
from ollamatrio.runner import folders as runner_folders
from ollamatrio.runner.file_limit import CHILD_LIMIT_ENV
from ollamatrio.runner.folders import PREFIX as RUNNER_FOLDER_PREFIX
from ollamatrio.runner.folders import (
    make_runner_folder,
    remove_stale_runner_folders,
    runner_temp_dir,
)
from ollamatrio.runner.logs import LineTail, llama_error_text
from ollamatrio.runner.options import GpuFacts, ModelFacts, RunnerConfig, is_oom, plan_load
from ollamatrio.serve import serve
from ollamatrio.types import LoadSpec

HELPERS = Path(__file__).parent / "helpers"
TinyGGUF = Callable[..., Path]
GIB = 1 << 30
CPU: tuple[GpuFacts, ...] = ()
OLD_CUDA = (GpuFacts("CUDA", 5, 2, 12),)
NEW_CUDA = (GpuFacts("CUDA", 8, 9, 12),)


def spec(**kwargs: object) -> LoadSpec:
    return LoadSpec(**{"model_path": "m.gguf", "name": "m", **kwargs})  # type: ignore[arg-type]


# -- load-time rules (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("load", "model", "expected"),
    [
        (spec(num_ctx=4096), ModelFacts(train_ctx=2048), (2048, 2048, 512)),
        (spec(num_ctx=4096, num_parallel=3), ModelFacts(train_ctx=8192), (4096, 12288, 512)),
        (spec(num_ctx=4096), ModelFacts(train_ctx=0), (4096, 4096, 512)),
        (spec(num_ctx=256, num_batch=512), ModelFacts(train_ctx=2048), (256, 256, 256)),
        (spec(num_ctx=8192), ModelFacts(train_ctx=8192, pooling="cls"), (8192, 8192, 2048)),
        (spec(num_ctx=1024), ModelFacts(train_ctx=8192, pooling="mean"), (1024, 1024, 1024)),
    ],
    ids=[
        "clamped-to-train-ctx",
        "total-is-ctx-times-parallel",
        "unknown-train-ctx",
        "batch-at-most-ctx",
        "embedding-batch-capped-2048",
        "embedding-batch-is-ctx",
    ],
)
def test_context_and_batch(
    load: LoadSpec, model: ModelFacts, expected: tuple[int, int, int]
) -> None:
    plan = plan_load(load, model)
    assert (plan.ctx_per_slot, plan.n_ctx, plan.n_batch) == expected
    assert plan.n_ubatch == plan.n_batch


@pytest.mark.parametrize(
    ("flash", "kv", "gpus", "expected_flash", "expected_kv"),
    [
        (None, "f16", CPU, "auto", ("f16", "f16")),
        (True, "q8_0", CPU, "on", ("q8_0", "q8_0")),
        (None, "q8_0", CPU, "auto", ("q8_0", "f16")),
        (False, "q4_0", CPU, "off", ("q4_0", "f16")),
        (True, "q8_0", OLD_CUDA, "off", ("q8_0", "f16")),
        (None, "f16", OLD_CUDA, "off", ("f16", "f16")),
        (True, "q4_0", NEW_CUDA, "on", ("q4_0", "q4_0")),
        (True, "q3_k", CPU, "on", ("f16", "f16")),
    ],
    ids=[
        "auto-by-default",
        "quantized-kv-with-fa",
        "quantized-v-needs-explicit-fa",
        "quantized-v-fa-off",
        "fa-unsupported-gpu",
        "auto-off-on-unsupported-gpu",
        "fa-on-modern-gpu",
        "unsupported-kv-type",
    ],
)
def test_flash_attention_and_kv_cache(
    flash: bool | None,
    kv: str,
    gpus: tuple[GpuFacts, ...],
    expected_flash: str,
    expected_kv: tuple[str, str],
) -> None:
    plan = plan_load(
        spec(flash_attention=flash, kv_cache_type=kv, num_gpu=-1), ModelFacts(), gpus=gpus
    )
    assert (plan.flash_attention, plan.kv_cache_type_k, plan.kv_cache_type_v) == (
        expected_flash,
        *expected_kv,
    )
    assert bool(plan.warnings) == (
        (kv, kv) != expected_kv or (flash is True and expected_flash == "off")
    )


@pytest.mark.parametrize(
    ("use_mmap", "num_gpu", "gpus", "free_ram", "expected"),
    [
        (True, 0, NEW_CUDA, 64 * GIB, False),
        (True, -1, CPU, 64 * GIB, False),
        (True, -1, NEW_CUDA, 64 * GIB, True),
        (True, -1, NEW_CUDA, 1 * GIB, False),
        (True, -1, NEW_CUDA, 0, True),
        (False, -1, NEW_CUDA, 64 * GIB, False),
    ],
    ids=["num-gpu-0", "no-gpus", "gpu-load", "ram-below-model", "ram-unknown", "off-by-request"],
)
def test_mmap(
    use_mmap: bool, num_gpu: int, gpus: tuple[GpuFacts, ...], free_ram: int, expected: bool
) -> None:
    load = spec(use_mmap=use_mmap, num_gpu=num_gpu)
    plan = plan_load(load, ModelFacts(file_size=4 * GIB), gpus=gpus, free_ram=free_ram)
    assert plan.use_mmap is expected
    assert plan.n_gpu_layers == (num_gpu if gpus and num_gpu else 0)


@pytest.mark.parametrize(
    ("embedding", "requested", "model_pooling", "expected"),
    [
        (False, None, None, None),
        (True, None, None, "mean"),
        (True, None, "cls", "cls"),
        (True, "last", "cls", "last"),
        (False, None, "mean", "mean"),
    ],
    ids=["generative", "embedding-needs-pooling", "model-pooling", "requested-pooling", "model"],
)
def test_pooling(
    embedding: bool, requested: str | None, model_pooling: str | None, expected: str | None
) -> None:
    plan = plan_load(
        spec(embedding=embedding, pooling=requested), ModelFacts(pooling=model_pooling)
    )
    assert plan.pooling == expected
    assert plan.embedding is (embedding or model_pooling is not None)


def test_config_round_trips_through_json() -> None:
    config = RunnerConfig(
        spec=spec(tensor_split=(0.5, 0.5), gpu_ids=("GPU-1", "GPU-2"), adapters=("a.gguf",)),
        api_key="k",
        socket_dir="/tmp/x",
        parent_pid=7,
    )
    assert RunnerConfig.from_json(config.to_json()) == config


# -- llama.cpp error text ------------------------------------------------------------------

BAD_MAGIC_LOG = """\
0.00.005.526 E gguf_init_from_reader: invalid magic characters: 'XXXX', expected 'GGUF'
0.00.005.684 E llama_model_load: error loading model: llama_model_loader: failed to load model x
0.00.005.699 E llama_model_load_from_file_impl: failed to load model
0.00.005.702 E cmn  common_init_: failed to load model 'm'
0.00.006.295 E srv          init: exiting due to model loading error"""
TRUNCATED_LOG = """\
0.00.005.983 E llama_model_load: error loading model: tensor 'blk.1.attn_output.weight' data is \
not within the file bounds, model is corrupted or incomplete
0.00.006.011 E llama_model_load_from_file_impl: failed to load model
0.00.006.631 E srv          init: exiting due to model loading error"""
ABORT_LOG = """\
0.00.001.000 I loading model
/src/llama-vocab.cpp:2665: GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed"""


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (BAD_MAGIC_LOG, "gguf_init_from_reader: invalid magic characters: 'XXXX', expected 'GGUF'"),
        (
            TRUNCATED_LOG,
            "llama_model_load: error loading model: tensor 'blk.1.attn_output.weight' data is "
            "not within the file bounds, model is corrupted or incomplete",
        ),
        (ABORT_LOG, "GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed"),
        ("0.00.001.000 I all fine\n0.00.002.000 W a warning", None),
    ],
    ids=["first-cause-not-last-echo", "truncated", "abort", "no-error"],
)
def test_llama_error_text(log: str, expected: str | None) -> None:
    assert llama_error_text(log.splitlines()) == expected


def test_line_tail_keeps_the_last_bytes_and_joins_partial_lines() -> None:
    tail = LineTail(max_bytes=64)
    assert tail.feed(b"first li") == []
    assert tail.feed(b"ne\nsecond\n") == ["first line", "second"]
    for n in range(20):
        tail.feed(f"line {n}\n".encode())
    assert tail.lines[-1] == "line 19"
    assert sum(len(line) + 1 for line in tail.lines) <= 64
    tail.feed(b"/x.cpp:1: GGML_ASSERT(x) failed")  # no newline: the writer aborted
    assert tail.error_text() == "GGML_ASSERT(x) failed"


@pytest.mark.parametrize(
    ("text", "oom"),
    [
        ("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer", True),
        ("CUDA error: out of memory", True),
        ("insufficient memory, attempted 219729 MB", True),
        ("invalid magic characters", False),
    ],
)
def test_oom_classification(text: str, oom: bool) -> None:
    assert is_oom(text) is oom


# -- the process protocol ------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawRunner]:
    from ollamatrio.testing import write_tiny_gguf

    model = write_tiny_gguf(tmp_path_factory.mktemp("raw") / "tiny.gguf")
    runner = start_raw_runner(LoadSpec(model_path=str(model), name="tiny", num_ctx=99999))
    yield runner
    runner.stop()


def test_ready_line(raw_runner: RawRunner) -> None:
    ready = raw_runner.ready
    assert ready["event"] == "ready"
    assert ready["pid"] == raw_runner.process.pid
    assert ready["context_length"] == 2048  # clamped to the model's training context
    assert ready["plan"]["n_ctx"] == 2048
    assert ready["plan"]["warnings"]
    memory = ready["memory"]
    assert 20 << 20 < memory["uss"] <= memory["rss"] < 1 << 30
    assert memory["vram_by_gpu"] == {}
    assert 0 < ready["load_seconds"] < 30


def test_socket_is_private_and_needs_the_key(raw_runner: RawRunner) -> None:
    directory = os.path.dirname(raw_runner.socket)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(raw_runner.socket).st_mode)
    assert raw_runner.config.api_key not in " ".join(
        psutil.Process(raw_runner.process.pid).cmdline()
    )
    transport = httpx.HTTPTransport(uds=raw_runner.socket)
    with httpx.Client(transport=transport, base_url="http://runner", timeout=10) as client:
        assert client.get("/slots").status_code == 401
        assert client.post("/completion", json={"prompt": "a", "n_predict": 1}).status_code == 401
        good = {"Authorization": f"Bearer {raw_runner.config.api_key}"}
        assert client.get("/slots", headers=good).status_code == 200
        assert client.get("/metrics", headers=good).status_code == 200


@pytest.mark.parametrize("how", ["stdin-eof", "sigterm"])
async def test_runner_exits_and_removes_its_socket_dir(tiny_gguf: TinyGGUF, how: str) -> None:
    model = tiny_gguf()
    runner = await trio.to_thread.run_sync(
        start_raw_runner, LoadSpec(model_path=str(model), name="tiny")
    )
    assert runner.ready["event"] == "ready"
    directory = runner.config.socket_dir
    assert await trio.Path(runner.socket).exists()
    with trio.fail_after(10):
        if how == "stdin-eof":
            code = await trio.to_thread.run_sync(runner.stop)
        else:
            runner.process.send_signal(signal.SIGTERM)
            code = await trio.to_thread.run_sync(runner.wait)
    assert code == 0
    assert not await trio.Path(directory).exists()


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        ("bad_magic", "invalid magic characters"),
        ("truncated", "not within the file bounds"),
    ],
)
async def test_corrupt_model_reports_llama_cpp_reason(
    tiny_gguf: TinyGGUF, corrupt: str, reason: str
) -> None:
    model = tiny_gguf(corrupt=corrupt)
    with trio.fail_after(30):
        runner = await trio.to_thread.run_sync(
            start_raw_runner, LoadSpec(model_path=str(model), name="bad")
        )
        code = await trio.to_thread.run_sync(runner.wait)
    assert runner.ready["event"] == "error"
    assert reason in runner.ready["error"]
    assert "Failed to init server" not in runner.ready["error"]
    assert runner.ready["oom"] is False
    assert code == 1
    assert not await trio.Path(runner.config.socket_dir).exists()


async def test_runner_dies_with_its_parent(tiny_gguf: TinyGGUF) -> None:
    model = tiny_gguf()
    parent = await trio.lowlevel.open_process(
        [sys.executable, str(HELPERS / "orphan_runner.py"), str(model)],
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    try:
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await parent.stdout.receive_some(100)
        runner_pid = json.loads(line)["pid"]
        assert psutil.Process(runner_pid).ppid() == parent.pid
        parent.kill()
        await parent.wait()
        for _ in range(250):  # 5 s; another process's exit has nothing to wait on but polling
            if not _alive(runner_pid):
                break
            await trio.sleep(0.02)
        else:
            pytest.fail(f"runner {runner_pid} outlived its parent")
    finally:
        parent.kill()
        await parent.wait()
        await parent.stdout.aclose()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory shallow enough for runner sockets, whatever pytest's own is
    (pytest-xdist's ``popen-gwN`` level makes ``tmp_path`` too deep to bind in)."""
    temp = Path(tempfile.mkdtemp(prefix="ot-", dir="/tmp"))
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


async def test_a_deep_temporary_directory_puts_runner_folders_in_tmp(
    tiny_gguf: TinyGGUF, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket path past ``sun_path``'s 107 bytes cannot be bound: the runner's folder then
    goes to /tmp, and the runner loads, answers and removes it as usual."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert runner_temp_dir() == "/tmp"
    with trio.fail_after(60):
        async with ProcessEngineFactory().open(LoadSpec(str(tiny_gguf()), "tiny")) as engine:
            folder = os.path.dirname(engine.ready.socket)
            assert os.path.dirname(folder) == "/tmp"
            assert await engine.healthy()
    assert not await trio.Path(folder).exists()
    assert os.listdir(deep) == []


async def test_a_runner_gets_the_open_file_limit_the_server_started_with(
    tiny_gguf: TinyGGUF,
) -> None:
    """The server raises its own soft limit for client connections and records the one it
    had; the runner lowers its own to that one before anything else."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(soft, 1024) - 24  # below whatever the test process runs under
    factory = ProcessEngineFactory(env={**os.environ, CHILD_LIMIT_ENV: str(wanted)})
    with trio.fail_after(60):
        async with factory.open(LoadSpec(str(tiny_gguf()), "tiny")) as engine:
            assert engine.pid is not None
            runner = psutil.Process(engine.pid)
            assert runner.rlimit(psutil.RLIMIT_NOFILE)[0] == wanted
            assert await engine.healthy()


def test_no_short_enough_temporary_directory_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = str(tmp_path / ("d" * 100))
    monkeypatch.setattr(tempfile, "tempdir", deep)
    monkeypatch.setattr(runner_folders, "_FALLBACK_TEMP", deep)
    with pytest.raises(OSError, match="too deep for a runner's socket path"):
        make_runner_folder()


@pytest.mark.parametrize("state", ["idle", "busy"])
async def test_runners_of_a_killed_parent_remove_their_folders(
    tiny_gguf: TinyGGUF, short_tmp: Path, state: str
) -> None:
    """SIGKILL the server: its runners exit (stdin EOF and the parent-death signal race
    each other) and every exit path removes the runner's folder (socket, load log)."""
    temp = short_tmp
    parent = await trio.lowlevel.open_process(
        [sys.executable, str(HELPERS / "orphan_runner.py"), str(tiny_gguf()), "3", state],
        stdout=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert parent.stdout is not None
    try:
        with trio.fail_after(60):
            output = b""
            while output.count(b"\n") < 3:
                data = await parent.stdout.receive_some()
                assert data, "the parent died early"
                output += data
        runners = [json.loads(line) for line in output.splitlines()]
        assert all([await trio.Path(r["dir"]).is_dir() for r in runners])
        parent.kill()
        await parent.wait()
        procs = [psutil.Process(r["pid"]) for r in runners]
        _gone, alive = await trio.to_thread.run_sync(psutil.wait_procs, procs, 10)
        assert alive == []
    finally:
        parent.kill()
        await parent.wait()
        await parent.stdout.aclose()
    assert [r["dir"] for r in runners if await trio.Path(r["dir"]).exists()] == []
    assert os.listdir(temp) == []


async def _start_orphans(model: Path, temp: Path, count: int = 1) -> tuple[trio.Process, list]:
    parent = await trio.lowlevel.open_process(
        [sys.executable, str(HELPERS / "orphan_runner.py"), str(model), str(count)],
        stdout=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert parent.stdout is not None
    output = b""
    with trio.fail_after(60):
        while output.count(b"\n") < count:
            data = await parent.stdout.receive_some()
            assert data, "the parent died early"
            output += data
    return parent, [json.loads(line) for line in output.splitlines()]


async def test_server_start_removes_only_stale_runner_folders(
    tiny_gguf: TinyGGUF, tmp_path: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = short_tmp
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    # A runner and its server killed together: stopped first, the runner runs no clean-up.
    parent, (orphan,) = await _start_orphans(tiny_gguf(), temp)
    runner = psutil.Process(orphan["pid"])
    try:
        runner.suspend()
        parent.kill()
        await parent.wait()
        # Its server is gone but the (stopped) runner lives and holds the folder's lock.
        assert await trio.to_thread.run_sync(remove_stale_runner_folders) == 0
        runner.kill()
        await trio.to_thread.run_sync(runner.wait, 10)
    finally:
        parent.kill()
        await parent.wait()
        assert parent.stdout is not None
        await parent.stdout.aclose()
    assert await trio.Path(orphan["dir"]).is_dir()
    legacy = temp / f"{RUNNER_FOLDER_PREFIX}legacy"  # no owner lock: nothing proves it stale
    legacy.mkdir()
    kept = {legacy.name}
    foreign, fd = make_runner_folder()  # stale, but another user's (only root can chown)
    os.close(fd)
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)
        kept.add(os.path.basename(foreign))
    model = tiny_gguf()
    async with ProcessEngineFactory().open(LoadSpec(model_path=str(model), name="live")) as live:
        live_folder = os.path.dirname(live.ready.socket)
        settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
        devices = SimulatedDevices(json.dumps({"gpus": [], "system": {"total": 8 << 30}}))
        stop = trio.Event()
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    partial(
                        serve,
                        settings,
                        shutdown_trigger=stop.wait,
                        engines=SimulatedEngineFactory(devices),
                        devices=devices,
                    )
                )
                stop.set()
        assert sorted(os.listdir(temp)) == sorted(kept | {os.path.basename(live_folder)})
        assert await live.healthy()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_runner_outlives_the_thread_that_spawned_it(tiny_gguf: TinyGGUF) -> None:
    # The kernel's parent-death signal fires when the spawning *thread* exits; the runner
    # must tell that apart from its parent process dying.
    model = tiny_gguf()
    runner = await trio.to_thread.run_sync(
        start_raw_runner_in_short_lived_thread, LoadSpec(model_path=str(model), name="tiny")
    )
    assert runner.ready["event"] == "ready"
    await trio.sleep(0.5)  # checking that nothing happens needs some time to pass
    assert runner.process.poll() is None
    with trio.fail_after(10):
        assert await trio.to_thread.run_sync(runner.stop) == 0
