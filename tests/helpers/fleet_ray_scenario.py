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
import shutil
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
RAY_TEMP = "/nonexistent"  # the head node's --temp-dir, once main() made it
NODE = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=80000000",
        "--disable-usage-stats", "--block"]  # fmt: skip


def environment(models: str, home: str) -> dict[str, str]:
    return {
        **os.environ,
        # Not the user's own: a ~/.ray/auth_token left by an earlier ray.init() makes a
        # worker node fail to join this cluster ("InvalidAuthToken").
        "HOME": home,
        "PYTHONPATH": str(ROOT),
        "RAY_memory_monitor_refresh_ms": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # As docs/fleet.md says to: Ray starts its workers (the hosts' servers with them) at
        # niceness 15 otherwise, and then anything busy on the machine starves them.
        "RAY_worker_niceness": "0",
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


# The second fleet: one slot and a queue of one per host, paced tokens (50 a second), and
# Serve's autoscaling delays cut to fit a test (seconds, not minutes).
AUTOSCALED = """
[fleet]
min_replicas = 1
max_replicas = 2
target_requests = 1.0
upscale_delay_s = 0.5
downscale_delay_s = 2.0
metrics_interval_s = 0.5
look_back_period_s = 1.0

[env]
OLLAMA_NUM_PARALLEL = "1"
OLLAMA_MAX_QUEUE = "1"
OLLAMATRIO_SIMULATED_ENGINE = '{{"default": {{"load_seconds": 0.05, "tokens_per_second": 50}}}}'
TMPDIR = "{tmp}"
"""
LONG = {"prompt": "go", "options": {"num_predict": 100_000}}
# How long the cluster gets for each change (seconds): generous, since a loaded two-core
# machine starts a replica's worker, its server and the health check that registers it
# several times slower than an idle one; a healthy run takes a fraction of these.
SCALE_UP_WAIT = 120
SCALE_DOWN_WAIT = 90
REPLACE_WAIT = 90


class Stream(threading.Thread):
    """A long ``/api/generate`` stream through the gateway, read in a thread of its own
    until the host ends it or :meth:`leave` makes its client leave."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(daemon=True)
        self.url, self.model = url, model
        self.first_token = threading.Event()
        self.first_token_at = 0.0
        self.left_at = 0.0
        self.status: int | None = None
        self.lines: list[dict[str, Any]] = []
        self.failure: str | None = None
        self._leave = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}/api/generate", timeout=60,
                              json={"model": self.model, **LONG}) as response:  # fmt: skip
                self.status = response.status_code
                for line in response.iter_lines():
                    if not line:
                        continue
                    data = json.loads(line)
                    self.lines.append(data)
                    if data.get("response") and not self.first_token.is_set():
                        self.first_token_at = time.monotonic()
                        self.first_token.set()
                    if self._leave.is_set():
                        break
            self.left_at = time.monotonic()
        except Exception as exc:
            self.failure = repr(exc)
        finally:
            self.first_token.set()  # nobody waits forever on a stream that failed

    def leave(self) -> None:
        """The client goes away at the next line."""
        self._leave.set()

    def summary(self) -> dict[str, Any]:
        return {"status": self.status, "lines": len(self.lines), "failure": self.failure,
                "last": self.lines[-1] if self.lines else None}  # fmt: skip


def ollama_stream(url: str) -> dict[str, Any]:
    import ollama

    chat = ollama.Client(host=url).chat(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
        options={"num_predict": 5},
    )  # fmt: skip
    parts = list(chat)
    return {"chunks": len(parts), "done": bool(parts[-1].done),
            "text": "".join(p.message.content or "" for p in parts)}  # fmt: skip


def openai_stream(url: str) -> dict[str, Any]:
    import openai

    with openai.OpenAI(base_url=f"{url}/v1", api_key="ollama", max_retries=0) as sdk:
        chunks = list(sdk.chat.completions.create(
            model="other", messages=[{"role": "user", "content": "hi"}], stream=True,
            max_tokens=5,
        ))  # fmt: skip
    choices = [c.choices[0] for c in chunks if c.choices]
    return {"chunks": len(chunks), "finish_reason": choices[-1].finish_reason,
            "text": "".join(c.delta.content or "" for c in choices)}  # fmt: skip


def watch_hosts(client: httpx.Client, seconds: float) -> Any:
    """The gateway's hosts that are up (replica id → address), every 0.2 s, for at most
    ``seconds``: the cluster is outside this process, nothing to wait on but time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hosts = {}
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("ollamatrio_fleet_host{") and line.endswith(" 1.0"):
                labels = dict(
                    part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")]
                    .replace('"', "").split(",")
                )  # fmt: skip
                hosts[labels["replica"]] = labels["host"]
        yield hosts
        time.sleep(0.2)


def wait_rows(client: httpx.Client, model: str, hosts: int, requests: int) -> list[Any]:
    """``/api/ps`` rows once ``model`` is on ``hosts`` hosts with ``requests`` running and
    queued on each (or the last seen, after 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        rows = [r for r in client.get("/api/ps").json()["models"] if r["name"] == model]
        full = all(r["active"] + r["queued"] == requests for r in rows)
        if (len(rows) == hosts and full) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def server_pid(url: str) -> int | None:
    port = int(url.rsplit(":", 1)[1])
    return next((p.pid for p in serve_processes() if listening_port(p) == port), None)


def wait_gone(pid: int, seconds: float) -> bool:
    """Whether ``pid`` still runs after ``seconds`` (zombies count as gone)."""
    try:
        proc = psutil.Process(pid)
        proc.wait(seconds)
    except psutil.NoSuchProcess:
        return False
    except psutil.TimeoutExpired:
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


def replica_processes() -> list[int]:
    return [
        p.pid for p in psutil.process_iter(["cmdline"])
        if any("ServeReplica" in part for part in p.info["cmdline"] or [])
    ]  # fmt: skip


def scenarios(env: dict[str, str], results: dict[str, Any], save: Any, work: Path) -> None:
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

    # The official clients, streaming through the gateway.
    results["ollama_client"] = ollama_stream(url)
    results["openai_sdk"] = openai_stream(url)
    save()

    # SIGKILL of the server holding tiny, a stream on it: the stream ends with an error
    # line, and the next request for tiny is still answered.
    holder = next(r for r in results["alternating_ps"] if r["name"] == "tiny:latest")
    port = next(
        int(h["url"].rsplit(":", 1)[1]) for h in results["status"]["hosts"]
        if h["replica"] == holder["replica"]
    )  # fmt: skip
    victim = next(p for p in serve_processes() if listening_port(p) == port)
    cut = Stream(url, "tiny")
    cut.first_token.wait(30)
    victim.kill()
    cut.join()
    results["killed_stream"] = cut.summary()
    start = time.monotonic()
    body = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 3}}
    answer = httpx.post(f"{url}/api/generate", json=body, timeout=15)
    results["after_kill"] = {"status": answer.status_code, "seconds": time.monotonic() - start}
    save()
    # Serve notices the dead server (health check) and replaces the replica.
    replaced = None
    for hosts in watch_hosts(client, REPLACE_WAIT):
        if len(hosts) == 2 and holder["replica"] not in hosts:
            replaced = time.monotonic() - start
            break
    results["replaced_seconds"] = replaced
    save()

    rc, out, seconds = fleet(env, "down")
    results["down"] = {"rc": rc, "output": out, "seconds": seconds}
    results["serve_left"] = [p.pid for p in serve_processes()]
    results["replicas_left"] = replica_processes()
    save()
    if rc == 0:
        autoscaling(env, results, save, work)


def autoscaling(env: dict[str, str], results: dict[str, Any], save: Any, work: Path) -> None:
    """A second fleet, autoscaled between 1 and 2 hosts of one slot and a queue of one:
    two streams fill the only host, a second host comes, two more streams spill to it, a
    client that leaves frees its slot for the stream queued behind it, and once every
    stream has ended the fleet shrinks to one host again, the other's server gone."""
    runner_tmp = work / "runner-tmp"
    runner_tmp.mkdir()
    config = work / "fleet.toml"
    config.write_text(AUTOSCALED.format(tmp=runner_tmp))
    rc, out, seconds = fleet(env, "up", "--config", str(config))
    results["scaled_up"] = {"rc": rc, "output": out, "seconds": seconds}
    save()
    if rc != 0:
        return
    url = f"http://{GATEWAY}"
    client = httpx.Client(base_url=url, timeout=30)
    streams: list[Stream] = []
    try:
        spill(client, url, streams, results, save)
    finally:  # whatever happened above: every client leaves, the fleet goes down
        for stream in streams:
            stream.leave()
        for stream in streams:
            stream.join()
        results["streams"] = [stream.summary() for stream in streams]
        save()
        two = results.get("hosts_scaled_up")
        if two is not None and results.get("slot_freed_seconds") is not None:
            scale_down(client, two, results, save)
        rc, out, seconds = fleet(env, "down")
        results["down_autoscaled"] = {"rc": rc, "output": out, "seconds": seconds}
        results["serve_left_autoscaled"] = [p.pid for p in serve_processes()]
        results["runners_left"] = [
            p.pid for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [])[1:3] == ["-m", "ollamatrio.runner"]
        ]  # fmt: skip
        results["runner_folders_left"] = sorted(p.name for p in runner_tmp.iterdir())
        results["replicas_left_autoscaled"] = replica_processes()
        save()


def spill(
    client: httpx.Client, url: str, streams: list[Stream], results: dict[str, Any], save: Any
) -> None:
    """Two streams fill the only host; once a second host is up two more spill to it; the
    first client leaves and the stream queued behind it gets the slot."""
    streams.append(Stream(url, "tiny"))
    if not streams[0].first_token.wait(60) or streams[0].failure or streams[0].status != 200:
        results["first_stream"] = streams[0].summary()
        return
    streams.append(Stream(url, "tiny"))  # queued behind the first: the host is full
    start = time.monotonic()
    seen: list[Any] = []
    for hosts in watch_hosts(client, SCALE_UP_WAIT):
        seen.append(hosts)
        if len(hosts) == 2:
            results["hosts_scaled_up"] = hosts
            break
    results["scale_up_seconds"] = time.monotonic() - start if len(seen[-1]) == 2 else None
    if results["scale_up_seconds"] is None:  # what the gateway and Serve saw, for the report
        results["scale_up_missed"] = {"ps": client.get("/api/ps").json(), "hosts": seen[-1],
                                      "streams": [s.summary() for s in streams],
                                      "serve_controller_log": serve_log_tail()}  # fmt: skip
    save()
    if results["scale_up_seconds"] is None:
        return
    two = results["hosts_scaled_up"]
    # The first host answers 503 (its queue is full): both streams go to the second.
    streams.append(Stream(url, "tiny"))
    streams[2].first_token.wait(60)
    streams.append(Stream(url, "tiny"))
    rows = wait_rows(client, "tiny:latest", 2, 2)
    results["spilled_ps"] = rows
    results["spill_metrics"] = client.get("/metrics").text
    results["server_pids"] = {replica: server_pid(host) for replica, host in two.items()}
    save()

    # The first client leaves: the stream queued behind it gets the slot.
    streams[0].leave()
    streams[0].join()
    streams[1].first_token.wait(30)
    results["slot_freed_seconds"] = streams[1].first_token_at - streams[0].left_at
    save()


def scale_down(
    client: httpx.Client, two: dict[str, str], results: dict[str, Any], save: Any
) -> None:
    """Once every stream has ended the fleet shrinks to one host, the other's server gone."""
    start = time.monotonic()
    one = next((h for h in watch_hosts(client, SCALE_DOWN_WAIT) if len(h) == 1), None)
    results["scale_down_seconds"] = time.monotonic() - start if one else None
    save()
    if one is not None:
        removed = next(replica for replica in two if replica not in one)
        pid = results["server_pids"][removed]
        gone = pid is None or not wait_gone(pid, 30)
        results["removed_host"] = {"replica": removed, "pid": pid, "server_gone": gone}
        save()


def serve_log_tail(lines: int = 40) -> list[str]:
    """The last lines of Serve's controller log in this run's Ray session."""
    logs = sorted(Path(RAY_TEMP).glob("session_*/logs/serve/controller_*.log"))
    return logs[-1].read_text(errors="replace").splitlines()[-lines:] if logs else []


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
    home = tempfile.mkdtemp(prefix="ofh-")
    env = environment(models, home)
    global RAY_TEMP
    # Each node's own (short: Ray's socket paths) folder, not the machine's shared /tmp/ray.
    temp = RAY_TEMP = tempfile.mkdtemp(prefix="ofr-", dir="/tmp")
    worker_temp = tempfile.mkdtemp(prefix="ofw-", dir="/tmp")
    nodes: list[subprocess.Popen[str]] = []
    start = time.monotonic()
    head = None
    try:
        # The worker waits for the head's GCS: both start at once.
        failed: list[str] = []

        def start_worker() -> None:
            try:
                nodes.append(start_node(["--address=127.0.0.1:6379",
                                         f"--temp-dir={worker_temp}"], env))  # fmt: skip
            except Exception as exc:
                failed.append(str(exc)[-2000:])

        starting = threading.Thread(target=start_worker)
        starting.start()
        head = start_node(["--head", "--port=6379", "--include-dashboard=false",
                           f"--temp-dir={temp}"], env)  # fmt: skip
        starting.join()
        if not nodes:
            raise RuntimeError(f"the second Ray node did not start: {failed}")
        results["cluster_seconds"] = time.monotonic() - start
        save()
        scenarios(env, results, save, results_path.parent)
    except Exception as exc:
        results["error"] = repr(exc)
    finally:
        for node in (*nodes, head):
            if node is not None:
                stop_node(node)
        results["left_after_teardown"] = leftovers()
        results["total_seconds"] = time.monotonic() - start
        save()
        for folder in (temp, worker_temp, home):
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
