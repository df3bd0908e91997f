"""The real coding agents against a live server with SmolLM2 in a real runner, as a new user
runs them (docs/api.md records the commands and outcomes).  Skipped unless the CLI is
installed: ``npm install -g @anthropic-ai/claude-code`` (or ``OLLAMATRIO_CLAUDE`` naming
its ``claude`` binary).  Slow: Claude Code sends a ~13k-token prompt with its tools."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
import trio

from ollamatrio.engines.process import ProcessEngineFactory

pytestmark = [pytest.mark.agents, pytest.mark.slow]

# SmolLM2's ChatML as an Ollama Go template that mentions tools, so the model is offered
# (and accepts) the tools Claude Code always sends.
TOOLS_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
    "{{ if .Tools }}{{ end }}<|im_start|>assistant\n"
)


def claude_binary() -> str:
    found = os.environ.get("OLLAMATRIO_CLAUDE") or shutil.which("claude")
    if not found or not shutil.which("node"):
        pytest.skip("Claude Code (claude) or node is not installed")
    return found


async def test_claude_code_one_shot_prompt(api_server, smollm2_path: Path, tmp_path: Path) -> None:
    claude = claude_binary()
    with trio.fail_after(600):
        async with api_server(
            engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
        ) as srv:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                created = await c.post("/api/create", json={
                    "model": "smol-tools", "from": "smol", "template": TOOLS_TEMPLATE,
                    "stream": False, "parameters": {"num_ctx": 8192},
                })  # fmt: skip
                assert created.status_code == 200, created.text
            env = {
                **os.environ, "HOME": str(tmp_path), "ANTHROPIC_BASE_URL": srv.url,
                "ANTHROPIC_AUTH_TOKEN": "ollama", "DISABLE_TELEMETRY": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32",
            }  # fmt: skip
            result = await trio.run_process(
                [claude, "-p", "Say hello.", "--model", "smol-tools"],
                env=env, cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert result.stdout.decode().strip()
