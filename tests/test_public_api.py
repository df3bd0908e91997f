"""The embedding surface is pinned: changing it is a deliberate act."""

from __future__ import annotations

import subprocess
import sys

import ollamatrio

EXPECTED = {
    "__version__", "Settings", "open_scheduler", "Scheduler", "ModelRequest", "Lease",
    "RunnerInfo", "create_app", "serve", "run_server", "CompletionRequest", "Chunk", "Message",
    "ToolCall",
    "OllamatrioError", "InvalidRequestError", "ModelNotFoundError", "CapabilityError",
    "QueueFullError", "RunnerError", "RunnerStartError", "RunnerCrashedError",
    "OutOfMemoryError", "InsufficientMemoryError", "SchedulerClosedError",
}  # fmt: skip


def test_all_is_pinned() -> None:
    assert set(ollamatrio.__all__) == EXPECTED


def test_every_export_resolves() -> None:
    for name in ollamatrio.__all__:
        assert getattr(ollamatrio, name) is not None


def test_errors_share_one_root() -> None:
    for name in ollamatrio.__all__:
        if name.endswith("Error"):
            assert issubclass(getattr(ollamatrio, name), ollamatrio.OllamatrioError)


def test_importing_the_package_stays_light() -> None:
    # The runner subprocess imports the package: it must not drag in the server stack.
    code = (
        "import sys, ollamatrio; "
        "print(sorted(m for m in ('quart', 'hypercorn', 'httpx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
