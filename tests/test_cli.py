"""The command line driven as a user drives it: ``python -m ollamatrio`` subprocesses
against a real server (simulated engine), in a pipe and in a pseudo-terminal."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from ollamatrio._version import __version__
from ollamatrio.cli.humanize import human_bytes
from ollamatrio.cli.progress import SPINNER_FRAMES
from ollamatrio.store import MEDIA_MODEL, MEDIA_TEMPLATE
from ollamatrio.testing.fake_registry import FakeRegistry, Stall

if TYPE_CHECKING:
    from conftest import RunningServer, ServerFactory

TinyGGUF = Callable[..., Path]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\r⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]")
CLI_TIMEOUT = 30


def cli_env(host: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA", "OLLAMATRIO"))}
    env["OLLAMA_HOST"] = host
    env["TERM"] = "xterm"
    return env


async def cli(
    host: str, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(CLI_TIMEOUT):
        return await trio.run_process(
            [sys.executable, "-m", "ollamatrio", *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env or cli_env(host),
        )


def text(result: subprocess.CompletedProcess[bytes]) -> tuple[str, str]:
    return result.stdout.decode(), result.stderr.decode()


async def api_generate(srv: RunningServer, prompt: str) -> str:
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        body = {"model": "tiny", "prompt": prompt, "stream": False}
        response = await client.post("/api/generate", json=body)
    response.raise_for_status()
    return str(response.json()["response"])


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- one-shot run ----------------------------------------------------------------------


async def test_run_with_a_prompt_prints_the_generation(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        expected = await api_generate(srv, "Why is the sky blue?")
        out, err = text(await cli(srv.url, "run", "tiny", "Why is the sky blue?"))
    assert out == expected + "\n\n"
    assert err == ""  # no spinner in a pipe


async def test_run_reads_the_prompt_from_stdin(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        expected = await api_generate(srv, "Tell me a story")
        result = await cli(srv.url, "run", "tiny", stdin=b"Tell me a story")
    assert result.returncode == 0
    assert result.stdout.decode() == expected + "\n\n"


async def test_run_verbose_prints_ollama_timings(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        result = await cli(srv.url, "run", "tiny", "--verbose", "hi", "there")
    _, err = text(result)
    assert result.returncode == 0
    lines = err.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "total duration",
        "load duration",
        "prompt eval count",
        "prompt eval duration",
        "prompt eval rate",
        "eval count",
        "eval duration",
        "eval rate",
    ]
    assert re.fullmatch(r"eval count: {11}16 token\(s\)", lines[5])
    assert re.fullmatch(r"eval rate: {12}\d+\.\d\d tokens/s", lines[7])


async def test_run_keepalive_sets_the_expiry(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        await cli(srv.url, "run", "tiny", "hi", "--keepalive", "10m")
        out, _ = text(await cli(srv.url, "ps"))
    assert out.splitlines()[1].endswith("9 minutes from now")


async def test_run_missing_model_tries_to_pull_and_fails(api_server: ServerFactory) -> None:
    # An unreachable registry: the pull fails at once, and the error reaches the user.
    port = free_port()
    async with api_server() as srv:
        result = await cli(srv.url, "run", "--insecure", f"127.0.0.1:{port}/library/nosuch", "hi")
        out, _ = text(await cli(srv.url, "list"))
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 1
    assert lines[0] == "pulling manifest"
    assert lines[-1].startswith("Error: pull model manifest: ")
    assert "nosuch" not in out


# --- pull ------------------------------------------------------------------------------


@pytest.fixture
async def registry(nursery: trio.Nursery, tiny_gguf: TinyGGUF) -> FakeRegistry:
    """A registry on 127.0.0.1 serving ``library/tiny:latest`` (weights and a template)."""
    fake = FakeRegistry()
    await nursery.start(fake.serve)
    fake.add_model(
        "library/tiny:latest",
        [(MEDIA_MODEL, tiny_gguf(seed=3).read_bytes()), (MEDIA_TEMPLATE, b"{{ .Prompt }}")],
    )
    return fake


async def test_pull_prints_a_line_per_layer(
    api_server: ServerFactory, registry: FakeRegistry, tiny_gguf: TinyGGUF
) -> None:
    name = registry.model_name("library/tiny:latest")
    weights = tiny_gguf(seed=3).read_bytes()
    digest = hashlib.sha256(weights).hexdigest()
    async with api_server() as srv:
        result = await cli(srv.url, "pull", "--insecure", name)
        listed, _ = text(await cli(srv.url, "list"))
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 0
    assert lines[0] == "pulling manifest"
    assert lines[1] == f"pulling {digest[:12]}: 100% {human_bytes(len(weights))}"
    assert len(lines) == 7  # manifest, weights, template, config, verify, write, success
    for line in lines[2:4]:
        assert re.fullmatch(r"pulling [0-9a-f]{12}: 100% \d+ B", line), line
    assert lines[4:] == ["verifying sha256 digest", "writing manifest", "success"]
    assert f"{name}    " in listed


async def test_run_pulls_a_missing_model_first(
    api_server: ServerFactory, registry: FakeRegistry
) -> None:
    name = registry.model_name("library/tiny:latest")
    async with api_server() as srv:
        result = await cli(srv.url, "run", "--insecure", name, "Hello")
    out, err = text(result)
    assert result.returncode == 0
    assert err.splitlines()[0] == "pulling manifest"
    assert err.splitlines()[-1] == "success"
    assert len(out.split()) == 16


async def test_interrupted_pull_resumes_where_it_stopped(
    api_server: ServerFactory, registry: FakeRegistry, nursery: trio.Nursery
) -> None:
    weights = os.urandom(3 << 20)
    digest = "sha256:" + hashlib.sha256(weights).hexdigest()
    registry.add_model("library/big:latest", [(MEDIA_MODEL, weights)])
    stall = Stall(after=1 << 20, seconds=600)  # 1 MiB arrives, then the network hangs
    registry.stalls[digest] = [stall]
    name = registry.model_name("library/big:latest")
    async with api_server() as srv:
        first = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-m", "ollamatrio", "pull", "--insecure", name],
                env=cli_env(srv.url),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        )
        with trio.fail_after(CLI_TIMEOUT):
            await stall.began.wait()
            first.send_signal(signal.SIGINT)  # the user gives up: Ctrl-C
            assert await first.wait() != 0
        listed, _ = text(await cli(srv.url, "list"))
        assert "big" not in listed  # nothing half-pulled is ever a model
        second = await cli(srv.url, "pull", "--insecure", name)
        listed, _ = text(await cli(srv.url, "list"))
    assert second.returncode == 0, second.stderr
    assert "big:latest" in listed
    ranges = [r.range for r in registry.requests if r.path.endswith(digest) and r.method == "GET"]
    assert ranges[-1] is not None
    assert not ranges[-1].startswith("bytes=0-")  # the second pull went on from the partial
    assert registry.bytes_served[digest] < len(weights) + (1 << 20) // 2


# --- list, ps, show, stop, cp, rm ------------------------------------------------------


async def test_list_columns(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            tags = (await client.get("/api/tags")).json()["models"]
        out, _ = text(await cli(srv.url, "list"))
        filtered, _ = text(await cli(srv.url, "ls", "tiny-e"))
    header, *rows = out.splitlines()
    assert re.fullmatch(r"NAME {17}ID {14}SIZE {6}MODIFIED", header)
    names = sorted(row.split()[0] for row in rows)
    assert names == ["tiny-embed:latest", "tiny:latest"]
    for row in rows:
        assert re.fullmatch(
            r"\S+ +[0-9a-f]{12} {4}\d+(\.\d)? (B|KB|MB) +(Less than a second|\d+ seconds?) ago",
            row,
        ), row
    for model in tags:
        assert re.search(rf"^{model['name']} +{model['digest'][:12]} {{4}}", out, re.M)
    assert [row.split()[0] for row in filtered.splitlines()[1:]] == ["tiny-embed:latest"]


async def test_ps_shows_loaded_models(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        empty, _ = text(await cli(srv.url, "ps"))
        await cli(srv.url, "run", "tiny", "hi")
        out, _ = text(await cli(srv.url, "ps"))
    assert empty == "NAME    ID    SIZE    PROCESSOR    CONTEXT    UNTIL\n"
    header, row = out.splitlines()
    assert re.fullmatch(r"NAME +ID +SIZE +PROCESSOR {4}CONTEXT {4}UNTIL", header)
    assert re.fullmatch(
        r"tiny:latest {4}[0-9a-f]{12} {4}\d+ MB {4}100% CPU +2048 {7}4 minutes from now", row
    ), row


@pytest.mark.parametrize(
    ("gpu_total", "processor"),
    [(8 << 30, r"100% GPU"), ((546 + 300) << 20, r"\d+%/\d+% CPU/GPU")],
    ids=["fits", "partial-offload"],
)
async def test_ps_processor_column_with_a_gpu(
    api_server: ServerFactory, tiny_gguf: TinyGGUF, gpu_total: int, processor: str
) -> None:
    big = tiny_gguf(layers=8, embd=2048, heads=16, vocab=32000, dtype="f16", sparse=True)
    gpus = [{"id": "sim0", "total": gpu_total}]
    async with api_server(gpus=gpus, models={"big": big}) as srv:
        await cli(srv.url, "run", "big", "hi")
        out, _ = text(await cli(srv.url, "ps"))
    row = out.splitlines()[1]
    assert re.search(rf" {processor} ", row), row


async def test_stop_unloads(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        await cli(srv.url, "run", "tiny", "hi")
        result = await cli(srv.url, "stop", "tiny")
        out, _ = text(await cli(srv.url, "ps"))
        missing = await cli(srv.url, "stop", "nosuch")
    assert result.returncode == 0
    assert result.stdout == b""
    assert len(out.splitlines()) == 1
    assert missing.returncode == 1
    assert missing.stderr.decode() == 'Error: couldn\'t find model "nosuch" to stop\n'


async def test_copy_and_remove(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        copied = await cli(srv.url, "cp", "tiny", "tiny-copy")
        listed, _ = text(await cli(srv.url, "list"))
        removed = await cli(srv.url, "rm", "tiny-copy")
        after, _ = text(await cli(srv.url, "list"))
        missing = await cli(srv.url, "rm", "tiny-copy")
    assert copied.stdout.decode() == "copied 'tiny' to 'tiny-copy'\n"
    assert "tiny-copy:latest" in listed
    assert removed.stdout.decode() == "deleted 'tiny-copy'\n"
    assert "tiny-copy" not in after
    assert (missing.returncode, missing.stderr.decode()) == (
        1,
        "Error: model 'tiny-copy' not found\n",
    )


async def test_show_sections(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        out, _ = text(await cli(srv.url, "show", "tiny"))
    assert out.startswith("  Model\n    architecture        llama\n    parameters          ")
    assert "    context length      2048\n" in out
    assert "    embedding length    64\n" in out
    assert "    quantization        F32\n\n  Capabilities\n    completion\n" in out


@pytest.mark.parametrize(
    ("flag", "start"),
    [
        ("--modelfile", '# Modelfile generated by "ollama show"\n'),
        ("--template", "{% for message in messages %}"),
    ],
)
async def test_show_one_field(api_server: ServerFactory, flag: str, start: str) -> None:
    async with api_server() as srv:
        result = await cli(srv.url, "show", "tiny", flag)
    assert result.returncode == 0
    assert result.stdout.decode().startswith(start)


async def test_show_refuses_two_fields(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        result = await cli(srv.url, "show", "tiny", "--system", "--license")
    assert result.returncode == 1
    assert result.stderr.decode() == (
        "Error: only one of '--license', '--modelfile', '--parameters', '--system', "
        "or '--template' can be specified\n"
    )


async def test_version_shows_server_and_client(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        out, _ = text(await cli(srv.url, "--version"))
    assert out == f"ollamatrio version is {__version__}\n"


# --- create ----------------------------------------------------------------------------


async def test_create_uploads_then_creates(
    api_server: ServerFactory, tiny_gguf: TinyGGUF, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(tiny_gguf(seed=7), work / "weights.gguf")  # not yet in the store
    digest = "sha256:" + hashlib.sha256((work / "weights.gguf").read_bytes()).hexdigest()
    (work / "Modelfile").write_text(
        "FROM ./weights.gguf\n"
        "PARAMETER temperature 0.25\n"
        'PARAMETER stop "<|end|>"\n'
        "SYSTEM You answer in one word.\n"
        "LICENSE MIT\n"
    )
    async with api_server() as srv:
        blob = srv.settings.models_dir / "blobs" / digest.replace(":", "-")
        assert not blob.exists()
        first = await cli(srv.url, "create", "oneword", "-f", str(work / "Modelfile"))
        uploaded = blob.exists()
        again = await cli(srv.url, "create", "oneword", "-f", str(work / "Modelfile"))
        shown, _ = text(await cli(srv.url, "show", "oneword"))
        system, _ = text(await cli(srv.url, "show", "oneword", "--system"))
    assert first.returncode == 0, first.stderr
    assert uploaded
    lines = first.stderr.decode().splitlines()
    assert lines[:4] == [
        "gathering model components",
        f"copying file {digest} 100%",
        "parsing GGUF",
        f"using existing layer {digest}",
    ]
    assert all(line.startswith("creating new layer sha256:") for line in lines[4:-2])
    assert lines[-2:] == ["writing manifest", "success"]
    # The second time the blob is already there: no upload, layers reused.
    assert again.returncode == 0
    assert "creating new layer" not in again.stderr.decode()
    assert '    stop           "<|end|>"\n    temperature    0.25\n' in shown
    assert "  System\n    You answer in one word.\n" in shown
    assert "  License\n    MIT\n" in shown
    assert system == "You answer in one word."


async def test_create_reports_modelfile_errors(api_server: ServerFactory, tmp_path: Path) -> None:
    (tmp_path / "Modelfile").write_text("FROM ./nowhere.gguf\nPARAMETER bogus 1\n")
    async with api_server() as srv:
        bad = await cli(srv.url, "create", "x", "-f", str(tmp_path / "Modelfile"))
        absent = await cli(srv.url, "create", "x", "-f", str(tmp_path / "Nope"))
    assert (bad.returncode, bad.stderr.decode()) == (
        1,
        "Error: line 2: unknown parameter 'bogus'\n",
    )
    assert absent.stderr.decode() == "Error: specified Modelfile wasn't found\n"


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["list"], ["ps"], ["show", "tiny"], ["run", "tiny", "hi"], ["stop", "tiny"]],
    ids=lambda a: a[0],
)
async def test_server_down(args: list[str]) -> None:
    port = free_port()
    result = await cli(f"127.0.0.1:{port}", *args)
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode() == (
        f"Error: could not connect to ollamatrio server, is it running? (http://127.0.0.1:{port})\n"
    )


async def test_version_warns_when_server_is_down() -> None:
    result = await cli(f"127.0.0.1:{free_port()}", "--version")
    assert result.returncode == 0
    assert result.stdout.decode() == (
        "Warning: could not connect to a running ollamatrio instance\n"
        f"Warning: client version is {__version__}\n"
    )


async def test_missing_model(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        result = await cli(srv.url, "show", "nosuch")
    assert (result.returncode, result.stderr.decode()) == (1, "Error: model 'nosuch' not found\n")


# --- interactive, in a pseudo-terminal -------------------------------------------------


class Terminal:
    """The master side of a pty running the CLI; ``expect`` reads up to a marker."""

    def __init__(self, process: trio.Process, master: int) -> None:
        self.process = process
        self.stream = trio.lowlevel.FdStream(master)
        self.buffer = b""
        self.transcript = ""  # everything read so far, escape codes removed
        self.raw = ""  # the same, escape codes and spinner frames kept

    async def expect(self, marker: str) -> str:
        needle = marker.encode()
        while (i := self.buffer.find(needle)) < 0:
            try:
                chunk = await self.stream.receive_some(4096)
            except (trio.BrokenResourceError, OSError):
                chunk = b""  # EIO: the child closed the terminal
            if not chunk:
                raise AssertionError(f"no {marker!r} before EOF in {self.buffer!r}")
            self.buffer += chunk
        seen, self.buffer = self.buffer[: i + len(needle)], self.buffer[i + len(needle) :]
        self.raw += seen.decode()
        text = ANSI.sub("", seen.decode())
        self.transcript += text
        return text

    async def send(self, line: str) -> None:
        await self.stream.send_all(line.encode() + b"\r")


@asynccontextmanager
async def open_terminal(host: str, *args: str) -> AsyncIterator[Terminal]:
    """The CLI with a pseudo-terminal as stdin, stdout and stderr; killed if still running
    when the block ends."""
    master, slave = os.openpty()
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "ollamatrio", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=cli_env(host),
        )
    finally:
        os.close(slave)
    term = Terminal(process, master)
    try:
        yield term
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
            await term.stream.aclose()


def eval_counts(transcript: str) -> list[int]:
    return [int(n) for n in re.findall(r"prompt eval count: +(\d+) token", transcript)]


async def test_interactive_chat(api_server: ServerFactory) -> None:
    async with api_server() as srv, open_terminal(srv.url, "run", "tiny") as term:
        with trio.fail_after(CLI_TIMEOUT):
            await term.expect(">>> ")
            await term.send("/set verbose")
            assert "Set 'verbose' mode." in await term.expect(">>> ")
            await term.send("Hello there")
            first = await term.expect(">>> ")
            await term.send('"""')
            await term.expect("... ")
            await term.send("line one")
            await term.expect("... ")
            await term.send('line two"""')
            second = await term.expect(">>> ")
            await term.send("/?")
            helptext = await term.expect(">>> ")
            await term.send("/unknown")
            unknown = await term.expect(">>> ")
            await term.send("/bye")
            assert await term.process.wait() == 0
    reply = first.split("Hello there\n", 1)[1].split("\n\ntotal duration")[0]
    assert len(reply.split()) == 16  # the simulated engine's 16 words
    # Every turn sends the whole conversation: the prompt grows turn by turn.
    counts = eval_counts(first + second)
    assert counts[1] > counts[0] + 16
    assert 'Use """ to begin a multi-line message.' in helptext
    assert "Unknown command '/unknown'. Type /? for help" in unknown


async def test_interactive_session_commands(api_server: ServerFactory) -> None:
    async with api_server() as srv, open_terminal(srv.url, "run", "tiny") as term:
        with trio.fail_after(CLI_TIMEOUT):
            await term.expect(">>> ")
            await term.send('/set system """Be')
            await term.expect("... ")
            await term.send('brief."""')
            assert "Set system message." in await term.expect(">>> ")
            await term.send("/show system")
            system = await term.expect(">>> ")
            await term.send("/set parameter stop a b")
            await term.expect(">>> ")
            await term.send("/set parameter presence_penalty 1234567")
            await term.expect(">>> ")
            await term.send("/show parameters")
            parameters = await term.expect(">>> ")
            await term.send("/set verbose")
            await term.expect(">>> ")
            for _ in range(2):
                await term.send("Hello")
                await term.expect(">>> ")
            await term.send("/clear")
            assert "Cleared session context" in await term.expect(">>> ")
            await term.send("Hello")
            after_clear = await term.expect(">>> ")
            await term.send("/bye")
            assert await term.process.wait() == 0
    assert system.endswith("/show system\nBe\nbrief.\n\n>>> ")
    assert "User defined parameters:\n  stop                           [a b]\n" in parameters
    assert "\n  presence_penalty               1.234567e+06\n" in parameters  # Go's %v
    # /clear keeps only the system message: the prompt is as short as the first turn's.
    counts = eval_counts(term.transcript)
    assert counts[1] > counts[0]
    assert eval_counts(after_clear) == counts[:1]


async def test_run_shows_the_load_as_a_bar_then_the_answer(api_server: ServerFactory) -> None:
    """The model is not loaded: the stream's load_progress lines drive a bar (cleared when
    the answer starts); in a pipe there is no bar, as there is no spinner."""
    from ollamatrio.engines.simulated import SimulatedBehaviour

    slow = SimulatedBehaviour(load_seconds=1.0, tokens_per_second=2000)
    async with api_server(behaviour=slow) as srv:
        async with open_terminal(srv.url, "run", "tiny", "Why is the sky blue?") as term:
            with trio.fail_after(CLI_TIMEOUT):
                await term.expect("loading tiny: ")
                await term.expect("\r\n\r\n")  # the end of the answer
        expected = await api_generate(srv, "Why is the sky blue?")
        await cli(srv.url, "stop", "tiny")
        _, err = text(await cli(srv.url, "run", "tiny", "Why is the sky blue?"))
    shown = [int(p) for p in re.findall(r"loading tiny: +(\d+)%", term.transcript)]
    assert any(0 < p < 100 for p in shown), shown
    assert shown == sorted(shown)
    answer = term.transcript[term.transcript.rindex("%") :]
    assert expected.strip() in answer
    assert err == ""


def load_percents(transcript: str, model: str = "tiny") -> list[int]:
    return [int(p) for p in re.findall(rf"loading {model}: +(\d+)%", transcript)]


def assert_cleared(raw: str) -> None:
    """The bar was erased (``Progress.stop(clear=True)``) after its last drawing."""
    assert raw.rindex("loading tiny") < raw.rindex("\r\x1b[J\x1b[?25h") < raw.rindex(">>> ")


async def test_interactive_run_shows_the_load_as_a_bar(api_server: ServerFactory) -> None:
    """The load-only request is answered with one object, so the bar follows the server's
    /api/events; it is cleared before the prompt, and ``/load`` shows it again."""
    from ollamatrio.engines.simulated import SimulatedBehaviour

    slow = SimulatedBehaviour(load_seconds=1.0, tokens_per_second=2000)
    async with api_server(behaviour=slow) as srv, open_terminal(srv.url, "run", "tiny") as term:
        hub = srv.scheduler.events
        with trio.fail_after(CLI_TIMEOUT):
            await term.expect(">>> ")
            first, first_raw = term.transcript, term.raw
            await hub.wait_subscribers(0)  # the CLI closed its subscription once loaded
            async with hub.subscribe() as events:
                await cli(srv.url, "stop", "tiny")
                while (await events.receive()).kind != "unloaded":
                    pass
            await term.send("/load tiny")
            second = await term.expect(">>> ")
            await term.send("/bye")
            assert await term.process.wait() == 0
    for transcript in (first, second):
        shown = load_percents(transcript)
        assert any(0 < p < 100 for p in shown), transcript
        assert shown == sorted(shown)
    assert_cleared(first_raw)
    assert_cleared(term.raw)
    assert "Loading model 'tiny'" in second


async def test_interactive_run_of_a_loaded_model_draws_no_bar(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        await api_generate(srv, "hi")  # loaded, and kept for minutes
        async with open_terminal(srv.url, "run", "tiny") as term:
            with trio.fail_after(CLI_TIMEOUT):
                await term.expect(">>> ")
                await term.send("/bye")
                assert await term.process.wait() == 0
            await srv.scheduler.events.wait_subscribers(0)
    assert "loading" not in term.transcript
    assert SPINNER_FRAMES[0] in term.raw


async def test_interactive_run_without_an_events_stream_keeps_the_spinner(
    api_server: ServerFactory,
) -> None:
    """A server without /api/events (Ollama answers 404): the load shows the spinner, as
    before, and the chat opens."""
    answered: list[int] = []
    async with api_server() as srv:
        served = srv.app.asgi_app  # the request chain and everything behind it

        async def without_events(scope: dict, receive: Callable, send: Callable) -> None:
            if scope["type"] == "http" and scope["path"] == "/api/events":
                answered.append(404)  # Gin's answer to a route it does not have
                await send({
                    "type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"18")],
                })  # fmt: skip
                await send({"type": "http.response.body", "body": b"404 page not found"})
                return
            await served(scope, receive, send)

        srv.app.asgi_app = without_events
        async with open_terminal(srv.url, "run", "tiny") as term:
            with trio.fail_after(CLI_TIMEOUT):
                await term.expect(">>> ")
                await term.send("Hello")
                reply = await term.expect(">>> ")
                await term.send("/bye")
                assert await term.process.wait() == 0
    assert answered == [404]
    assert SPINNER_FRAMES[0] in term.raw
    assert "loading" not in term.transcript
    answer = reply.split("Hello\n", 1)[1].split("\n\n")[0]
    assert len(answer.split()) == 16  # the simulated engine's words


async def test_interactive_run_reports_a_failed_load(api_server: ServerFactory) -> None:
    """The load fails halfway: the bar got that far, then the error, as before."""
    from ollamatrio.engines.simulated import SimulatedBehaviour

    broken = SimulatedBehaviour(load_seconds=1.0, fail_load="error")
    async with api_server(behaviour=broken) as srv:
        async with open_terminal(srv.url, "run", "tiny") as term:
            with trio.fail_after(CLI_TIMEOUT):
                await term.expect("Error: ")
                error = await term.expect("\n")
                assert await term.process.wait() == 1
            await srv.scheduler.events.wait_subscribers(0)
        async with httpx.AsyncClient(base_url=srv.url, timeout=CLI_TIMEOUT) as client:
            expected = (await client.post("/api/generate", json={"model": "tiny"})).json()
    shown = load_percents(term.transcript)
    assert any(0 < p < 100 for p in shown), term.transcript
    assert error == expected["error"] + "\n"
    assert term.transcript.endswith(f"Error: {error}")  # nothing else: no traceback


async def test_interactive_ctrl_c_stops_the_answer(api_server: ServerFactory) -> None:
    from ollamatrio.engines.simulated import SimulatedBehaviour

    slow = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=20, default_num_predict=10_000)
    async with api_server(behaviour=slow) as srv, open_terminal(srv.url, "run", "tiny") as term:
        with trio.fail_after(CLI_TIMEOUT):
            await term.expect(">>> ")
            await term.send("Talk forever")
            await term.expect("Talk forever\r\n")
            await term.expect(" ")  # the answer is streaming
            term.process.send_signal(signal.SIGINT)
            await term.expect(">>> ")  # back at the prompt
            # A SIGINT that lands after readline drew the prompt but before it started
            # waiting stays pending until the next keypress (a CPython/readline race, as at
            # a real terminal, where one presses Ctrl-C again): so press it again if needed.
            for _ in range(5):
                term.process.send_signal(signal.SIGINT)
                with trio.move_on_after(2):
                    assert "Use Ctrl + d or /bye to exit." in await term.expect(">>> ")
                    break
            else:
                raise AssertionError(f"Ctrl-C at the prompt was ignored: {term.transcript!r}")
            await term.stream.send_all(b"\x04")  # Ctrl-D
            assert await term.process.wait() == 0
            # Closing the stream cancelled the generation: the runner's only slot is free
            # again, so a short request is served now rather than after 10,000 tokens.
            async with httpx.AsyncClient(base_url=srv.url) as client:
                body = {"model": "tiny", "prompt": "hi", "stream": False}
                body["options"] = {"num_predict": 2}
                response = await client.post("/api/generate", json=body)
    assert response.json()["eval_count"] == 2


# --- serve -----------------------------------------------------------------------------


async def test_serve_runs_until_interrupted(tmp_path: Path) -> None:
    port = free_port()
    env = cli_env(f"127.0.0.1:{port}")
    env |= {"OLLAMA_MODELS": str(tmp_path / "models"), "OLLAMATRIO_ENGINE": "simulated"}
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-m", "ollamatrio", "serve"],
                env=env,
                capture_stderr=True,
                check=False,
            )
        )
        with trio.fail_after(CLI_TIMEOUT):
            async with httpx.AsyncClient() as client:
                while True:  # an external process: poll until it answers
                    try:
                        await client.get(f"http://127.0.0.1:{port}/api/version")
                        break
                    except httpx.TransportError:
                        await trio.sleep(0.05)
            out, _ = text(await cli(f"127.0.0.1:{port}", "--version", env=env))
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 0
    assert out == f"ollamatrio version is {__version__}\n"
