"""The real coding agents against a live server with SmolLM2 in a real runner, as a new user
runs them (docs/api.md records the commands and outcomes).  Each is skipped unless its CLI
is installed: ``npm install -g @anthropic-ai/claude-code`` (or ``OLLAMATRIO_CLAUDE`` naming
its ``claude`` binary), ``npm install -g @openai/codex`` (or ``OLLAMATRIO_CODEX`` naming its
``codex`` binary).  Slow: each agent sends a prompt of thousands of tokens with its tools."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
import trio

from ollamatrio.auth.keys import KeyStore
from ollamatrio.engines.process import ProcessEngineFactory

pytestmark = [pytest.mark.agents, pytest.mark.slow]

# SmolLM2's ChatML as an Ollama Go template that mentions tools, so the model is offered
# (and accepts) the tools Claude Code always sends.
TOOLS_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
    "{{ if .Tools }}{{ end }}<|im_start|>assistant\n"
)


def agent(variable: str, command: str, product: str) -> tuple[str, pytest.MarkDecorator]:
    """The agent's CLI (``$variable``, or ``command`` on PATH) and the mark that skips its
    test, with the reason, when it or node is missing (both CLIs are node packages)."""
    found = os.environ.get(variable) or shutil.which(command) or ""
    missing = not found or not shutil.which("node")
    reason = f"{product} ({command}) or node is not installed; or set {variable}"
    return found, pytest.mark.skipif(missing, reason=reason)


CLAUDE, needs_claude = agent("OLLAMATRIO_CLAUDE", "claude", "Claude Code")
CODEX, needs_codex = agent("OLLAMATRIO_CODEX", "codex", "Codex CLI")


async def create_tools_model(url: str, name: str, headers: dict[str, str] | None = None) -> None:
    """SmolLM2 with a template that offers tools, and a context that holds an agent's
    prompt."""
    async with httpx.AsyncClient(base_url=url, headers=headers) as c:
        created = await c.post("/api/create", json={
            "model": name, "from": "smol", "template": TOOLS_TEMPLATE,
            "stream": False, "parameters": {"num_ctx": 8192},
        })  # fmt: skip
        assert created.status_code == 200, created.text


@needs_claude
async def test_claude_code_one_shot_prompt(api_server, smollm2_path: Path, tmp_path: Path) -> None:
    with trio.fail_after(600):
        async with api_server(
            engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
        ) as srv:
            await create_tools_model(srv.url, "smol-tools")
            env = {
                **os.environ, "HOME": str(tmp_path), "ANTHROPIC_BASE_URL": srv.url,
                "ANTHROPIC_AUTH_TOKEN": "ollama", "DISABLE_TELEMETRY": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32",
            }  # fmt: skip
            result = await trio.run_process(
                [CLAUDE, "-p", "Say hello.", "--model", "smol-tools"],
                env=env, cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert result.stdout.decode().strip()


@needs_codex
async def test_codex_one_shot_prompt(api_server, smollm2_path: Path, tmp_path: Path) -> None:
    with trio.fail_after(600):
        async with api_server(
            engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
        ) as srv:
            # The full name:tag: Codex pulls a model whose -m is not an /api/tags name.
            await create_tools_model(srv.url, "smol-tools:latest")
            env = {**os.environ, "HOME": str(tmp_path), "CODEX_OSS_BASE_URL": f"{srv.url}/v1"}
            result = await trio.run_process(
                [CODEX, "exec", "--oss", "--local-provider", "ollama", "-m", "smol-tools:latest",
                 "--skip-git-repo-check", "Say hello."],
                env=env, cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert result.stdout.decode().strip()  # the model's answer (Codex logs to stderr)


# Codex's own provider for a server that asks for keys (docs/api.md, "Keys"): --oss sends none.
CODEX_CONFIG = """\
model = "smol-tools:latest"
model_provider = "ollamatrio"

[model_providers.ollamatrio]
name = "ollamatrio"
base_url = "{url}/v1"
env_key = "OLLAMATRIO_API_KEY"
wire_api = "responses"
"""


@needs_codex
async def test_codex_with_a_key_through_its_own_provider(
    api_server, smollm2_path: Path, tmp_path: Path
) -> None:
    store = KeyStore.in_folder(tmp_path / "state")
    _, admin = store.create("setup", ["admin"])
    _, secret = store.create("codex", ["inference"])
    with trio.fail_after(600):
        async with api_server(
            engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path},
            auth="required", data_dir=tmp_path / "state",
        ) as srv:  # fmt: skip
            bearer = {"Authorization": f"Bearer {admin}"}
            await create_tools_model(srv.url, "smol-tools:latest", bearer)
            (tmp_path / ".codex").mkdir()
            (tmp_path / ".codex" / "config.toml").write_text(CODEX_CONFIG.format(url=srv.url))
            env = {**os.environ, "HOME": str(tmp_path), "OLLAMATRIO_API_KEY": secret}
            env.pop("CODEX_HOME", None)
            command = [CODEX, "exec", "--skip-git-repo-check", "Say hello."]
            result = await trio.run_process(
                command, env=env, cwd=tmp_path, capture_stdout=True, capture_stderr=True,
                check=False,
            )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert result.stdout.decode().strip()
