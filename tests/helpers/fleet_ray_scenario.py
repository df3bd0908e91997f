"""A two-node Ray cluster with a fleet on it, driven end to end; run by tests/test_fleet_ray.py
as the first process of a private user, network and PID namespace::

    unshare -rn --pid --fork --mount-proc python fleet_ray_scenario.py MODELS RESULTS

Only ``lo`` exists there, so Ray keeps 127.0.0.1 (it rewrites it to the machine's address
otherwise), and every process started here dies with this one (the kernel ends a PID
namespace with its first process): nothing can outlive the test, and no ``ray stop`` (which
kills every Ray process on the machine) is ever needed.  The Ray nodes are stopped by PID.

Writes what it saw to RESULTS (JSON) for the test to check, step by step, so that a step
that fails still leaves the others' results.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GATEWAY = "127.0.0.1:11434"
NODE = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=80000000",
        "--disable-usage-stats", "--block"]  # fmt: skip


def environment(models: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_memory_monitor_refresh_ms": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "OLLAMA_HOST": GATEWAY,
        "OLLAMA_MODELS": models,
        "OLLAMATRIO_ENGINE": "simulated",
        "OLLAMATRIO_SIMULATED_GPUS": json.dumps(
            {"gpus": [], "system": {"total": 64 << 30, "cpu_count": 2}}
        ),
        "OLLAMATRIO_SIMULATED_ENGINE": json.dumps(
            {
                "default": {"load_seconds": 0.05, "tokens_per_second": 200},
                "models": {"third": {"load_seconds": 1.0, "tokens_per_second": 200}},
            }
        ),
    }


def start_node(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``ray start ... --block``, returned once it says the node runs."""
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", *args, *NODE], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "Ray runtime started" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
            return proc
    raise RuntimeError("ray start failed:\n" + "".join(seen[-30:]))


def stop_node(proc: subprocess.Popen[str]) -> None:
    """By PID: ``ray start --block`` stops its node's processes on SIGTERM."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def fleet(env: dict[str, str], *args: str) -> tuple[int, str, float]:
    """A fleet command: its exit status, its standard output, how long it took (its
    standard error, Ray's log lines, goes to ours)."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ollamatrio", "fleet", *args, "--address", "127.0.0.1:6379"],
        env=env, stdout=subprocess.PIPE, text=True, timeout=150,
    )  # fmt: skip
    return done.returncode, done.stdout, time.monotonic() - start


def serve_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline[1:4] == ["-m", "ollamatrio", "serve"]:
            found.append(proc)
    return found


def listening_port(proc: psutil.Process) -> int | None:
    for conn in proc.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN:
            return int(conn.laddr.port)
    return None


def scenarios(env: dict[str, str], results: dict[str, Any], save: Any) -> None:
    rc, out, seconds = fleet(env, "up", "--replicas", "2")
    results["up"] = {"rc": rc, "output": out, "seconds": seconds}
    save()
    if rc != 0:
        return
    url = f"http://{GATEWAY}"
    client = httpx.Client(base_url=url, timeout=30)

    # Two models, alternating: each loads on one host.
    for _ in range(3):
        for model in ("tiny", "other"):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                    "stream": False, "options": {"num_predict": 3}}  # fmt: skip
            assert client.post("/api/chat", json=body).status_code == 200
    results["alternating_ps"] = client.get("/api/ps").json()["models"]
    save()

    # Eight concurrent first requests for a cold model (a 1 s load): one host loads it.
    statuses: list[int] = []

    def ask() -> None:
        body = {"model": "third", "prompt": "hi", "stream": False, "options": {"num_predict": 3}}
        statuses.append(httpx.post(f"{url}/api/generate", json=body, timeout=60).status_code)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results["concurrent"] = {"statuses": statuses, "ps": client.get("/api/ps").json()["models"]}
    results["metrics"] = client.get("/metrics").text
    rc, out, _ = fleet(env, "status")
    results["status_text"] = {"rc": rc, "output": out}
    rc, out, _ = fleet(env, "status", "--json")
    results["status"] = json.loads(out) if rc == 0 else {"rc": rc, "output": out}
    save()

    # SIGKILL of the server holding tiny: the next request for tiny is still answered.
    holder = next(r for r in results["alternating_ps"] if r["name"] == "tiny:latest")
    port = next(
        int(h["url"].rsplit(":", 1)[1]) for h in results["status"]["hosts"]
        if h["replica"] == holder["replica"]
    )  # fmt: skip
    victim = next(p for p in serve_processes() if listening_port(p) == port)
    victim.kill()
    start = time.monotonic()
    body = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 3}}
    answer = httpx.post(f"{url}/api/generate", json=body, timeout=15)
    results["after_kill"] = {"status": answer.status_code, "seconds": time.monotonic() - start}
    save()
    # Serve notices the dead server (health check) and replaces the replica.
    deadline = time.monotonic() + 40
    replaced = None
    while time.monotonic() < deadline:
        rc, out, _ = fleet(env, "status", "--json")
        if rc == 0:
            hosts = json.loads(out)["hosts"]
            fresh = [h for h in hosts if h["up"] and h["replica"] != holder["replica"]]
            if len(fresh) == 2:
                replaced = time.monotonic() - start
                break
        time.sleep(1)  # an external cluster: nothing to wait on but time
    results["replaced_seconds"] = replaced
    save()

    rc, out, seconds = fleet(env, "down")
    results["down"] = {"rc": rc, "output": out, "seconds": seconds}
    results["serve_left"] = [p.pid for p in serve_processes()]
    results["replicas_left"] = [
        p.pid for p in psutil.process_iter(["cmdline"])
        if any("ServeReplica" in part for part in p.info["cmdline"] or [])
    ]  # fmt: skip
    save()


def leftovers() -> list[str]:
    """The processes still here (zombies aside), after giving them 15 s to exit."""
    me = os.getpid()
    others = [p for p in psutil.process_iter() if p.pid != me]
    _, alive = psutil.wait_procs(others, timeout=15)
    left = []
    for proc in alive:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(proc.cmdline())[:200])
        except psutil.NoSuchProcess:
            pass
    return left


def main() -> None:
    models, results_path = sys.argv[1], Path(sys.argv[2])
    results: dict[str, Any] = {}

    def save() -> None:
        results_path.write_text(json.dumps(results))

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = environment(models)
    temp = tempfile.mkdtemp(prefix="ofr-", dir="/tmp")  # Ray's socket paths must be short
    nodes: list[subprocess.Popen[str]] = []
    start = time.monotonic()
    head = None
    try:
        # The worker waits for the head's GCS: both start at once.
        starting = threading.Thread(
            target=lambda: nodes.append(start_node(["--address=127.0.0.1:6379"], env))
        )
        starting.start()
        head = start_node(["--head", "--port=6379", "--include-dashboard=false",
                           f"--temp-dir={temp}"], env)  # fmt: skip
        starting.join()
        if not nodes:
            raise RuntimeError("the second Ray node did not start")
        results["cluster_seconds"] = time.monotonic() - start
        save()
        scenarios(env, results, save)
    except Exception as exc:
        results["error"] = repr(exc)
    finally:
        for node in (*nodes, head):
            if node is not None:
                stop_node(node)
        results["left_after_teardown"] = leftovers()
        results["total_seconds"] = time.monotonic() - start
        save()


if __name__ == "__main__":
    main()
