"""A fleet host's server (fleet/host_process.py), the autoscaling policy and ``fleet up``'s
options (fleet/ray_app.py, fleet/ray_cli.py), without a Ray cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from ollamatrio.fleet.host_process import HostProcess

# Ray's own models still use pydantic v1-style Field arguments (ray 2.60).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Using extra keyword arguments on `Field`:DeprecationWarning"
)

SIMULATED = {
    "OLLAMATRIO_ENGINE": "simulated",
    "OLLAMATRIO_SIMULATED_GPUS": json.dumps(
        {"gpus": [], "system": {"total": 64 << 30, "cpu_count": 2}}
    ),
}


def test_the_host_process_answers_health_and_load_then_stops(tmp_path: Path) -> None:
    server = HostProcess("127.0.0.1", {**SIMULATED, "OLLAMA_MODELS": str(tmp_path)})
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.healthy() is None
        assert server.requests() == 0.0
    finally:
        server.stop()
    assert server.proc.returncode == 0  # SIGTERM: the server's own orderly shutdown
    assert "exited (0)" in (server.healthy() or "")


def test_a_host_with_a_fleet_secret_refuses_requests_without_it(tmp_path: Path) -> None:
    env = {**SIMULATED, "OLLAMA_MODELS": str(tmp_path), "OLLAMATRIO_FLEET_SECRET": "s3cret"}
    server = HostProcess("127.0.0.1", env)
    try:
        assert server.healthy() is None  # its owner's questions carry the secret
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.url}/api/version", timeout=5)
        refused.value.close()  # the error holds the answer's socket open
        assert refused.value.code == 401
    finally:
        server.stop()


def test_a_dead_server_is_unhealthy(tmp_path: Path) -> None:
    server = HostProcess("127.0.0.1", {**SIMULATED, "OLLAMA_MODELS": str(tmp_path)})
    server.proc.kill()
    server.proc.wait()
    assert "exited (-9)" in (server.healthy() or "")
    server.stop()  # nothing left to stop: no error


def test_the_server_never_outlives_its_owner(tmp_path: Path) -> None:
    """The owner (a replica's process) killed outright: the server dies with it."""
    env = {**SIMULATED, "OLLAMA_MODELS": str(tmp_path)}
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from ollamatrio.fleet.host_process import HostProcess
            server = HostProcess("127.0.0.1", {env!r})
            print(server.pid, flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    assert owner.stdout is not None
    server = psutil.Process(int(owner.stdout.readline()))
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    server.wait(timeout=10)  # raises TimeoutExpired if it outlived its owner
    assert owner.stdin is not None
    owner.stdin.close()
    owner.stdout.close()


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    from ollamatrio.fleet.host_process import HostStartError

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(HostStartError, match="exited"):
        HostProcess("127.0.0.1", {**SIMULATED, "OLLAMA_MODELS": str(blocker / "models")})


# -- with Ray installed: the autoscaling policy and fleet up's options ------------------


def _context(per_replica: dict[str, float], target: float = 4.0) -> Any:
    from ray.serve.config import AutoscalingConfig

    from ollamatrio.fleet.ray_app import REQUESTS_METRIC

    return SimpleNamespace(
        aggregated_metrics={REQUESTS_METRIC: per_replica},
        config=AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=target),
    )


@pytest.mark.parametrize(
    ("per_replica", "wanted"),
    [({}, 1), ({"a": 0.0}, 1), ({"a": 4.0}, 1), ({"a": 4.0, "b": 1.0}, 2), ({"a": 9.0}, 3)],
)
def test_the_autoscaling_policy_wants_a_host_per_target_requests(
    per_replica: dict[str, float], wanted: int
) -> None:
    pytest.importorskip("ray", reason="the fleet extra is not installed")
    from ollamatrio.fleet.ray_app import requests_policy

    assert requests_policy(_context(per_replica))[0] == wanted


def _args(**given: Any) -> Any:
    defaults = {"replicas": None, "min_replicas": None, "max_replicas": None, "config": None}
    return SimpleNamespace(**{**defaults, **given})


def test_fleet_up_options_from_flags_config_and_environment(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the fleet extra is not installed")
    from ollamatrio.fleet.ray_cli import FleetError, options_from

    config = tmp_path / "fleet.toml"
    config.write_text('[fleet]\nmin_replicas = 1\nmax_replicas = 3\nnum_gpus = 1\n'
                      'upscale_delay_s = 0.5\ndownscale_delay_s = 2\n'
                      '[env]\nOLLAMA_KEEP_ALIVE = "1h"\n')  # fmt: skip
    environ = {"OLLAMA_HOST": "0.0.0.0:8080", "OLLAMA_MODELS": "/shared", "HOME": "/root"}
    options = options_from(_args(config=config), environ)
    assert (options.min_replicas, options.max_replicas, options.num_gpus) == (1, 3, 1)
    assert (options.upscale_delay_s, options.downscale_delay_s) == (0.5, 2)
    assert options.autoscaling
    assert options.gateway_bind == "0.0.0.0:8080"
    assert options.env == {"OLLAMA_MODELS": "/shared", "OLLAMA_KEEP_ALIVE": "1h"}
    fixed = options_from(_args(config=config, replicas=2), environ)  # the flag wins
    assert (fixed.replicas, fixed.autoscaling) == (2, False)
    with pytest.raises(FleetError, match="go together"):
        options_from(_args(min_replicas=2), environ)
    with pytest.raises(FleetError, match="1 <= --min-replicas"):
        options_from(_args(min_replicas=3, max_replicas=2), environ)
    assert len(options.fleet_secret) >= 43  # generated: 32 random bytes
    assert options.fleet_secret not in repr(options)
    assert options_from(_args(), environ).fleet_secret != options.fleet_secret
    given = {**environ, "OLLAMATRIO_FLEET_SECRET": "chosen"}
    assert options_from(_args(), given).fleet_secret == "chosen"
    assert "OLLAMATRIO_FLEET_SECRET" not in options_from(_args(), given).env  # runtime env
    config.write_text('[env]\nOLLAMATRIO_FLEET_SECRET = "from-file"\n')
    from_file = options_from(_args(config=config), environ)
    assert (from_file.fleet_secret, from_file.env) == ("from-file", {"OLLAMA_MODELS": "/shared"})
    config.write_text("[fleet]\nreplica = 2\n")
    with pytest.raises(FleetError, match="unknown \\[fleet\\] keys: replica"):
        options_from(_args(config=config), environ)


def test_the_fleet_secret_goes_in_rays_runtime_environment_alone() -> None:
    pytest.importorskip("ray", reason="the fleet extra is not installed")
    from ollamatrio.fleet.ray_app import FleetOptions, build

    app = build(FleetOptions(fleet_secret="zzz", env={"OLLAMA_KEEP_ALIVE": "1h"}))
    hosts = app._bound_deployment  # Ray's bound application: what serve.run deploys
    gateway = hosts.init_args[0]._bound_deployment
    for deployment in (hosts, gateway):
        runtime_env = deployment.ray_actor_options["runtime_env"]
        assert runtime_env == {"env_vars": {"OLLAMATRIO_FLEET_SECRET": "zzz"}}
    assert "zzz" not in repr((hosts.init_args[1:], gateway.init_args))
    assert build(FleetOptions())._bound_deployment.ray_actor_options["runtime_env"] == {}


def test_fleet_commands_warn_without_rays_token_authentication() -> None:
    pytest.importorskip("ray", reason="the fleet extra is not installed")
    from ollamatrio.fleet.ray_cli import ray_auth_warning

    assert ray_auth_warning({"RAY_AUTH_MODE": "token"}) is None
    warning = ray_auth_warning({})
    assert warning is not None
    assert "RAY_AUTH_MODE=token" in warning


def test_the_host_process_reports_the_niceness_it_inherited(tmp_path: Path) -> None:
    """A Ray worker starts at niceness 15 and its server inherits it: the host says so."""
    env = {**SIMULATED, "OLLAMA_MODELS": str(tmp_path)}
    script = textwrap.dedent(f"""
        from ollamatrio.fleet.host_process import HostProcess
        server = HostProcess("127.0.0.1", {env!r})
        print(server.niceness, flush=True)
        server.stop()
    """)  # fmt: skip
    done = subprocess.run(
        ["nice", "-n", "7", sys.executable, "-c", script], capture_output=True, text=True,
        timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == min(os.nice(0) + 7, 19)  # 19: the most a process can be niced


def test_fleet_up_and_status_warn_when_hosts_run_niced() -> None:
    pytest.importorskip("ray", reason="the fleet extra is not installed")
    from ollamatrio.fleet.ray_cli import niceness_warning

    def hosts(*levels: int | None) -> dict[str, Any]:
        return {"hosts": [{"url": f"http://h{i}", "niceness": n} for i, n in enumerate(levels)]}

    assert niceness_warning(hosts(0, 0)) is None
    assert niceness_warning(hosts(None)) is None  # a host that did not say: no guess
    warning = niceness_warning(hosts(15, 0, 15))
    assert warning is not None
    assert "2 of 3 hosts run at niceness 15" in warning
    assert "RAY_worker_niceness=0" in warning
