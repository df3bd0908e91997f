"""``python -m ollamatrio.runner``: host one model in llama.cpp's own HTTP server.

Protocol with the client (:mod:`ollamatrio.engines.process`):

* stdin, first line: a :class:`~ollamatrio.runner.options.RunnerConfig` as JSON (the API key
  never appears on the command line).  stdin then stays open: its EOF means the client died.
  Once ready, the client may send ``{"threads": n}`` lines: the CPU threads the engine may
  use from now on (``runner/threads.py``; the ready line's ``thread_control`` says whether
  this runner obeys them).
* stdout: exactly one JSON line, a :class:`~ollamatrio.runner.events.RunnerReady` or a
  :class:`~ollamatrio.runner.events.RunnerFailed`; the ready line's ``marks`` say when each
  stretch of the start ended (``time.monotonic``).
* ``--spare FOLDER``: a spare runner (``engines/spare.py``) imports everything first, writes
  ``{"event":"spare"}`` and only then reads its configuration.  It knows its private folder
  (made by its keeper) from the start, so that it removes it however it leaves.
* stderr: llama.cpp's log, forwarded.
* The server listens on ``<socket_dir>/llama.sock`` and wants ``Authorization: Bearer <key>``.

The runner exits on stdin EOF, SIGTERM or SIGINT, and (Linux) when its parent dies.  Every
way out removes ``socket_dir`` and leaves with ``os._exit``: llama.cpp's teardown can hang
joining its threads, and the kernel frees everything else anyway.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any, NoReturn

import psutil
import trio

from ollamatrio.runner.events import (
    SPARE_FLAG,
    SPARE_LINE,
    RunnerFailed,
    RunnerMemory,
    RunnerReady,
)
from ollamatrio.runner.file_limit import restore_inherited_limit
from ollamatrio.runner.import_slot import ImportSlotError
from ollamatrio.runner.options import (
    POOLING_TYPES,
    GpuFacts,
    LoadPlan,
    ModelFacts,
    RunnerConfig,
    is_oom,
    plan_load,
)
from ollamatrio.runner.threads import ThreadShare, share_threads
from ollamatrio.runner.visibility import visible_devices_env

_PR_SET_PDEATHSIG = 1
# The kernel sends the parent-death signal when the parent *thread* that spawned us exits
# (Trio spawns from a worker thread that idles out after seconds), so it is a dedicated
# signal that only means "check whether the parent process is still there".
PARENT_DEATH_SIGNAL = signal.SIGUSR1


def _die_with_parent(parent_pid: int) -> None:
    """Second line of defence after stdin EOF: the kernel signals us when the parent dies."""
    if not sys.platform.startswith("linux"):
        return

    def check_parent(signum: int, frame: object) -> None:  # whenever Trio's receiver is off
        if os.getppid() != parent_pid:
            _leave(1)

    signal.signal(PARENT_DEATH_SIGNAL, check_parent)
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0)


def _read_config_line() -> str:
    """Read stdin's first line byte by byte, so no buffered reader swallows the EOF later."""
    data = bytearray()
    while not data.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        data += byte
    return data.decode()


_protocol_fd = 1  # the real stdout, reserved for the one event line (see main)
_socket_dir: str | None = None  # the private folder; every way out removes it (_leave)
# The engine, referenced until os._exit: its destructor joins llama.cpp's loop thread while
# holding the GIL, and that thread may be waiting for the GIL in the thread share's hook
# (runner/threads.py): a deadlock.  The process never tears the engine down; it exits.
_engine: Any = None


def _leave(code: int) -> NoReturn:
    """Remove the private folder, then exit at once (every exit path that can run code).

    Late signals are ignored first: the parent-death signal races stdin EOF when the
    server dies, and its handler, or SIGTERM's default action, must not cut the clean-up
    short.  A runner killed outright leaves its folder to the server (or, if the server
    died too, to the next server's start-up sweep)."""
    for signum in (signal.SIGTERM, signal.SIGINT, PARENT_DEATH_SIGNAL):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_IGN)
    if _socket_dir is not None:
        shutil.rmtree(_socket_dir, ignore_errors=True)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(code)


def _emit(event: RunnerReady | RunnerFailed) -> None:
    os.write(_protocol_fd, (event.to_json() + "\n").encode())


def _model_facts(path: str) -> ModelFacts:
    """Header facts for the load rules; a file our reader rejects goes to llama.cpp anyway,
    whose own error text is the one users should see."""
    from ollamatrio.errors import GGUFError
    from ollamatrio.gguf import read_gguf

    try:
        info = read_gguf(path)
    except (GGUFError, OSError, ValueError):
        try:
            return ModelFacts(file_size=os.path.getsize(path))
        except OSError:
            return ModelFacts()
    pooling = info.pooling_type  # gguf.PoolingType: NONE, MEAN, CLS, LAST, RANK
    if pooling is not None and not 0 <= pooling < len(POOLING_TYPES):
        pooling = None  # a type this table does not name
    # llama.cpp's head size: from the first layer with heads, unless the file gives it.
    heads = info.head_count
    first = heads if isinstance(heads, int) else next((h for h in heads if h > 0), 0)
    default_dim = info.embedding_length // first if first > 0 else 0
    return ModelFacts(
        train_ctx=info.context_length,
        pooling=None if pooling is None else POOLING_TYPES[pooling],
        file_size=info.file_size,
        head_dim_k=info.key_length or default_dim,
        head_dim_v=info.value_length or default_dim,
    )


def _gpu_facts(config: RunnerConfig) -> tuple[GpuFacts, ...]:
    spec = config.spec
    if spec.num_gpu == 0 or not spec.gpu_ids:
        return ()
    from ollamatrio.runner.measure import cuda_gpu_facts

    found = cuda_gpu_facts(spec.gpu_ids)
    return tuple(GpuFacts("CUDA", major, minor, driver) for major, minor, driver in found)


# When each stretch of the start ended, on the system-wide monotonic clock the server reads
# too (time.monotonic: CLOCK_MONOTONIC on Linux), so it can place them beside its own marks.
_marks: dict[str, float] = {}


def _mark(phase: str) -> None:
    _marks[phase] = time.monotonic()


def _load(config: RunnerConfig) -> tuple[Any, LoadPlan, str | None]:
    """Plan and load (blocking; runs in a worker thread).  Returns (server or None, plan, error)."""
    from ollamatrio.runner.capture import CapturedStderr

    plan = plan_load(
        config.spec,
        _model_facts(config.spec.model_path),
        gpus=_gpu_facts(config),
        free_ram=psutil.virtual_memory().available,
    )
    for warning in plan.warnings:
        print(f"ollamatrio runner: warning: {warning}", file=sys.stderr, flush=True)
    _mark("plan")

    import xllamacpp

    from ollamatrio.runner.llama import build_params

    params = build_params(config, plan)
    with CapturedStderr(os.path.join(config.socket_dir, "load.log")) as captured:
        try:
            server = xllamacpp.Server(params)
        except (RuntimeError, ValueError) as exc:
            server, generic = None, str(exc)
    if server is None:
        return None, plan, captured.error_text() or generic
    _mark("model_load")  # llama.cpp's model open and load, KV cache, warm-up
    return server, plan, None


class _UnixHTTPConnection(http.client.HTTPConnection):
    """The standard library's HTTP client on a Unix socket (httpx would cost an import)."""

    def __init__(self, path: str) -> None:
        super().__init__("runner", timeout=10.0)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _slot_context(config: RunnerConfig, plan: LoadPlan) -> int:
    """Per-slot context as llama.cpp really allocated it (it may round), from ``/slots``."""
    from ollamatrio.runner.llama import socket_path

    connection = _UnixHTTPConnection(socket_path(config))
    try:
        connection.request("GET", "/slots", headers={"Authorization": f"Bearer {config.api_key}"})
        slots = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    return int(slots[0]["n_ctx"]) if slots else plan.ctx_per_slot


class _Commands:
    """What the client's lines on stdin act on, once the model is loaded."""

    share: ThreadShare | None = None

    def apply(self, line: bytes) -> None:
        message = self.share.apply(line) if self.share is not None else None
        if message:
            print(f"ollamatrio runner: {message}", file=sys.stderr, flush=True)


async def _follow_stdin(done: trio.CancelScope, commands: _Commands) -> None:
    """Apply the client's command lines; leave on EOF (the client died or let go)."""
    stdin = trio.lowlevel.FdStream(os.dup(0))
    pending = b""
    async with stdin:
        while chunk := await stdin.receive_some(4096):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                commands.apply(line)
    done.cancel()


def _share_threads(config: RunnerConfig) -> tuple[ThreadShare | None, int]:
    """The engine's thread count, and a :class:`ThreadShare` on it when the scheduler
    divides the cores (no explicit ``num_thread``) and the engine allows it."""
    import xllamacpp.xllamacpp as engine

    spec = config.spec
    threads = spec.num_thread or spec.cores or psutil.cpu_count(logical=False) or 1
    if spec.num_thread:
        return None, threads
    try:
        return share_threads(str(engine.__file__), threads), threads
    except (ImportSlotError, OSError, AttributeError) as exc:
        print(f"ollamatrio runner: fixed threads: {exc}", file=sys.stderr, flush=True)
        return None, threads


async def _exit_on_signal(done: trio.CancelScope, parent_pid: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, PARENT_DEATH_SIGNAL) as signals:
        async for signum in signals:
            if signum == PARENT_DEATH_SIGNAL and os.getppid() == parent_pid:
                continue  # only the spawning thread ended; the parent process lives on
            done.cancel()
            return


async def serve(config: RunnerConfig) -> int:
    """Load, report, and hold the server until told to go.  Returns the exit code."""
    commands = _Commands()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_follow_stdin, nursery.cancel_scope, commands)
        nursery.start_soon(_exit_on_signal, nursery.cancel_scope, config.parent_pid)
        started = time.monotonic()
        # Abandoning the loading thread on cancel is safe: the process exits right after.
        server, plan, error = await trio.to_thread.run_sync(_load, config, abandon_on_cancel=True)
        global _engine
        _engine = server
        if server is None:
            _emit(RunnerFailed(error=error or "unknown error", oom=is_oom(error or "")))
            nursery.cancel_scope.cancel()
            return 1
        load_seconds = time.monotonic() - started
        # Before the ready line: no request can have reached the engine yet.
        commands.share, threads = _share_threads(config)
        context_length = await trio.to_thread.run_sync(_slot_context, config, plan)
        from ollamatrio.runner.measure import measure

        memory = await trio.to_thread.run_sync(measure)
        from ollamatrio.runner.llama import socket_path

        _mark("ready")  # the slots asked, the memory measured
        _emit(
            RunnerReady(
                socket=socket_path(config),
                pid=os.getpid(),
                context_length=context_length,
                memory=RunnerMemory(**memory),
                load_seconds=round(load_seconds, 4),
                marks=dict(_marks),
                plan=plan,
                threads=threads,
                thread_control=commands.share is not None,
            )
        )
        await trio.sleep_forever()
    return 0


def _import_engine(visible: Mapping[str, str]) -> bool:
    """Import xllamacpp now, in the main thread and before anything imports numpy: the CUDA
    build crashed (SIGSEGV) on an H200 when imported after numpy (``gguf`` imports it), and
    was reported to crash on an H100 when first imported in a worker thread, such as the one
    :func:`_load` runs in (docs/gpu.md).  The GPUs this load
    may not use are hidden first (``visible``), since the runtimes read that when they
    initialise.  The rest of what a load imports comes along, so that a spare runner has it
    all done.  On failure, report the error event and return False."""
    os.environ.update(visible)
    try:
        import xllamacpp  # noqa: F401

        import ollamatrio.gguf
        import ollamatrio.runner.capture
        import ollamatrio.runner.llama
        import ollamatrio.runner.measure  # noqa: F401

        _mark("engine_import")
    except Exception as exc:  # ImportError, or OSError from a missing GPU runtime library
        error = f"cannot load the engine (xllamacpp): {type(exc).__name__}: {exc}"
        _emit(RunnerFailed(error=error))
        return False
    return True


def main() -> None:
    global _protocol_fd, _socket_dir
    restore_inherited_limit()
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # no gdb attach on abort()
    # Anything else written to stdout (llama.cpp prints plain log lines there) goes to
    # stderr, which the client drains; an unread stdout pipe would fill and block a writer.
    # A spare (engines/spare.py) imports everything before it waits for its configuration;
    # its environment, visible GPUs included, was set when it was started.
    args = sys.argv[1:]
    spare = SPARE_FLAG in args
    if spare:  # its folder is ours from now on: every way out removes it (_leave)
        _socket_dir = args[args.index(SPARE_FLAG) + 1]
    _mark("main")  # the interpreter up and this module's imports done
    _protocol_fd = os.dup(1)
    os.dup2(2, 1)
    if spare:
        if not _import_engine({}):
            _leave(1)
        os.write(_protocol_fd, SPARE_LINE)  # ready; the keeper reads it (engines/spare.py)
    line = _read_config_line()
    if not line.strip():
        _leave(2)  # the client died before sending anything
    config = RunnerConfig.from_json(line)
    _socket_dir = config.socket_dir
    if not config.parent_pid:
        config = dataclasses.replace(config, parent_pid=os.getppid())
    _die_with_parent(config.parent_pid)
    if os.getppid() != config.parent_pid:
        _leave(1)  # the parent died before PDEATHSIG was armed
    code = 1
    try:
        if spare or _import_engine(visible_devices_env(config.spec)):
            code = trio.run(serve, config)
    except BaseException as exc:  # report, then leave without llama.cpp's teardown
        with contextlib.suppress(OSError):
            print(f"ollamatrio runner: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        _leave(code)


if __name__ == "__main__":
    main()
