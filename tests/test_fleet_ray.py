"""The fleet on a real two-node Ray cluster (fleet/ray_app.py, fleet/ray_cli.py): ``fleet
up``, routing through the gateway, the official clients, a host's server killed mid-stream,
``fleet status``, ``fleet down``; then an autoscaled fleet (1 to 2 hosts of one slot and a
queue of one): spill to a second host, a client leaving, scaling up and down.

The cluster runs inside a private user, network and PID namespace (``unshare -rn --pid``)
that tests/helpers/fleet_ray_scenario.py creates and drives: only ``lo`` there (Ray keeps
127.0.0.1), each node with one CPU and an 80 MB object store, stopped by PID, and every
process of the namespace ends with it.  One run (about 2 minutes here) serves every test below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import import_model

from ollamatrio.store import ModelStore

pytestmark = pytest.mark.slow  # a Ray cluster: about 2 minutes; CI runs slow tests too
ray = pytest.importorskip("ray", reason="the fleet extra is not installed: pip install '.[fleet]'")

SCENARIO = Path(__file__).parent / "helpers" / "fleet_ray_scenario.py"
UNSHARE = ["unshare", "-rn", "--pid", "--fork", "--mount-proc"]
TIMEOUT = 540  # seconds for the whole scenario at worst (each wait in it is bounded)


def _namespaces_work() -> str | None:
    try:
        subprocess.run([*UNSHARE, "true"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no private namespaces here (unshare -rn --pid): {exc}"
    return None


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Any) -> dict[str, Any]:
    reason = _namespaces_work()
    if reason is not None:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("fleet_ray")
    store = ModelStore(work / "models")
    for seed, name in enumerate(("tiny", "other", "third")):
        import_model(store, name, tiny_gguf(seed=seed))
    results = work / "results.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [*UNSHARE, sys.executable, str(SCENARIO), str(work / "models"), str(results)],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(results.read_text()) if results.exists() else {}
    found["stderr"] = done.stderr[-4000:]
    return found


def _check(run: dict[str, Any], *keys: str) -> None:
    missing = [k for k in keys if k not in run]
    assert not missing, f"scenario stopped before {missing}: {run.get('error')}\n{run['stderr']}"


def holders(rows: list[dict[str, Any]], name: str) -> list[str]:
    return [r["replica"] for r in rows if r["name"] == name]


def test_fleet_up_deploys_two_hosts_and_prints_ready(run: dict[str, Any]) -> None:
    _check(run, "up")
    assert run["up"]["rc"] == 0, run["up"]["output"]
    assert run["up"]["output"].strip() == "ready: http://127.0.0.1:11434 (2 replicas)"


def test_alternating_models_each_load_on_one_host_with_replica_and_node(
    run: dict[str, Any],
) -> None:
    _check(run, "alternating_ps", "status")
    rows = run["alternating_ps"]
    assert len(holders(rows, "tiny:latest")) == 1
    assert len(holders(rows, "other:latest")) == 1
    replicas = {h["replica"]: h["node"] for h in run["status"]["hosts"]}
    assert len(set(replicas.values())) == 2  # one host per node
    # Nodes started with RAY_worker_niceness=0: the servers run at the normal priority.
    assert [h["niceness"] for h in run["status"]["hosts"]] == [0, 0]
    for row in rows:  # /api/ps rows carry Ray's replica id and node
        assert replicas[row["replica"]] == row["node"]


def test_concurrent_first_requests_load_a_cold_model_on_one_host(run: dict[str, Any]) -> None:
    _check(run, "concurrent", "metrics")
    assert run["concurrent"]["statuses"] == [200] * 8
    assert len(holders(run["concurrent"]["ps"], "third:latest")) == 1
    metrics = run["metrics"]
    assert 'ollamatrio_fleet_routing_decisions_total{kind="cold"} 3.0' in metrics
    assert "ollamatrio_fleet_duplicate_loads_total 0.0" in metrics


def test_fleet_status_lists_replicas_nodes_models_and_queues(run: dict[str, Any]) -> None:
    _check(run, "status_text", "status")
    assert run["status_text"]["rc"] == 0
    text = run["status_text"]["output"]
    assert "REPLICA" in text
    assert "MODELS (queued/active)" in text
    for host in run["status"]["hosts"]:
        assert host["replica"] in text
        assert host["url"] in text
    assert "third:latest ready (0/0)" in text


def test_a_killed_hosts_server_is_routed_around_and_replaced(run: dict[str, Any]) -> None:
    _check(run, "after_kill", "replaced_seconds")
    assert run["after_kill"]["status"] == 200
    assert run["after_kill"]["seconds"] < 15
    assert run["replaced_seconds"] is not None  # Serve replaced the replica (within 90 s)


def test_the_official_clients_stream_through_the_ray_deployed_gateway(
    run: dict[str, Any],
) -> None:
    _check(run, "ollama_client", "openai_sdk")
    assert run["ollama_client"]["done"]
    assert run["ollama_client"]["chunks"] > 1
    assert run["ollama_client"]["text"].strip()
    assert run["openai_sdk"]["finish_reason"] == "length"
    assert run["openai_sdk"]["chunks"] > 1
    assert run["openai_sdk"]["text"].strip()


def test_a_stream_on_a_killed_hosts_server_ends_with_an_error_line(run: dict[str, Any]) -> None:
    _check(run, "killed_stream")
    cut = run["killed_stream"]
    assert cut["status"] == 200
    assert cut["failure"] is None, cut  # a proper end of the body, not a broken connection
    assert "failed" in cut["last"]["error"], cut


def test_autoscaling_adds_a_host_when_the_only_one_is_full_and_the_rest_spills_there(
    run: dict[str, Any],
) -> None:
    _check(run, "scaled_up")
    assert run["scaled_up"]["rc"] == 0
    assert run["scaled_up"]["output"].strip() == "ready: http://127.0.0.1:11434 (1 replicas)"
    assert "first_stream" not in run, run["first_stream"]  # the first stream got tokens
    _check(run, "scale_up_seconds")
    # Two hosts within 120 s of the full queue (what the gateway and host saw, if not).
    assert run["scale_up_seconds"] is not None, run.get("scale_up_missed")
    _check(run, "spilled_ps")
    rows = run["spilled_ps"]
    assert len({r["replica"] for r in rows}) == 2  # tiny on both hosts
    assert [(r["active"], r["queued"]) for r in rows] == [(1, 1), (1, 1)]
    assert 'ollamatrio_fleet_routing_decisions_total{kind="cold"} 2.0' in run["spill_metrics"]


def test_a_client_leaving_mid_stream_frees_the_hosts_slot_within_200_ms(
    run: dict[str, Any],
) -> None:
    _check(run, "slot_freed_seconds")
    assert 0 < run["slot_freed_seconds"] < 0.2


def test_autoscaling_scales_back_down_and_the_removed_hosts_server_is_gone(
    run: dict[str, Any],
) -> None:
    _check(run, "streams", "scale_down_seconds", "removed_host")
    assert [s["status"] for s in run["streams"]] == [200] * 4
    assert all(s["failure"] is None for s in run["streams"]), run["streams"]
    assert run["scale_down_seconds"] is not None  # one host within 90 s of the last stream
    assert run["removed_host"]["pid"] is not None
    assert run["removed_host"]["server_gone"]


def test_fleet_down_of_the_autoscaled_fleet_leaves_no_server_or_runner(
    run: dict[str, Any],
) -> None:
    _check(run, "down_autoscaled")
    assert run["down_autoscaled"]["rc"] == 0, run["down_autoscaled"]["output"]
    assert run["serve_left_autoscaled"] == []
    assert run["runners_left"] == []
    assert run["runner_folders_left"] == []
    assert run["replicas_left_autoscaled"] == []


def test_fleet_down_leaves_no_server_replica_or_ray_process(run: dict[str, Any]) -> None:
    _check(run, "down", "left_after_teardown")
    assert run["down"]["rc"] == 0, run["down"]["output"]
    assert run["serve_left"] == []
    assert run["replicas_left"] == []
    assert run["left_after_teardown"] == []
    # Outside the namespace too: no process of this run's cluster is left on the machine.
    ours = [
        p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
        if any(str(SCENARIO) in part for part in p.info["cmdline"] or [])
    ]  # fmt: skip
    assert ours == []
