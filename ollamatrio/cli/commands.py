"""The model-management commands: list, ps, show, stop, rm, cp, pull, push, create, version."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ollamatrio._version import __version__
from ollamatrio.modelfile import (
    BlobUpload,
    ModelfileError,
    decode_modelfile,
    parse_modelfile,
)

from .errors import CLIError, ServerError
from .humanize import (
    human_bytes,
    human_number,
    human_time,
    parse_time,
    processor,
    render_table,
    until,
)
from .progress import Progress, Spinner, StatusRenderer

if TYPE_CHECKING:
    from .client import Client

_UPLOAD_CHUNK = 1 << 20


def _short_digest(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def _matches(name: str, prefix: str | None) -> bool:
    return prefix is None or name.lower().startswith(prefix.lower())


# --- list / ps -------------------------------------------------------------------------


def list_models(client: Client, prefix: str | None = None, out: TextIO = sys.stdout) -> None:
    """``ollama list``: NAME, ID, SIZE, MODIFIED."""
    models = (client.json("GET", "/api/tags") or {}).get("models") or []
    rows = [
        [
            m.get("name", ""),
            _short_digest(m.get("digest", "")),
            human_bytes(int(m.get("size", 0))),
            human_time(parse_time(m.get("modified_at")), "Never"),
        ]
        for m in models
        if _matches(m.get("name", ""), prefix)
    ]
    out.write(render_table(rows, ["NAME", "ID", "SIZE", "MODIFIED"]))


def list_running(client: Client, prefix: str | None = None, out: TextIO = sys.stdout) -> None:
    """``ollama ps``: NAME, ID, SIZE, PROCESSOR, CONTEXT, UNTIL."""
    models = (client.json("GET", "/api/ps") or {}).get("models") or []
    rows = []
    for m in models:
        if not _matches(m.get("name", ""), prefix):
            continue
        size, vram = int(m.get("size", 0)), int(m.get("size_vram", 0))
        rows.append(
            [
                m.get("name", ""),
                _short_digest(m.get("digest", "")),
                human_bytes(size),
                processor(size, vram),
                str(m.get("context_length", 0)),
                until(parse_time(m.get("expires_at"))),
            ]
        )
    out.write(render_table(rows, ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]))


# --- show ------------------------------------------------------------------------------

SHOW_FIELDS = ("license", "modelfile", "parameters", "system", "template")


def show(client: Client, model: str, field: str | None = None, out: TextIO = sys.stdout) -> None:
    """``ollama show``: the sectioned summary, or one raw field (``--modelfile`` ...)."""
    resp = client.json("POST", "/api/show", {"model": model})
    if field is None:
        show_info(resp, out)
        return
    value = resp.get(field) or ""
    if isinstance(value, list):
        value = "\n".join(map(str, value))
    # Ollama prints system and template verbatim, the others with a line break.
    out.write(value if field in ("system", "template") else value + "\n")


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _head(text: str, n: int) -> list[list[str]]:
    """The first ``n`` non-blank lines, then ``...`` if there were more."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    rows = [["", line] for line in lines[:n]]
    if len(lines) > n:
        rows.append(["", "..."])
    return rows


def show_info(resp: Mapping[str, Any], out: TextIO) -> None:
    """Ollama's ``showInfo``: Model, Capabilities, Projector, Parameters, System, License."""

    def section(title: str, rows: list[list[str]], wrap: int = 30) -> None:
        out.write(f"  {title}\n")
        out.write(render_table(rows, wrap=wrap))
        out.write("\n")

    details = resp.get("details") or {}
    info = resp.get("model_info") or {}
    rows: list[list[str]] = []
    if info:
        arch = str(info.get("general.architecture") or "")
        if arch:
            rows.append(["", "architecture", arch])
        params = details.get("parameter_size") or ""
        if not params and isinstance(info.get("general.parameter_count"), int | float):
            params = human_number(int(info["general.parameter_count"]))
        if params:
            rows.append(["", "parameters", params])
        for key, label in (
            ("context_length", "context length"),
            ("embedding_length", "embedding length"),
        ):
            value = info.get(f"{arch}.{key}")
            if isinstance(value, int | float):
                rows.append(["", label, _number(value)])
    else:
        rows.append(["", "architecture", details.get("family", "")])
        rows.append(["", "parameters", details.get("parameter_size", "")])
    rows.append(["", "quantization", details.get("quantization_level", "")])
    if resp.get("requires"):
        rows.append(["", "requires", str(resp["requires"])])
    section("Model", rows)

    if resp.get("capabilities"):
        section("Capabilities", [["", str(c)] for c in resp["capabilities"]])

    projector = resp.get("projector_info") or {}
    if projector:
        arch = str(projector.get("general.architecture") or "")
        prow: list[list[str]] = []
        if arch:
            prow.append(["", "architecture", arch])
        if isinstance(projector.get("general.parameter_count"), int | float):
            prow.append(["", "parameters", human_number(int(projector["general.parameter_count"]))])
        for suffix, label in (
            ("embedding_length", "embedding length"),
            ("projection_dim", "dimensions"),
        ):
            for modality in ("vision", "audio"):
                value = projector.get(f"{arch}.{modality}.{suffix}")
                if isinstance(value, int | float):
                    prow.append(["", label, _number(value)])
                    break
        section("Projector", prow)

    if resp.get("parameters"):
        section(
            "Parameters",
            [["", *line.split()] for line in str(resp["parameters"]).splitlines() if line],
        )
    if resp.get("system"):
        section("System", _head(str(resp["system"]), 2), wrap=100)
    license_text = resp.get("license") or ""
    if isinstance(license_text, list):
        license_text = "\n".join(map(str, license_text))
    if license_text:
        section("License", _head(license_text, 2), wrap=100)


# --- stop / rm / cp --------------------------------------------------------------------


def unload(client: Client, model: str) -> None:
    """Ask the server to unload ``model`` now (an empty generate with ``keep_alive: 0``)."""
    with client.stream("/api/generate", {"model": model, "keep_alive": 0}) as events:
        for _ in events:
            pass


def stop(client: Client, model: str) -> None:
    try:
        unload(client, model)
    except ServerError as exc:
        if "not found" in str(exc).lower():
            raise CLIError(f'couldn\'t find model "{model}" to stop') from exc
        raise


def remove(client: Client, models: list[str], out: TextIO = sys.stdout) -> None:
    for model in models:
        try:  # unload first, like Ollama; a model that is not loaded is fine
            unload(client, model)
        except ServerError as exc:
            if "not found" not in str(exc).lower():
                print(f"Warning: unable to stop model '{model}'", file=sys.stderr)
        client.request("DELETE", "/api/delete", {"model": model})
        out.write(f"deleted '{model}'\n")


def copy(client: Client, source: str, destination: str, out: TextIO = sys.stdout) -> None:
    client.request("POST", "/api/copy", {"source": source, "destination": destination})
    out.write(f"copied '{source}' to '{destination}'\n")


# --- pull ------------------------------------------------------------------------------


def pull(client: Client, model: str, *, insecure: bool = False, err: TextIO | None = None) -> None:
    """``ollama pull`` with a bar per layer, drawn from ``/api/pull``'s progress events."""
    progress = Progress(err or sys.stderr)
    try:
        _draw_transfer(client, "/api/pull", model, insecure, progress)
    finally:
        progress.stop()


def _draw_transfer(
    client: Client, path: str, model: str, insecure: bool, progress: Progress
) -> None:
    """A pull's or push's progress events drawn as a bar per layer."""
    renderer = StatusRenderer(progress)
    body: dict[str, Any] = {"model": model}
    if insecure:
        body["insecure"] = True
    with client.stream(path, body) as events:
        for event in events:
            renderer.feed(event)


# --- push ------------------------------------------------------------------------------

_NOT_YOURS = (
    "you are not authorized to push to this namespace, create the model under a namespace you own"
)


def push(
    client: Client,
    model: str,
    *,
    insecure: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> None:
    """``ollama push`` with a bar per layer, drawn from ``/api/push``'s progress events,
    then where the model is now."""
    from ollamatrio.store.names import parse_name  # only this command needs the store's

    progress = Progress(err or sys.stderr)
    try:
        _draw_transfer(client, "/api/push", model, insecure, progress)
    except ServerError as exc:
        reason = str(exc).lower()
        if "access denied" in reason or "unauthorized" in reason:
            raise CLIError(_NOT_YOURS) from exc  # Ollama's words
        raise
    finally:
        progress.stop()
    destination = parse_name(model)  # the server took the name: it parses
    (out or sys.stdout).write(f"\nYou can find your model at:\n\n\t{destination}\n")


# --- create ----------------------------------------------------------------------------


def read_modelfile(file: str | None) -> tuple[str, Path]:
    """The Modelfile text and the directory its relative paths resolve against."""
    if file is None:
        default = Path("Modelfile")
        if not default.exists():
            return "FROM .\n", Path.cwd()  # Ollama: no Modelfile means "this directory"
        file = str(default)
    path = Path(file).expanduser().absolute()
    if not path.is_file():
        raise CLIError("specified Modelfile wasn't found")
    return decode_modelfile(path.read_bytes()), path.parent


def create(
    client: Client,
    name: str,
    file: str | None,
    *,
    quantize: str | None = None,
    err: TextIO | None = None,
) -> None:
    """``ollama create``: hash and upload local files, then stream ``/api/create``."""
    text, base_dir = read_modelfile(file)
    try:
        modelfile = parse_modelfile(text)
    except ModelfileError as exc:
        raise CLIError(str(exc)) from exc
    stream = err or sys.stderr
    for warning in modelfile.warnings:
        print(f"Warning: {warning}", file=stream)
    progress = Progress(stream)
    try:
        spinner = progress.spinner("gathering model components")
        try:
            plan = modelfile.to_create_request(base_dir)
        except (ModelfileError, OSError) as exc:
            raise CLIError(str(exc)) from exc
        spinner.stop()
        for upload in plan.uploads:
            upload_blob(client, upload, progress)
        renderer = StatusRenderer(progress)
        with client.stream("/api/create", plan.body(name, quantize=quantize)) as events:
            for event in events:
                renderer.feed(event)
    finally:
        progress.stop()


def upload_blob(client: Client, upload: BlobUpload, progress: Progress) -> None:
    """HEAD, then POST the file if the server lacks it, with ``copying file ... N%``."""
    path = f"/api/blobs/{upload.digest}"
    spinner = progress.spinner(f"copying file {upload.digest} 0%")
    try:
        client.request("HEAD", path)
    except ServerError as exc:
        if exc.status != 404:
            raise
        client.request(
            "POST",
            path,
            content=_file_chunks(upload, progress, spinner),
            headers={
                "Content-Length": str(upload.size),
                "Content-Type": "application/octet-stream",
            },
        )
    progress.set_message(spinner, f"copying file {upload.digest} 100%")
    spinner.stop()


def _file_chunks(upload: BlobUpload, progress: Progress, spinner: Spinner) -> Iterator[bytes]:
    sent = 0
    with open(upload.path, "rb") as f:
        while chunk := f.read(_UPLOAD_CHUNK):
            sent += len(chunk)
            pct = sent * 100 // upload.size if upload.size else 100
            progress.set_message(spinner, f"copying file {upload.digest} {pct}%")
            yield chunk


# --- version / serve -------------------------------------------------------------------


def version(client: Client, out: TextIO = sys.stdout) -> None:
    """Server and client versions, like ``ollama --version``."""
    server = ""
    try:
        answer = client.json("GET", "/api/version") or {}
        # The project's own version; "version" is the Ollama API version it implements.
        server = str(answer.get("ollamatrio") or answer.get("version") or "")
    except CLIError:
        out.write("Warning: could not connect to a running ollamatrio instance\n")
    if server:
        out.write(f"ollamatrio version is {server}\n")
    if server != __version__:
        out.write(f"Warning: client version is {__version__}\n")


def serve() -> None:
    """Run the server in this process until SIGINT/SIGTERM."""
    from ollamatrio.config import Settings
    from ollamatrio.serve import StartupError, run_server  # the server stack loads only here

    try:
        settings = Settings.from_env(os.environ)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    try:
        run_server(settings)
    except StartupError as exc:  # a busy port, an unusable OLLAMA_MODELS: one line
        raise CLIError(str(exc)) from exc
