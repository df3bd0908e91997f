"""``python -m ollamatrio serve`` works from any working folder, even one holding a
directory named ``ollamatrio``.

With an editable install (setuptools appends a finder to ``sys.meta_path``), such a folder
wins the top-level import: ``ollamatrio`` becomes a namespace package without
``__file__``, while its submodules still load from the real tree.  The server, its engine
probe and its runner processes must not lean on the package's own ``__file__``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.testing.store_race import http_request

TinyGGUF = Callable[..., Path]
REPO_ROOT = Path(__file__).resolve().parent.parent

# What an editable install leaves: a finder after the path-based one, so a directory named
# ollamatrio in the working folder (sys.path[0] under -m) becomes the package itself.
BOOT = """
import importlib.abc, importlib.machinery, importlib.util, runpy, sys
from pathlib import Path

ROOT = Path(sys.argv[1])

class EditableFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "ollamatrio" and not name.startswith("ollamatrio."):
            return None
        base = ROOT.joinpath(*name.split("."))
        if (base / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(
                name, base / "__init__.py", submodule_search_locations=[str(base)]
            )
        if base.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(name, base.with_suffix(".py"))
        return None

sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, EditableFinder())
import ollamatrio
assert ollamatrio.__file__ is None, "the working folder's ollamatrio/ should win"
sys.argv = ["ollamatrio", "serve"]
runpy.run_module("ollamatrio", run_name="__main__", alter_sys=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_from_a_folder_holding_an_ollamatrio_directory(
    tmp_path: Path, tiny_gguf: TinyGGUF
) -> None:
    store = ModelStore(tmp_path / "models")
    for _ in import_gguf(store, "tiny", tiny_gguf()):
        pass
    folder = tmp_path / "work"
    (folder / "ollamatrio").mkdir(parents=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA", "PYTHON"))}
    env.update(OLLAMA_HOST=f"127.0.0.1:{port}", OLLAMA_MODELS=str(tmp_path / "models"))
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-c", BOOT, str(REPO_ROOT)],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        status = 0
        while time.monotonic() < deadline and server.poll() is None:  # bounded: 60 s
            try:
                status = http_request("127.0.0.1", port, "GET", "/api/version", timeout=2)[0]
                break
            except OSError:
                time.sleep(0.1)
        assert status == 200, log.read_text()
        body = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
        # A real runner process starts for this (the engine probe ran at start-up).
        status, rest = http_request("127.0.0.1", port, "POST", "/api/generate", body, timeout=60)
        assert status == 200, (rest[-500:], log.read_text()[-3000:])
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert "Traceback" not in log.read_text()
