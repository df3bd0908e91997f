"""``run MODEL [PROMPT]``: a one-shot generation, or Ollama's interactive chat."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

from ollamatrio.gofmt import format_value
from ollamatrio.modelfile import PARAMETER_TYPES, ModelfileError, parse_parameter_value

from . import commands
from .client import Client, CLIError, EventStream, ServerError
from .humanize import go_duration
from .progress import Progress, show_load

_GREY, _BOLD, _RESET = "\x1b[90m", "\x1b[1m", "\x1b[0m"


@dataclass
class RunOptions:
    """What one ``run`` session sends with every request."""

    model: str
    keep_alive: str | int | None = None
    format: str | None = None
    verbose: bool = False
    think: bool | str | None = None
    hide_thinking: bool = False
    system: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def common(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model}
        if self.format:
            body["format"] = self.format
        if self.options:
            body["options"] = dict(self.options)
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        if self.think is not None:
            body["think"] = self.think
        return body


def summary(final: dict[str, Any], out: TextIO) -> None:
    """Ollama's ``Metrics.Summary`` (``--verbose``), on stderr."""

    def ns(key: str) -> int:
        return int(final.get(key) or 0)

    lines = []
    if ns("total_duration") > 0:
        lines.append(f"total duration:       {go_duration(ns('total_duration'))}")
    if ns("load_duration") > 0:
        lines.append(f"load duration:        {go_duration(ns('load_duration'))}")
    if ns("prompt_eval_count") > 0:
        lines.append(f"prompt eval count:    {ns('prompt_eval_count')} token(s)")
    if ns("prompt_eval_duration") > 0:
        # The duration is that of the evaluated tokens only: reused ones took no time.
        evaluated = ns("prompt_eval_count") - ns("prompt_cached_count")
        rate = evaluated / (ns("prompt_eval_duration") / 1e9)
        lines.append(f"prompt eval duration: {go_duration(ns('prompt_eval_duration'))}")
        lines.append(f"prompt eval rate:     {rate:.2f} tokens/s")
    if ns("eval_count") > 0:
        lines.append(f"eval count:           {ns('eval_count')} token(s)")
    if ns("eval_duration") > 0:
        rate = ns("eval_count") / (ns("eval_duration") / 1e9)
        lines.append(f"eval duration:        {go_duration(ns('eval_duration'))}")
        lines.append(f"eval rate:            {rate:.2f} tokens/s")
    out.write("".join(line + "\n" for line in lines))
    out.flush()


class ResponseWriter:
    """Streams thinking and content to the terminal as they arrive."""

    def __init__(self, out: TextIO, *, hide_thinking: bool) -> None:
        self.out = out
        self.plain = not out.isatty()
        self.hide_thinking = hide_thinking
        self.content: list[str] = []
        self.thinking: list[str] = []
        self._thinking_open = False

    def write(self, content: str, thinking: str) -> None:
        if thinking:
            self.thinking.append(thinking)
            if not self.hide_thinking:
                if not self._thinking_open:
                    self.out.write(
                        "Thinking...\n"
                        if self.plain
                        else f"{_GREY}{_BOLD}Thinking...{_RESET}{_GREY}\n"
                    )
                    self._thinking_open = True
                self.out.write(thinking)
        if content:
            self.close_thinking()
            self.content.append(content)
            self.out.write(content)
        self.out.flush()

    def close_thinking(self) -> None:
        if not self._thinking_open:
            return
        self._thinking_open = False
        if not "".join(self.thinking).endswith("\n"):
            self.out.write("\n")
        self.out.write(
            "...done thinking.\n\n"
            if self.plain
            else f"{_GREY}{_BOLD}...done thinking.{_RESET}\n\n"
        )


class Session:
    """One ``run`` invocation: the model, its options and the chat so far."""

    def __init__(
        self,
        client: Client,
        opts: RunOptions,
        *,
        out: TextIO = sys.stdout,
        err: TextIO = sys.stderr,
    ) -> None:
        self.client = client
        self.opts = opts
        self.out = out
        self.err = err
        self._pending_system = ""  # first line of a multi-line /set system

    # --- requests ---

    def ensure_model(self, *, insecure: bool = False) -> dict[str, Any]:
        """``/api/show`` the model, pulling it first when the server does not have it."""
        try:
            return self._model_info()
        except ServerError as exc:
            if exc.status != 404:
                raise
        commands.pull(self.client, self.opts.model, insecure=insecure, err=self.err)
        return self._model_info()

    def _model_info(self) -> dict[str, Any]:
        info = self.client.json("POST", "/api/show", {"model": self.opts.model})
        return cast(dict[str, Any], info)  # /api/show answers a JSON object

    def load(self) -> None:
        """Load the model (an empty generate) behind a spinner, as ``ollama run`` does; on
        a terminal a bar follows the load, fed by the server's events (the load-only
        answer is one JSON object, as Ollama's, so it cannot carry progress itself)."""
        progress = Progress(self.err)
        progress.spinner("")
        body: dict[str, Any] = {"model": self.opts.model}
        if self.opts.keep_alive is not None:
            body["keep_alive"] = self.opts.keep_alive
        try:
            with self._load_bar(progress), self.client.stream("/api/generate", body) as events:
                for _ in events:
                    pass
        finally:
            progress.stop(clear=True)

    @contextmanager
    def _load_bar(self, progress: Progress) -> Iterator[None]:
        """While the block runs, a thread moves a bar from ``/api/events``' ``loading``
        events for the model; without that stream (Ollama) the spinner stays alone."""
        if not progress.tty:  # a pipe gets no bar, as it gets no spinner
            yield
            return
        with self.client.events(self.opts.model) as events:
            if events is None:
                yield
                return
            # Subscribed before the load is asked for, so its first event is not missed.
            reader = threading.Thread(
                target=self._follow_load, args=(events, progress), name="load-events"
            )
            reader.start()
            try:
                yield
            finally:
                events.interrupt()
                reader.join()  # so that nothing draws once the caller stops the progress

    def _follow_load(self, events: EventStream, progress: Progress) -> None:
        bar = None
        for event in events:
            if event.get("event") == "loading":
                bar = show_load(progress, bar, f"loading {self.opts.model}", event)

    def _stream(self, path: str, body: dict[str, Any]) -> tuple[ResponseWriter, dict[str, Any]]:
        writer = ResponseWriter(self.out, hide_thinking=self.opts.hide_thinking)
        final: dict[str, Any] = {}
        progress = Progress(self.err)
        progress.spinner("")
        waiting = True
        bar = None  # while the server loads the model
        try:
            with self.client.stream(path, body) as events:
                for event in events:
                    if "load_progress" in event:  # the server loads the model first
                        if progress.tty:  # a pipe gets no bar, as it gets no spinner
                            label = f"loading {self.opts.model}"
                            bar = show_load(progress, bar, label, event["load_progress"])
                        continue
                    message = event.get("message") or {}
                    content = event.get("response") or message.get("content") or ""
                    thinking = event.get("thinking") or message.get("thinking") or ""
                    if waiting and (content or (thinking and not self.opts.hide_thinking)):
                        progress.stop(clear=True)
                        waiting = False
                    writer.write(content, thinking)
                    if event.get("done"):
                        final = event
        finally:
            progress.stop(clear=True)
            writer.close_thinking()
        return writer, final

    def generate(self, prompt: str) -> None:
        """One-shot: ``/api/generate`` streamed to stdout."""
        body = self.opts.common() | {"prompt": prompt}
        if self.opts.system:
            body["system"] = self.opts.system
        try:
            _, final = self._stream("/api/generate", body)
        except KeyboardInterrupt:
            self.out.write("\n")
            return
        if prompt:
            self.out.write("\n\n")
            self.out.flush()
        if self.opts.verbose and final:
            summary(final, self.err)

    def chat(self, text: str) -> None:
        """Send one user turn with the whole history; Ctrl-C abandons the turn."""
        self.opts.messages.append({"role": "user", "content": text})
        body = self.opts.common() | {"messages": list(self.opts.messages)}
        try:
            writer, final = self._stream("/api/chat", body)
        except KeyboardInterrupt:
            self.opts.messages.pop()  # the turn never got an answer
            self.client.reset()
            self.out.write("\n\n")
            self.out.flush()
            return
        except CLIError:
            self.opts.messages.pop()
            raise
        reply: dict[str, Any] = {"role": "assistant", "content": "".join(writer.content)}
        if writer.thinking:
            reply["thinking"] = "".join(writer.thinking)
        self.opts.messages.append(reply)
        self.out.write("\n\n")
        self.out.flush()
        if self.opts.verbose and final:
            summary(final, self.err)

    # --- interactive ---

    def interactive(self, info: dict[str, Any]) -> int:
        try:  # line editing and in-session history for input()
            import readline  # noqa: F401
        except ImportError:
            pass
        for message in info.get("messages") or []:
            if message.get("role") == "user":
                self.out.write(f">>> {message.get('content', '')}\n")
            elif message.get("role") == "assistant":
                self.out.write(f"{message.get('content', '')}\n\n")
        buffer: list[str] = []
        multiline: str | None = None  # None, "prompt" or "system"
        while True:
            try:
                line = input("... " if multiline else ">>> ")
            except EOFError:
                self.out.write("\n")
                return 0
            except KeyboardInterrupt:
                self.out.write("\nUse Ctrl + d or /bye to exit.\n")
                buffer.clear()
                multiline = None
                continue

            if multiline:
                before, ended = _cut_suffix(line, '"""')
                buffer.append(before)
                if not ended:
                    buffer.append("\n")
                    continue
                if multiline == "system":
                    self._set_system("".join(buffer))
                    buffer.clear()
                multiline = None
            elif line.startswith('"""'):
                rest, ended = _cut_suffix(line[3:], '"""')
                buffer.append(rest)
                if not ended:
                    buffer.append("\n")
                    multiline = "prompt"
                    continue
            elif line.startswith("/"):
                action = self.command(line)
                if action == "exit":
                    return 0
                if action == "system":
                    multiline = "system"
                    buffer += [self._pending_system, "\n"]
                continue
            else:
                buffer.append(line)

            text = "".join(buffer)
            buffer.clear()
            if text:
                self.chat(text)

    def _set_system(self, text: str) -> None:
        self.opts.system = text
        message = {"role": "system", "content": text}
        if self.opts.messages and self.opts.messages[-1]["role"] == "system":
            self.opts.messages[-1] = message
        else:
            self.opts.messages.append(message)
        self.out.write("Set system message.\n")

    def command(self, line: str) -> str | None:
        """Handle a ``/`` command; returns ``"exit"``, ``"system"`` (a multi-line system
        message follows) or None."""
        args = line.split()
        name = args[0]
        if name in ("/bye", "/exit"):
            return "exit"
        if name in ("/?", "/help"):
            topic = args[1].lstrip("/") if len(args) > 1 else ""
            usage = {
                "set": USAGE_SET,
                "show": USAGE_SHOW,
                "shortcut": USAGE_SHORTCUTS,
                "shortcuts": USAGE_SHORTCUTS,
            }
            self.err.write(usage.get(topic, USAGE))
        elif name == "/clear":
            self.opts.messages = []
            if self.opts.system:
                self.opts.messages.append({"role": "system", "content": self.opts.system})
            self.out.write("Cleared session context\n")
        elif name == "/set":
            return self._set(args[1:], line)
        elif name == "/show":
            self._show(args[1:])
        elif name == "/load":
            self._load(args[1:])
        else:
            self.out.write(f"Unknown command '{name}'. Type /? for help\n")
        return None

    def _set(self, args: list[str], line: str) -> str | None:
        if not args:
            self.err.write(USAGE_SET)
            return None
        what = args[0]
        if what == "verbose":
            self.opts.verbose = True
            self.out.write("Set 'verbose' mode.\n")
        elif what == "quiet":
            self.opts.verbose = False
            self.out.write("Set 'quiet' mode.\n")
        elif what in ("wordwrap", "nowordwrap"):
            self.out.write(f"Set '{what}' mode.\n")
        elif what in ("history", "nohistory"):
            pass
        elif what == "format":
            if len(args) < 2 or args[1] != "json":
                self.out.write(
                    "Invalid or missing format. For 'json' mode use '/set format json'\n"
                )
            else:
                self.opts.format = "json"
                self.out.write("Set format to 'json' mode.\n")
        elif what == "noformat":
            self.opts.format = None
            self.out.write("Disabled format.\n")
        elif what == "think":
            level = args[1] if len(args) > 1 else ""
            self.opts.think = level or True
            self.out.write(f"Set 'think' mode to '{level}'.\n" if level else "Set 'think' mode.\n")
        elif what == "nothink":
            self.opts.think = False
            self.out.write("Set 'nothink' mode.\n")
        elif what == "parameter":
            self._set_parameter(args[1:])
        elif what == "system":
            if len(args) < 2:
                self.err.write(USAGE_SET)
                return None
            text = line.split(None, 2)[2]
            if text.startswith('"""'):
                inner, ended = _cut_suffix(text[3:], '"""')
                if not ended:
                    self._pending_system = inner
                    return "system"
                text = inner
            self._set_system(text)
        else:
            self.out.write(f"Unknown command '/set {what}'. Type /? for help\n")
        return None

    def _set_parameter(self, args: list[str]) -> None:
        if len(args) < 2:
            self.err.write(USAGE_PARAMETERS)
            return
        name, values = args[0], args[1:]
        try:
            if PARAMETER_TYPES.get(name) is list:
                value: Any = [parse_parameter_value(name, v) for v in values]
            else:
                value = parse_parameter_value(name, values[0])
        except ModelfileError as exc:
            self.out.write(f'Couldn\'t set parameter: "{exc.message}"\n')
            return
        self.opts.options[name] = value
        self.out.write(f"Set parameter '{name}' to '{', '.join(values)}'\n")

    def _show(self, args: list[str]) -> None:
        if not args:
            self.err.write(USAGE_SHOW)
            return
        resp = self.client.json("POST", "/api/show", {"model": self.opts.model})
        what = args[0]
        if what == "info":
            commands.show_info(resp, self.err)
        elif what == "license":
            self.out.write(
                (resp.get("license") or "No license was specified for this model.") + "\n"
            )
        elif what == "modelfile":
            self.out.write(str(resp.get("modelfile") or "") + "\n")
        elif what == "parameters":
            self.out.write("Model defined parameters:\n")
            params = str(resp.get("parameters") or "")
            if not params:
                self.out.write("  No additional parameters were specified for this model.\n")
            for row in params.splitlines() if params else []:
                self.out.write(f"  {row}\n")
            self.out.write("\n")
            if self.opts.options:
                self.out.write("User defined parameters:\n")
                for key, value in self.opts.options.items():
                    self.out.write(f"  {key:<30} {format_value(value)}\n")
                self.out.write("\n")
        elif what == "system":
            system = self.opts.system or resp.get("system")
            self.out.write(
                f"{system}\n\n" if system else "No system message was specified for this model.\n"
            )
        elif what == "template":
            self.out.write(
                (resp.get("template") or "No prompt template was specified for this model.") + "\n"
            )
        else:
            self.out.write(f"Unknown command '/show {what}'. Type /? for help\n")

    def _load(self, args: list[str]) -> None:
        if len(args) != 1:
            self.out.write("Usage:\n  /load <modelname>\n")
            return
        previous = self.opts.model
        self.opts.model = args[0]
        self.out.write(f"Loading model '{args[0]}'\n")
        try:
            self.load()
        except ServerError as exc:
            if "not found" not in str(exc):
                raise
            self.out.write(f"Couldn't find model '{args[0]}'\n")
            self.opts.model = previous
            return
        self.opts.messages = []


def _cut_suffix(text: str, suffix: str) -> tuple[str, bool]:
    if text.endswith(suffix):
        return text[: -len(suffix)], True
    return text, False


USAGE = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.

"""

USAGE_SET = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think             Enable thinking
  /set nothink           Disable thinking

"""

USAGE_SHORTCUTS = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor
  Up / Down           Previous / next line typed in this session

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit ollamatrio (/bye)

"""

USAGE_SHOW = """Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template

"""

USAGE_PARAMETERS = """Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter num_ctx <int>          Set the context size
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter repeat_last_n <int>    Set how far back to look for repetitions
  /set parameter num_gpu <int>          The number of layers to send to the GPU
  /set parameter stop <string> <string> ...   Set the stop parameters

"""


def run(
    client: Client,
    opts: RunOptions,
    prompt_args: list[str],
    *,
    insecure: bool = False,
) -> int:
    """``ollama run``: one-shot when a prompt is given or stdin is piped, else a chat."""
    prompts = list(prompt_args)
    interactive = True
    if not sys.stdin.isatty():
        piped = sys.stdin.read()
        if piped:
            prompts.insert(0, piped)
        interactive = False
    if prompts:
        interactive = False
    if not sys.stdout.isatty():
        interactive = False  # be quiet when writing to a pipe or a file
    session = Session(client, opts)
    info = session.ensure_model(insecure=insecure)
    if interactive:
        session.load()
        return session.interactive(info)
    session.generate(" ".join(prompts))
    return 0
