"""Engines backed by a runner subprocess (Ollama's ``LlamaServer``).

``ProcessEngineFactory.open(spec)`` starts ``python -m ollamatrio.runner`` inside its own
nursery, sends it a :class:`~ollamatrio.runner.options.RunnerConfig` on stdin (the API key
never touches argv), waits for its ready line under a stall timeout that every stderr line
extends, and talks to llama.cpp's HTTP server over the runner's Unix socket with a
:class:`~ollamatrio.engines.runner_http.RunnerHttp` (raw Trio streams, pooled connections).

Lifetimes: the process lives exactly as long as the ``async with``.  Leaving it sends
SIGTERM (and SIGCONT, so a stopped runner acts on it), waits ``kill_grace`` seconds, then
SIGKILLs, and always reaps.  If the runner dies on its own, calls in flight raise
:class:`RunnerCrashedError` (with the signal name and the last error line) and the body of
the ``async with`` is cancelled, so the same error comes out of it.  A generation that gets
no byte from the runner for ``stall_timeout`` seconds (llama.cpp reports prompt progress, so
only a frozen or wedged runner is that quiet) kills the runner: the request fails with that
reason and the scheduler, seeing a crash, starts a new runner for the next request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ollamatrio.config import DEFAULT_STALL_TIMEOUT
from ollamatrio.engines.llamacpp_wire import (
    EMBED_INPUT_TOO_LONG,
    ChatStream,
    CompletionStream,
    RunnerReportedError,
    chat_request,
    completion_request,
    embedding_vectors,
    is_embedding_input_limit,
    raise_for_error,
)
from ollamatrio.engines.load_watch import watch_file_reads
from ollamatrio.engines.protocol import LoadProgress
from ollamatrio.engines.runner_http import (
    EventSource,
    RunnerConnectionError,
    RunnerHttp,
    RunnerStatusError,
)
from ollamatrio.errors import (
    CapabilityError,
    InvalidRequestError,
    OutOfMemoryError,
    RunnerCrashedError,
    RunnerError,
    RunnerStartError,
)
from ollamatrio.runner.folders import make_runner_folder
from ollamatrio.runner.logs import LineTail, llama_error_text
from ollamatrio.runner.options import RunnerConfig, is_oom
from ollamatrio.runner.visibility import visible_devices_env
from ollamatrio.types import Chunk, CompletionRequest, Embeddings, LoadSpec, MemoryUsage

if TYPE_CHECKING:
    from ollamatrio.config import Settings

log = logging.getLogger(__name__)

DEFAULT_LOAD_TIMEOUT = 300.0  # Ollama: 5 minutes without progress
KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
EXIT_REPORT_WAIT = 1.0  # how long a failed request waits to learn that the runner died
STDERR_SETTLE = 0.3  # how long to wait for the last stderr bytes of a dead runner
HEALTH_TIMEOUT = 5.0
STDERR_TAIL_BYTES = 8192
# What llama.cpp's /apply-template needs of a chat request to render it as it would.
_TEMPLATE_FIELDS = ("messages", "tools", "chat_template_kwargs")
REPEAT_LIMIT = 30  # identical pieces in a row before a generation counts as stuck (B61)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


class ProcessEngineFactory:
    """Opens :class:`ProcessEngine` instances: one runner subprocess per loaded model."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        load_timeout: float | None = None,
        stall_timeout: float | None = None,
        kill_grace: float = KILL_GRACE,
        verbosity: int | None = None,
        cache_ram_mib: int = 0,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``settings`` supplies ``load_timeout`` (OLLAMA_LOAD_TIMEOUT), ``stall_timeout``
        (OLLAMATRIO_STALL_TIMEOUT) and the log level (OLLAMA_DEBUG); keyword arguments
        override them."""
        if load_timeout is None:
            load_timeout = settings.load_timeout if settings is not None else DEFAULT_LOAD_TIMEOUT
        if stall_timeout is None:
            stall_timeout = (
                settings.stall_timeout if settings is not None else DEFAULT_STALL_TIMEOUT
            )
        if verbosity is None:
            verbosity = 3 if settings is not None and settings.debug > 0 else 1
        self.load_timeout = math.inf if load_timeout <= 0 else load_timeout
        self.stall_timeout = math.inf if stall_timeout <= 0 else stall_timeout
        self.kill_grace = kill_grace
        self.verbosity = verbosity
        self.cache_ram_mib = cache_ram_mib
        self.python = python
        self.env = dict(os.environ if env is None else env)

    def _runner_env(self, spec: LoadSpec) -> dict[str, str]:
        env = dict(self.env)
        env["GGML_NO_BACKTRACE"] = "1"  # no gdb attach on abort()
        package_root = str(Path(__file__).resolve().parents[2])  # the folder holding ollamatrio/
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        # Only the GPUs the scheduler booked, and none for a CPU load (it would otherwise
        # still create a CUDA context on every GPU).
        env.update(visible_devices_env(spec))
        return env

    @asynccontextmanager
    async def open(
        self, spec: LoadSpec, *, progress: LoadProgress | None = None
    ) -> AsyncIterator[ProcessEngine]:
        socket_dir, owner_fd = make_runner_folder()  # mode 0700, locked by us and the runner
        config = RunnerConfig(
            spec=spec,
            api_key=secrets.token_urlsafe(32),
            socket_dir=socket_dir,
            parent_pid=os.getpid(),
            verbosity=self.verbosity,
            cache_ram_mib=self.cache_ram_mib,
        )
        engine = ProcessEngine(config, self, owner_fd=owner_fd, progress=progress)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(engine._supervise)
                try:
                    yield engine
                finally:
                    engine._closing = True
                    nursery.cancel_scope.cancel()  # -> SIGTERM, grace, SIGKILL, reap
        except BaseExceptionGroup as group:
            raise _collapse(group) from None
        finally:
            shutil.rmtree(socket_dir, ignore_errors=True)
            os.close(owner_fd)


def _collapse(group: BaseExceptionGroup) -> BaseException:
    """The one error inside ``group`` (a crash, a start failure, the body's own error), or
    the group itself when it really holds different errors.  A crash seen both by the
    supervisor and by a request in the body is one event, reported once."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    if len(leaves) == 1 or all(isinstance(e, RunnerCrashedError) for e in leaves):
        return leaves[0]
    return group


class RunnerClient:
    """llama.cpp's HTTP API on a runner's Unix socket, in Ollama's terms."""

    def __init__(
        self,
        *,
        name: str,
        context_length: int,
        num_parallel: int = 1,
        http: RunnerHttp | None = None,
        stall_timeout: float = math.inf,
    ) -> None:
        self._name = name
        self._context_length = context_length
        self._http = http
        self.stall_timeout = stall_timeout  # seconds a generation may go without a byte
        self._slots = trio.Semaphore(max(1, num_parallel))  # Ollama's per-runner semaphore

    @property
    def http(self) -> RunnerHttp:
        if self._http is None:
            raise RunnerError("the runner is not ready")
        return self._http

    @property
    def context_length(self) -> int:
        return self._context_length

    async def _runner_gone(self, exc: BaseException | None) -> RunnerError:
        """The error for a request whose connection to the runner failed."""
        return RunnerError(f"lost the connection to the model runner: {exc}")

    def _stall_message(self) -> str:
        return f"model runner stopped responding: no output for {self.stall_timeout:g}s"

    async def _stalled(self) -> RunnerError:
        """The error for a generation that got no byte for ``stall_timeout`` seconds."""
        return RunnerError(self._stall_message())

    def _reported(self, exc: RunnerReportedError) -> Exception:
        message = str(exc)
        if is_oom(message):
            return OutOfMemoryError(message)
        if exc.code == 501:
            return CapabilityError(message)
        if 400 <= exc.code < 500:
            return InvalidRequestError(message)
        return RunnerError(message)

    def _error_from_body(self, status: int, raw: bytes) -> Exception:
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = {"error": {"message": raw.decode("utf-8", "replace"), "code": status}}
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            error.setdefault("code", status)
            body = {"error": error}
        else:
            body = {"error": {"message": str(error or body), "code": status}}
        try:
            raise_for_error(body)
        except RunnerReportedError as exc:
            return self._reported(exc)
        return RunnerError(f"runner answered HTTP {status}")

    async def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> bytes:
        """A plain request on a pooled connection; the body of a 200 answer."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            status, raw = await self.http.request(method, path, data)
        except RunnerConnectionError as exc:
            raise await self._runner_gone(exc) from exc
        if status != 200:
            raise self._error_from_body(status, raw)
        return raw

    async def _post_json(self, path: str, body: Mapping[str, Any]) -> Any:
        return json.loads(await self._call("POST", path, body))

    @asynccontextmanager
    async def complete(self, request: CompletionRequest) -> AsyncIterator[AsyncIterator[Chunk]]:
        """Stream a generation: prompt -> ``/completion``, messages -> chat completions."""
        if request.context and request.messages is not None:
            # Ollama: the earlier context, as text, in front of the rendered prompt.
            request = replace(request, prompt=await self._render(request), messages=None)
        if request.context and request.prompt is not None:
            # The prompt gets its own BOS when tokenized: drop the earlier one.
            prefix = await self.tokenize_prompt("")
            tokens = list(request.context)
            if prefix and tokens[: len(prefix)] == prefix:
                tokens = tokens[len(prefix) :]
            earlier = await self.detokenize(tokens)
            request = replace(request, prompt=earlier + request.prompt, context=())
        if request.messages is not None:
            request = await self._fitted(request)
            path, body = chat_request(request, self.context_length, self._name)
            parser: ChatStream | CompletionStream = ChatStream(top_logprobs=request.top_logprobs)
        else:
            path, body = completion_request(request, self.context_length)
            if path == "/completion":
                body["prompt"] = await self._fitted_prompt(request)
            parser = CompletionStream(request.top_logprobs)
        # Progress events during prompt processing keep bytes flowing while the runner
        # works, so the stall deadline only catches a runner that stopped.
        body["return_progress"] = True
        data = json.dumps(body, separators=(",", ":")).encode()
        async with self._slots, AsyncExitStack() as stack:
            with trio.move_on_after(self.stall_timeout) as stall:
                try:
                    _, events = await stack.enter_async_context(self.http.stream(path, data))
                except RunnerStatusError as exc:
                    raise self._error_from_body(exc.status, exc.body) from None
                except RunnerConnectionError as exc:
                    raise await self._runner_gone(exc) from exc
            if stall.cancelled_caught:
                raise await self._stalled()
            # Leaving closes the connection: that is what tells llama.cpp to stop and free
            # the slot (synchronously, so it happens in a cancelled scope too).
            context = _Context(self, request) if request.return_context else None
            async with stall_guard(self) as stall:
                yield _ChunkStream(self, events, parser, context, stall)

    def _context_limit(self, request: CompletionRequest) -> int:
        """Tokens a request may fill: its own ``num_ctx`` when a runner loaded with a larger
        context serves it, else the runner's context per slot."""
        asked = request.options.get("num_ctx")
        if isinstance(asked, int) and 0 < asked < self.context_length:
            return asked
        return self.context_length

    async def _render(self, request: CompletionRequest) -> str:
        """The prompt llama.cpp's chat template makes of ``request``'s messages."""
        _, body = chat_request(request, self.context_length, self._name)
        template = {k: body[k] for k in _TEMPLATE_FIELDS if k in body}
        return str(json.loads(await self._call("POST", "/apply-template", template))["prompt"])

    async def _fitted_prompt(self, request: CompletionRequest) -> str | list[int]:
        """The prompt, or when it does not fit the context its last tokens (after the BOS),
        cut from the front; 400 naming num_ctx when it does not fit and ``truncate`` is
        false."""
        prompt = request.prompt or ""
        limit = self._context_limit(request)
        if len(prompt.encode()) + 2 <= limit:  # a token covers at least one byte
            return prompt
        tokens = await self.tokenize_prompt(prompt)
        if len(tokens) <= limit:
            return prompt
        if not request.truncate:
            raise InvalidRequestError(
                f"the prompt ({len(tokens)} tokens) exceeds the context length "
                f"(num_ctx {limit}) and truncate is false"
            )
        head = await self.tokenize_prompt("")  # what the tokenizer puts first (BOS)
        if tokens[: len(head)] != head:
            head = []
        log.debug("truncating the prompt: %d tokens to %d", len(tokens), limit)
        return head + tokens[len(tokens) - (limit - len(head)) :]

    async def _fitted(self, request: CompletionRequest) -> CompletionRequest:
        """``request`` with the oldest messages dropped until the conversation, rendered with
        the model's template and tokenized by the runner, fits the context (Ollama's
        ``chatPrompt``): system messages and the latest message always stay.  400 when the
        latest message alone (with the system messages) cannot fit, or, with ``truncate``
        false, when the whole conversation cannot."""
        messages = list(request.messages or ())
        limit = self._context_limit(request)
        # Tokens never outnumber the bytes of the text they encode; a template adds far
        # fewer than 64 tokens a message.  Below that bound nothing needs measuring.
        size = sum(len(str(m.get("content") or "").encode()) for m in messages)
        size += len(json.dumps(list(request.tools or ()))) + 64 * (len(messages) + 1)
        if size <= limit or not messages:
            return request

        async def tokens_from(start: int) -> int:
            kept = [m for m in messages[:start] if m.get("role") == "system"] + messages[start:]
            prompt = await self._render(replace(request, messages=kept))
            return len(await self.tokenize_prompt(prompt))

        whole = await tokens_from(0)
        if whole <= limit:
            return request
        if not request.truncate:
            raise InvalidRequestError(
                f"the conversation ({whole} tokens) exceeds the context length "
                f"(num_ctx {limit}) and truncate is false"
            )
        last = len(messages) - 1
        latest = await tokens_from(last)
        if latest > limit:
            raise InvalidRequestError(
                f"the latest message ({latest} tokens with the system messages) exceeds the "
                f"context length (num_ctx {limit})"
            )
        # The first start that fits: fewer messages never need more tokens (binary search).
        low, high = 1, last
        while low < high:
            middle = (low + high) // 2
            if await tokens_from(middle) <= limit:
                high = middle
            else:
                low = middle + 1
        log.debug("truncating the conversation: dropped %d oldest messages", low)
        kept = [m for m in messages[:low] if m.get("role") == "system"] + messages[low:]
        return replace(request, messages=kept)

    async def embed(
        self, inputs: Sequence[str], *, truncate: bool = True, dimensions: int | None = None
    ) -> Embeddings:
        texts: list[str | list[int]] = list(inputs)
        if truncate:
            texts = [await self._truncated(text) for text in inputs]
        async with self._slots:
            try:
                response = await self._post_json(
                    "/v1/embeddings",
                    {"input": texts, "encoding_format": "float", "model": self._name},
                )
            except (RunnerError, InvalidRequestError) as exc:
                # llama.cpp answers 500 for an input over its batch: the request's fault.
                if isinstance(exc, OutOfMemoryError) or not is_embedding_input_limit(str(exc)):
                    raise
                raise InvalidRequestError(EMBED_INPUT_TOO_LONG) from exc
        try:
            vectors = embedding_vectors(response, len(texts), dimensions)
        except RunnerReportedError as exc:
            raise RunnerError(str(exc)) from exc
        usage = response.get("usage") or {}
        return Embeddings(vectors=vectors, prompt_eval_count=int(usage.get("prompt_tokens", 0)))

    async def _truncated(self, text: str) -> str | list[int]:
        """``text``, or its first tokens when it cannot fit the context (Ollama's truncate)."""
        limit = self.context_length
        if len(text.encode()) + 2 <= limit:  # a token covers at least one byte
            return text
        tokens = await self.tokenize(text)
        return tokens[:limit] if len(tokens) > limit else text

    async def tokenize(self, text: str) -> list[int]:
        body = {"content": text, "add_special": False, "parse_special": True}
        return [int(t) for t in (await self._post_json("/tokenize", body))["tokens"]]

    async def tokenize_prompt(self, text: str) -> list[int]:
        """``text`` as llama.cpp tokenizes a prompt: special tokens parsed, BOS added."""
        body = {"content": text, "add_special": True, "parse_special": True}
        return [int(t) for t in (await self._post_json("/tokenize", body))["tokens"]]

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return str((await self._post_json("/detokenize", {"tokens": list(tokens)}))["content"])

    async def healthy(self) -> bool:
        if self._http is None:
            return False
        with trio.move_on_after(HEALTH_TIMEOUT):
            try:
                status, raw = await self._http.request("GET", "/health")
                return status == 200 and json.loads(raw).get("status") == "ok"
            except (RunnerConnectionError, ValueError, AttributeError):
                return False
        return False

    async def slots(self) -> list[dict[str, Any]]:
        """llama.cpp's ``/slots`` (``is_processing`` per slot)."""
        return list(await self._get_json("/slots"))

    async def metrics(self) -> str:
        return (await self._call("GET", "/metrics")).decode("utf-8", "replace")

    async def _get_json(self, path: str) -> Any:
        return json.loads(await self._call("GET", path))


@asynccontextmanager
async def open_runner_http(socket: str, api_key: str) -> AsyncIterator[RunnerHttp]:
    """The HTTP client for one runner's socket, its pooled connections closed at the end.
    No read timeouts: Trio scopes own the deadlines."""
    http = RunnerHttp(socket, api_key)
    try:
        yield http
    finally:
        http.close()


class ProcessEngine(RunnerClient):
    """A model loaded in a runner subprocess; valid inside its factory's ``open`` block."""

    def __init__(
        self,
        config: RunnerConfig,
        factory: ProcessEngineFactory,
        *,
        owner_fd: int | None = None,
        progress: LoadProgress | None = None,
    ) -> None:
        super().__init__(
            name=config.spec.name,
            context_length=config.spec.num_ctx,
            num_parallel=config.spec.num_parallel,
            stall_timeout=factory.stall_timeout,
        )
        self._config = config
        self._factory = factory
        self._spec = config.spec
        self._owner_fd = owner_fd  # the folder's owner lock, inherited by the runner
        self._tail = LineTail(STDERR_TAIL_BYTES)
        self._exited = trio.Event()
        self._stderr_closed = trio.Event()
        self._stall: trio.CancelScope | None = None
        self._process: trio.Process | None = None
        self._closing = False
        self._killed_for: str | None = None  # why we killed a runner that still served
        self._progress = progress
        self.ready: dict[str, Any] = {}  # the runner's ready line

    # -- Engine protocol: facts --------------------------------------------------------

    @property
    def spec(self) -> LoadSpec:
        return self._spec

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process is not None else None

    @property
    def memory(self) -> MemoryUsage:
        measured = self.ready.get("memory") or {}
        vram = {str(k): int(v) for k, v in (measured.get("vram_by_gpu") or {}).items()}
        host = int(measured.get("rss") or measured.get("uss") or 0)
        return MemoryUsage(total=host + sum(vram.values()), vram_by_gpu=vram)

    @property
    def stderr_lines(self) -> list[str]:
        return self._tail.lines

    # -- lifetime ----------------------------------------------------------------------

    async def _supervise(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Run the runner: spawn, wait until ready, then watch for an unrequested exit."""
        argv = [self._factory.python, "-m", "ollamatrio.runner"]
        try:
            await self._supervise_process(argv, task_status=task_status)
        finally:
            await self._close_pipes()

    async def _supervise_process(
        self, argv: list[str], *, task_status: trio.TaskStatus[None]
    ) -> None:
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                partial(
                    self._run_process,
                    argv,
                    env=self._factory._runner_env(self._spec),
                )
            )
            self._process = process
            assert process.stdin is not None
            assert process.stderr is not None
            nursery.start_soon(self._drain_stderr, process.stderr)
            try:
                await process.stdin.send_all(self._config.to_json().encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # it died at once; the ready wait reports why
            watching = trio.CancelScope()
            if self._progress is not None:
                total = (await trio.Path(self._spec.model_path).stat()).st_size
                self._progress(0, total)
                nursery.start_soon(self._watch_load, process.pid, total, watching)
            try:
                self.ready = await self._wait_ready(process)
            finally:
                watching.cancel()
            if self._progress is not None:
                self._progress(total, total)
            self._context_length = int(self.ready.get("context_length") or self._spec.num_ctx)
            async with open_runner_http(self.ready["socket"], self._config.api_key) as http:
                self._http = http
                task_status.started()
                await self._exited.wait()
                if not self._closing:
                    message = self._killed_for or await self._crash_message()
                    raise RunnerCrashedError(message, self.returncode)

    async def _close_pipes(self) -> None:
        """Close our ends of the runner's stdin, stdout and stderr once nothing reads them
        (``run_process`` leaves them to us): without this each runner's three pipes stay
        open until the garbage collector finds its process object."""
        process = self._process
        if process is None:
            return
        with trio.CancelScope(shield=True):
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    await stream.aclose()

    async def _run_process(
        self, argv: list[str], *, env: dict[str, str], task_status: trio.TaskStatus[trio.Process]
    ) -> None:
        try:
            await trio.run_process(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                pass_fds=() if self._owner_fd is None else (self._owner_fd,),
                check=False,
                deliver_cancel=self._terminate_then_kill,
                task_status=task_status,
            )
        finally:
            self._exited.set()

    async def _watch_load(self, pid: int, total: int, scope: trio.CancelScope) -> None:
        """Report how much of the model file the runner has read, until it is ready."""
        assert self._progress is not None
        with scope:
            await watch_file_reads(pid, self._spec.model_path, total, self._progress)

    async def _terminate_then_kill(self, process: trio.Process) -> None:
        process.terminate()
        with contextlib.suppress(OSError):
            process.send_signal(signal.SIGCONT)  # a stopped runner acts on SIGTERM at once
        with trio.move_on_after(self._factory.kill_grace):
            await process.wait()
        if process.returncode is None:
            log.warning("runner %s ignored SIGTERM; killing it", process.pid)
            process.kill()

    async def _drain_stderr(self, stream: trio.abc.ReceiveStream) -> None:
        try:
            async for data in stream:
                for line in self._tail.feed(data):
                    log.debug("runner: %s", line, extra={"model": self._spec.name})
                if self._stall is not None:
                    self._stall.relative_deadline = self._factory.load_timeout  # progress
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._tail.flush()
            self._stderr_closed.set()

    async def _wait_ready(self, process: trio.Process) -> dict[str, Any]:
        assert process.stdout is not None
        buffer = b""
        with trio.move_on_after(self._factory.load_timeout) as stall:
            self._stall = stall
            try:
                while b"\n" not in buffer:
                    data = await process.stdout.receive_some(65536)
                    if not data:
                        break
                    buffer += data
            finally:
                self._stall = None
        if stall.cancelled_caught:
            last = self._tail.error_text()
            raise RunnerStartError(
                "timed out waiting for llama runner to start"
                + (f" - {last}" if last else f": no progress for {self._factory.load_timeout:g}s")
            )
        line = buffer.split(b"\n", 1)[0].strip()
        if not line:  # stdout closed: the runner died while loading
            raise RunnerStartError(await self._crash_message(during_load=True))
        event: dict[str, Any] = _json_line(line)
        if event.get("event") == "ready":
            return event
        error = str(event.get("error") or "unknown error")
        cls = OutOfMemoryError if event.get("oom") or is_oom(error) else RunnerStartError
        raise cls(f"llama runner failed to load model {self._spec.name!r}: {error}")

    async def _crash_message(self, *, during_load: bool = False) -> str:
        with trio.move_on_after(EXIT_REPORT_WAIT):
            await self._exited.wait()
        with trio.move_on_after(STDERR_SETTLE):
            await self._stderr_closed.wait()
        reason = self._tail.error_text()
        if reason is None and during_load:
            reason = await trio.to_thread.run_sync(_load_log_error, self._config.socket_dir)
        what = "llama runner process has terminated"
        exit_text = describe_exit(self.returncode)
        return f"{what}: {exit_text}" + (f": {reason}" if reason else "")

    async def _runner_gone(self, exc: BaseException | None) -> RunnerError:
        with trio.move_on_after(EXIT_REPORT_WAIT):
            await self._exited.wait()
        if self._killed_for is not None:
            return RunnerCrashedError(self._killed_for, self.returncode)
        if self._exited.is_set() and not self._closing:
            return RunnerCrashedError(
                "model runner has unexpectedly stopped: " + await self._crash_message(),
                self.returncode,
            )
        return await super()._runner_gone(exc)

    async def _stalled(self) -> RunnerError:
        """Kill the silent runner (SIGKILL: a frozen or wedged process ignores SIGTERM); its
        supervisor reports the exit as a crash, so the scheduler drops it and the next
        request starts a new one."""
        if self._killed_for is None and not self._exited.is_set():
            self._killed_for = self._stall_message() + "; the runner was killed"
            log.warning("%s (pid %s)", self._killed_for, self.pid, extra={"model": self._spec.name})
            assert self._process is not None
            with contextlib.suppress(OSError):
                self._process.kill()
        with trio.move_on_after(EXIT_REPORT_WAIT):
            await self._exited.wait()
        return RunnerCrashedError(self._killed_for or self._stall_message(), self.returncode)

    async def healthy(self) -> bool:
        return not self._exited.is_set() and await super().healthy()


@asynccontextmanager
async def stall_guard(engine: RunnerClient) -> AsyncIterator[trio.CancelScope]:
    """The stall deadline of one generation: a scope around the whole stream that its reads
    arm (``_ChunkStream._read``) and disarm, cheaper per token than a scope per read.  When
    it fires, the block ends with the engine's stall error."""
    with trio.CancelScope() as scope:
        yield scope
    if scope.cancelled_caught:
        raise await engine._stalled()


class _Context:
    """/api/generate's ``context`` for one generation: the prompt and the answer as token
    ids, computed once the answer is complete (Ollama tokenizes prompt + answer text)."""

    def __init__(self, engine: RunnerClient, request: CompletionRequest) -> None:
        self._engine = engine
        self._request = request
        self._answer: list[str] = []

    async def annotate(self, batch: list[Chunk]) -> list[Chunk]:
        out = []
        for chunk in batch:
            self._answer.append(chunk.content)
            if chunk.done:
                request = self._request
                prompt = request.prompt
                if prompt is None:
                    prompt = await self._engine._render(request)
                tokens = await self._engine.tokenize_prompt(prompt + "".join(self._answer))
                chunk = replace(chunk, context=tuple(tokens))
            out.append(chunk)
        return out


class _ChunkStream:
    """Pull-based stream of one generation's chunks (no task of its own).

    :meth:`next_batch` returns every chunk the runner's last wake-up delivered, so a relay
    can write them to its client at once; iterating gives them one by one."""

    def __init__(
        self,
        engine: RunnerClient,
        events: EventSource,
        parser: ChatStream | CompletionStream,
        context: _Context | None,
        stall: trio.CancelScope,
    ) -> None:
        """``stall``: the scope of :func:`stall_guard` around the stream's use."""
        self._engine = engine
        self._events = events
        self._stall = stall
        self._parser = parser
        self._context = context
        self._pending: list[Chunk] = []
        self._finished = False
        self._last_piece = ""
        self._repeats = 0
        self._pieces = 0

    def __aiter__(self) -> _ChunkStream:
        return self

    async def __anext__(self) -> Chunk:
        while not self._pending:
            if self._finished:
                raise StopAsyncIteration
            self._pending = await self.next_batch()
        return self._pending.pop(0)

    async def next_batch(self) -> list[Chunk]:
        """The chunks of the next wake-up; ``[]`` once the generation has ended."""
        if self._pending:
            batch, self._pending = self._pending, []
            return batch
        while not self._finished:
            batch = self._guard(await self._read())
            if batch:
                return batch if self._context is None else await self._context.annotate(batch)
        return []

    def _guard(self, chunks: list[Chunk]) -> list[Chunk]:
        """Ollama's guard (B61): a model emitting the same piece over and over is stuck;
        end the answer at the piece past the limit (closing the stream stops llama.cpp)."""
        for i, chunk in enumerate(chunks):
            if chunk.content and not chunk.done and self._stuck(chunk.content):
                log.debug("prediction aborted: %r repeated %d times", chunk.content, self._repeats)
                self._finished = True
                return [*chunks[:i], Chunk(done=True, done_reason="stop", eval_count=self._pieces)]
        return chunks

    def _stuck(self, piece: str) -> bool:
        self._pieces += 1
        if piece == self._last_piece:
            self._repeats += 1
        else:
            self._last_piece, self._repeats = piece, 0
        return self._repeats > REPEAT_LIMIT

    async def _read(self) -> list[Chunk]:
        timeout = self._engine.stall_timeout
        stall = self._stall if timeout != math.inf else None
        if stall is not None:
            stall.deadline = trio.current_time() + timeout
        try:
            events = await self._events.next_batch()
        except RunnerConnectionError as exc:
            self._finished = True
            raise await self._engine._runner_gone(exc) from exc
        finally:
            if stall is not None:
                stall.deadline = math.inf  # the time spent elsewhere is not a stall
        chunks: list[Chunk] = []
        try:
            for event in events:
                chunks.extend(self._parser.feed(event))
        except RunnerReportedError as exc:
            self._finished = True
            raise self._engine._reported(exc) from None
        if isinstance(self._parser, CompletionStream) and self._parser.done:
            self._finished = True
        elif not events:  # the response ended
            chunks.extend(self._parser.finish())
            self._finished = True
            if not self._parser.done:  # it stopped without its final event
                raise await self._engine._runner_gone(None)
        return chunks


def _json_line(line: bytes) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise RunnerStartError(f"runner printed an unexpected line: {line[:200]!r}") from exc
    if not isinstance(event, dict):
        raise RunnerStartError(f"runner printed an unexpected line: {line[:200]!r}")
    return event


def _load_log_error(socket_dir: str) -> str | None:
    """llama.cpp's error text from the runner's load log (survives an abort during load)."""
    try:
        with open(os.path.join(socket_dir, "load.log"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - STDERR_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return llama_error_text(text.splitlines())
