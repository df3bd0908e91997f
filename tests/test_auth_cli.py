"""``ollamatrio keys create|list|revoke`` without a server, in the state folder the server
uses, and the client commands sending ``OLLAMA_API_KEY`` / ``OLLAMATRIO_API_KEY`` to a server
that requires keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ollamatrio.auth.keys import SECRET_PREFIX, KeyStore

if TYPE_CHECKING:
    from conftest import ServerFactory

CLI_TIMEOUT = 30


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA", "OLLAMATRIO"))}
    return {**env, **extra}


async def cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    with trio.fail_after(CLI_TIMEOUT):
        done: subprocess.CompletedProcess[bytes] = await trio.run_process(
            [sys.executable, "-m", "ollamatrio", *args],
            capture_stdout=True, capture_stderr=True, check=False, env=env,
        )  # fmt: skip
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_keys_are_created_listed_and_revoked_in_the_state_folder(tmp_path: Path) -> None:
    env = env_with(OLLAMATRIO_DATA=str(tmp_path / "state"), HOME=str(tmp_path))
    code, out, _ = await cli(
        env, "keys", "create", "ci-bot", "--scope", "inference", "--scope", "metrics",
        "--rpm", "60", "--concurrency", "2",
    )  # fmt: skip
    assert code == 0
    secret, notice = out.splitlines()
    assert secret.startswith(SECRET_PREFIX)
    assert "will not be shown again" in notice
    key = KeyStore.in_folder(tmp_path / "state").verify(secret)
    assert key is not None
    assert (key.name, key.scopes, key.limits.rpm, key.limits.concurrency) == (
        "ci-bot", {"inference", "metrics"}, 60, 2,
    )  # fmt: skip

    code, out, _ = await cli(env, "keys", "list")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == [
        "NAME", "PREFIX", "SCOPES", "RPM", "TPM", "CONCURRENCY", "CREATED", "LAST", "USED",
    ]  # fmt: skip
    assert row.split()[:6] == ["ci-bot", secret[:12], "inference,metrics", "60", "-", "2"]
    assert row.endswith("Never")
    assert secret not in out

    code, _, err = await cli(env, "keys", "create", "ci-bot", "--scope", "admin")
    assert (code, err.strip()) == (1, "Error: a key named 'ci-bot' exists already")
    assert (await cli(env, "keys", "create", "x", "--scope", "root"))[0] == 2  # argparse's

    code, out, _ = await cli(env, "keys", "revoke", "ci-bot")
    assert (code, out.strip()) == (0, "revoked 'ci-bot'")
    assert KeyStore.in_folder(tmp_path / "state").verify(secret) is None
    code, _, err = await cli(env, "keys", "revoke", "ci-bot")
    assert (code, err.strip()) == (1, "Error: no API key named 'ci-bot'")


async def test_keys_default_to_the_folder_beside_the_models(tmp_path: Path) -> None:
    env = env_with(OLLAMA_MODELS=str(tmp_path / "models"), HOME=str(tmp_path))
    code, out, _ = await cli(env, "keys", "create", "ops", "--scope", "admin")
    assert code == 0
    assert KeyStore.in_folder(tmp_path / "ollamatrio").verify(out.splitlines()[0]) is not None


async def test_client_commands_send_the_key_from_the_environment(
    api_server: ServerFactory, tmp_path: Path
) -> None:
    store = KeyStore.in_folder(tmp_path / "state")
    _, secret = await trio.to_thread.run_sync(store.create, "me", ["inference"])
    async with api_server(auth="required", data_dir=tmp_path / "state") as srv:
        host = srv.url.removeprefix("http://")
        code, _, err = await cli(env_with(OLLAMA_HOST=host), "list")
        assert (code, err.strip()) == (1, "Error: unauthorized")
        for variable in ("OLLAMA_API_KEY", "OLLAMATRIO_API_KEY"):
            code, out, _ = await cli(env_with(OLLAMA_HOST=host, **{variable: secret}), "list")
            assert code == 0
            assert "tiny" in out
        code, _, err = await cli(env_with(OLLAMA_HOST=host, OLLAMA_API_KEY=secret), "rm", "tiny")
        assert code == 1
        assert err.strip() == "Error: forbidden: this API key lacks the 'admin' scope"
