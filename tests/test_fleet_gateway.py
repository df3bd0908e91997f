"""The fleet gateway (ollamatrio/fleet/gateway.py) in front of real ``ollamatrio`` servers on
port 0 with the simulated engine, one shared model store, driven by the official clients."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
import trio

from ollamatrio.auth.keys import KeyStore, Limits
from ollamatrio.config import Settings
from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.fleet.gateway import RunningGateway, error_line, model_of, serve_gateway
from ollamatrio.fleet.gateway_hosts import HostTable, model_key
from ollamatrio.fleet.gateway_sizes import SizePredictor
from ollamatrio.fleet.routing import rendezvous_score

# The openai SDK stops reading a stream at [DONE] without closing its inner async
# generators; under Trio their finalizer warns (as in tests/test_openai_api.py).
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    *(
        pytest.mark.filterwarnings(f"ignore:Async generator '{module}\\.:ResourceWarning")
        for module in ("openai", "httpx2", "httpcore2")
    ),
]

FAST = SimulatedBehaviour(load_seconds=0.05, tokens_per_second=2000)


async def all_up(table: HostTable, count: int) -> None:
    while len(table.up()) < count:
        await table.wait_changed()


@asynccontextmanager
async def gateway(
    urls: list[str], tmp_path: Path, **overrides: Any
) -> AsyncIterator[RunningGateway]:
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models", **overrides)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        running: RunningGateway = await nursery.start(
            lambda task_status: serve_gateway(
                urls, settings, shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        with trio.fail_after(10):
            await all_up(running.table, len(urls))
        try:
            yield running
        finally:
            stop.set()


@asynccontextmanager
async def fleet(
    api_server: Any, tiny_gguf: Callable[..., Path], tmp_path: Path, count: int = 2,
    behaviour: SimulatedBehaviour = FAST, **options: Any,
) -> AsyncIterator[tuple[list[Any], RunningGateway]]:  # fmt: skip
    """``count`` hosts sharing one store (``tiny`` and ``other``), and a gateway for them."""
    async with AsyncExitStack() as stack:
        hosts = [
            await stack.enter_async_context(
                api_server(behaviour=behaviour, models={"other": tiny_gguf(seed=1)}, **options)
            )
            for _ in range(count)
        ]
        running = await stack.enter_async_context(gateway([h.url for h in hosts], tmp_path))
        yield hosts, running


async def first_token(lines: AsyncIterator[str]) -> None:
    """Read a native stream's lines up to its first token (past the load's progress)."""
    while not json.loads(await anext(lines)).get("response"):
        pass


def holders(hosts: list[Any], model: str) -> list[int]:
    return [i for i, h in enumerate(hosts) if any(r.name == model for r in h.scheduler.ps())]


async def test_alternating_models_each_load_on_exactly_one_host(
    api_server, tiny_gguf, tmp_path
) -> None:
    with trio.fail_after(30):
        async with fleet(api_server, tiny_gguf, tmp_path, count=3) as (hosts, gw):
            async with ollama.AsyncClient(host=gw.url) as client:
                for _ in range(3):
                    for model in ("tiny", "other"):
                        answer = await client.chat(
                            model, messages=[{"role": "user", "content": "hi"}]
                        )
                        assert answer.done
                listed = await client.ps()  # a request with no model: any host answers
                assert listed.models is not None
            loads = [h.engines.loads for h in hosts]
            assert sum(loads) == 2, loads
            assert len(holders(hosts, "tiny:latest")) == 1
            assert len(holders(hosts, "other:latest")) == 1
            assert gw.table.decisions == {"cold": 2, "warm": 4}


async def test_concurrent_first_requests_for_a_cold_model_load_it_once(
    api_server, tiny_gguf, tmp_path
) -> None:
    slow_load = SimulatedBehaviour(load_seconds=0.5, tokens_per_second=2000)
    with trio.fail_after(30):
        async with fleet(api_server, tiny_gguf, tmp_path, behaviour=slow_load) as (hosts, gw):
            answers = []

            async def ask(client: ollama.AsyncClient) -> None:
                answers.append(await client.generate("tiny", "hello"))

            async with ollama.AsyncClient(host=gw.url) as client, trio.open_nursery() as n:
                for _ in range(8):
                    n.start_soon(ask, client)
            assert len(answers) == 8
            assert all(a.done for a in answers)
            assert [h.engines.loads for h in hosts].count(1) == 1
            assert sum(h.engines.loads for h in hosts) == 1
            assert gw.table.decisions["cold"] == 1


async def test_hosts_with_a_fleet_secret_serve_the_gateway_alone(
    api_server, tiny_gguf, tmp_path
) -> None:
    secret = "fleet-secret-for-the-test"
    with trio.fail_after(30):
        async with api_server(behaviour=FAST, fleet_secret=secret) as host:
            async with httpx.AsyncClient(base_url=host.url) as direct:
                # Reached directly, the host serves nobody without the secret, any route.
                for path in ("/", "/api/version", "/api/tags", "/api/ps"):
                    assert (await direct.get(path)).status_code == 401, path
                wrong = {"x-ollamatrio-fleet-secret": "not-the-secret"}
                assert (await direct.get("/api/tags", headers=wrong)).status_code == 401
                right = {"x-ollamatrio-fleet-secret": secret}
                assert (await direct.get("/api/tags", headers=right)).status_code == 200
            async with gateway([host.url], tmp_path, fleet_secret=secret) as gw:
                # The gateway watches the host (/api/events, /api/ps) and forwards requests
                # with the secret; a client's own secret header is not passed on.
                async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
                    answer = await client.post(
                        "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False},
                        headers=wrong,
                    )  # fmt: skip
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["done"] is True
                    assert (await client.get("/api/ps")).json()["models"]


async def test_the_gateway_asks_for_its_own_keys_and_their_quotas(
    api_server, tiny_gguf, tmp_path
) -> None:
    state = tmp_path / "gateway-state"
    table = KeyStore.in_folder(state)
    _, user = table.create("user", ["inference"], Limits(rpm=2))
    _, ops = table.create("ops", ["admin"])
    generate = {"model": "tiny", "prompt": "hi", "stream": False}
    with trio.fail_after(30):
        async with (
            api_server(behaviour=FAST) as host,
            gateway([host.url], tmp_path, auth="required", data_dir=state) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=10) as client,
        ):
            assert (await client.get("/api/version")).status_code == 200  # open
            refused = await client.post("/api/generate", json=generate)
            assert refused.status_code == 401
            assert refused.json() == {"error": "unauthorized"}
            as_user = {"Authorization": f"Bearer {user}"}
            answer = await client.post("/api/generate", json=generate, headers=as_user)
            assert answer.status_code == 200, answer.text
            delete = {"model": "tiny"}
            forbidden = await client.request("DELETE", "/api/delete", json=delete, headers=as_user)
            assert forbidden.status_code == 403
            assert (await client.get("/api/tags", headers=as_user)).status_code == 200
            over = await client.get("/api/tags", headers=as_user)  # the third in a minute
            assert over.status_code == 429
            assert int(over.headers["retry-after"]) >= 1
            assert (await client.get("/api/tags", headers={"x-api-key": ops})).status_code == 200


async def test_the_gateway_charges_a_key_for_the_tokens_its_hosts_answered(
    api_server, tiny_gguf, tmp_path
) -> None:
    state = tmp_path / "gateway-state"
    table = KeyStore.in_folder(state)
    _, user = table.create("user", ["inference"], Limits(tpm=10))
    _, ops = table.create("ops", ["admin"])
    as_user = {"Authorization": f"Bearer {user}"}
    generate = {"model": "tiny", "prompt": "hi", "stream": True, "options": {"num_predict": 12}}
    with trio.fail_after(30):
        async with (
            api_server(behaviour=FAST) as host,
            gateway([host.url], tmp_path, auth="required", data_dir=state) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=10) as client,
        ):
            answer = await client.post("/api/generate", json=generate, headers=as_user)
            assert answer.status_code == 200
            final = json.loads(answer.text.splitlines()[-1])
            over = await client.post("/v1/chat/completions", headers=as_user, json={
                "model": "tiny", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
            assert over.status_code == 429  # its 12 generated tokens filled the minute's 10
            assert over.json()["error"]["type"] == "tokens"
            usage = await client.get("/api/usage", headers={"x-api-key": ops})
            assert usage.status_code == 200
            (used,) = [k for k in usage.json()["keys"] if k["name"] == "user"]
            assert used["since_start"]["generated_tokens"] == final["eval_count"] == 12
            assert used["since_start"]["prompt_tokens"] + used["since_start"][
                "prompt_tokens_reused"] == final["prompt_eval_count"]  # fmt: skip
            assert used["since_start"]["requests"] == 1


async def test_streaming_through_the_openai_sdk(api_server, tiny_gguf, tmp_path) -> None:
    with trio.fail_after(30):
        async with fleet(api_server, tiny_gguf, tmp_path) as (_hosts, gw):
            client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="ollama", max_retries=0)
            async with client:
                stream = await client.chat.completions.create(
                    model="other", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                pieces = [c async for c in stream]
                assert pieces[-1].choices[0].finish_reason == "stop"
                text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
                assert text.strip()
                missing = await client.models.retrieve("other")  # no body: the first host
                assert missing.id == "other"
                with pytest.raises(openai.NotFoundError):
                    await client.chat.completions.create(
                        model="nope", messages=[{"role": "user", "content": "hi"}]
                    )


async def test_a_client_that_leaves_mid_stream_frees_the_hosts_slot(
    api_server, tiny_gguf, tmp_path
) -> None:
    """One slot: the second request streams only if leaving freed the first one's slot."""
    slow = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=50)
    long = {"model": "tiny", "prompt": "go", "options": {"num_predict": 100_000}}
    with trio.fail_after(30):
        async with fleet(api_server, tiny_gguf, tmp_path, count=1, behaviour=slow,
                         num_parallel=1) as (hosts, gw):  # fmt: skip
            async with httpx.AsyncClient(base_url=gw.url, timeout=None) as client:
                async with client.stream("POST", "/api/generate", json=long) as response:
                    await first_token(response.aiter_lines())
                    assert hosts[0].scheduler.ps()[0].active == 1
                # The client left.  One slot: this streams only once that slot is free.
                with trio.fail_after(2):
                    async with client.stream("POST", "/api/generate", json=long) as response:
                        await first_token(response.aiter_lines())
                        assert hosts[0].scheduler.ps()[0].active == 1
            assert hosts[0].engines.loads == 1


async def test_a_saturated_host_spills_to_the_next_and_is_skipped_while_full(
    api_server, tiny_gguf, tmp_path
) -> None:
    """One slot and a queue of one per host.  The first stream takes the first host's slot;
    of the next two, one waits in its queue and the other is refused there (503) and spills
    to the second host; the fourth waits in the second host's queue.  Each waiting stream
    gets its tokens once the one ahead of it leaves."""
    slow = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=50)
    long = {"model": "tiny", "prompt": "go", "options": {"num_predict": 100_000}}
    with trio.fail_after(30):
        async with fleet(api_server, tiny_gguf, tmp_path, behaviour=slow, num_parallel=1,
                         max_queue=1) as (hosts, gw):  # fmt: skip
            streaming_send, streaming = trio.open_memory_channel[int](4)
            scopes = [trio.CancelScope() for _ in range(4)]

            async def hold(client: httpx.AsyncClient, index: int) -> None:
                with scopes[index]:
                    async with client.stream("POST", "/api/generate", json=long) as response:
                        assert response.status_code == 200
                        # Held: a dropped iterator's finalizer would close the connection.
                        lines = response.aiter_lines()
                        await first_token(lines)
                        streaming_send.send_nowait(index)
                        await trio.sleep_forever()

            async with httpx.AsyncClient(base_url=gw.url, timeout=None) as client:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hold, client, 0)
                    assert await streaming.receive() == 0
                    nursery.start_soon(hold, client, 1)
                    nursery.start_soon(hold, client, 2)
                    spilled = await streaming.receive()  # the second host's first stream
                    queued = 3 - spilled
                    nursery.start_soon(hold, client, 3)
                    while sum(gw.table.decisions.values()) < 5:  # the fourth is on its way
                        await gw.table.wait_changed()
                    scopes[0].cancel()  # its client leaves: the queued one gets the slot
                    assert await streaming.receive() == queued
                    scopes[spilled].cancel()
                    assert await streaming.receive() == 3
                    nursery.cancel_scope.cancel()
            assert [h.engines.loads for h in hosts] == [1, 1]
            assert gw.table.decisions == {"cold": 2, "warm": 3}


def test_a_host_that_refused_is_saturated_until_a_request_it_took_ends() -> None:
    table = HostTable(["http://127.0.0.1:9"])
    host = table.hosts["http://127.0.0.1:9"]
    with table.sending(host, "tiny:latest", "warm"):  # a request the host took
        with table.sending(host, "tiny:latest", "warm") as attempt:
            table.refused(host, attempt)
        assert host.view().saturated  # the refused request freed no place
    assert not host.view().saturated


async def test_create_and_delete_through_the_gateway_reach_the_shared_store(
    api_server, tiny_gguf, tmp_path
) -> None:
    """The official client's create: ``HEAD`` of the blob (404, no body), its upload, the
    create; then a delete (200, no body).  Both hosts see the result in their store."""
    with trio.fail_after(30):
        async with fleet(api_server, tiny_gguf, tmp_path) as (hosts, gw):
            async with ollama.AsyncClient(host=gw.url) as client:
                digest = await client.create_blob(tiny_gguf(seed=7))
                done = await client.create("made", files={"made.gguf": digest})
                assert done.status == "success"
                for host in hosts:
                    assert host.store.manifest_path("made").exists()
                await client.delete("made")
                for host in hosts:
                    assert not host.store.manifest_path("made").exists()


SYSTEM = json.dumps({"gpus": [], "system": {"total": 64 << 30, "cpu_count": 2}})


@asynccontextmanager
async def serve_process(models: Path) -> AsyncIterator[tuple[trio.Process, str]]:
    """``python -m ollamatrio serve`` with the simulated engine (20 tokens a second)."""
    env = {
        **os.environ,
        "OLLAMA_HOST": "127.0.0.1:0",
        "OLLAMA_MODELS": str(models),
        "OLLAMATRIO_ENGINE": "simulated",
        "OLLAMATRIO_SIMULATED_GPUS": SYSTEM,
        "OLLAMATRIO_SIMULATED_ENGINE": json.dumps(
            {"default": {"load_seconds": 0.05, "tokens_per_second": 20}}
        ),
    }
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "ollamatrio", "serve"], env=env, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    try:
        output = b""
        while (match := re.search(rb"Listening on (http://\S+)", output)) is None:
            chunk = await proc.stderr.receive_some()
            assert chunk, output.decode()
            output += chunk
        yield proc, match.group(1).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()
            await proc.stderr.aclose()


async def test_a_host_killed_mid_stream_ends_the_stream_with_an_error_line(
    api_server, tiny_gguf, tmp_path
) -> None:
    with trio.fail_after(60):
        async with api_server(behaviour=FAST) as other:  # imports tiny into the shared store
            async with serve_process(other.settings.models_dir) as (proc, url):
                async with gateway([url, other.url], tmp_path) as gw:
                    async with httpx.AsyncClient(timeout=None) as client:
                        # Load tiny on the process host, and wait for the gateway to see it.
                        loaded = await client.post(f"{url}/api/generate", json={"model": "tiny"})
                        assert loaded.status_code == 200
                        host = gw.table.hosts[url]
                        while model_key("tiny") not in host.view().loaded:
                            await gw.table.wait_changed()
                        body = {"model": "tiny", "prompt": "go", "options": {"num_predict": 10_000}}
                        async with client.stream("POST", f"{gw.url}/api/generate", json=body) as r:
                            lines = r.aiter_lines()
                            await first_token(lines)
                            proc.send_signal(signal.SIGKILL)
                            rest = [json.loads(line) async for line in lines]
                        assert "error" in rest[-1], rest[-3:]
                        assert "failed" in rest[-1]["error"]
                        # The next request goes to the host that is left.
                        while host.up:
                            await gw.table.wait_changed()
                        answer = await client.post(
                            f"{gw.url}/api/generate", json={**body, "options": {"num_predict": 3}}
                        )
                        assert answer.status_code == 200, answer.text
                        assert other.engines.loads == 1


async def test_no_host_up_is_a_503_in_the_dialects_shape(tmp_path) -> None:
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
    stop = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            gw: RunningGateway = await nursery.start(
                lambda task_status: serve_gateway(
                    ["http://127.0.0.1:9"],
                    settings,
                    shutdown_trigger=stop.wait,
                    task_status=task_status,
                )
            )
            async with httpx.AsyncClient(base_url=gw.url) as client:
                native = await client.post("/api/chat", json={"model": "tiny"})
                assert native.status_code == 503
                assert native.json() == {"error": "no host of the fleet is up"}
                oai = await client.post("/v1/chat/completions", json={"model": "tiny"})
                assert oai.json()["error"]["message"] == "no host of the fleet is up"
            stop.set()


def test_model_of_reads_only_a_json_objects_model_or_name() -> None:
    assert model_of(b'{"model": "a", "name": "b"}') == "a"
    assert model_of(b' {"name": "b"}') == "b"
    assert model_of(b'{"model": 3}') is None
    assert model_of(b"[1]") is None
    assert model_of(b"{broken") is None
    assert model_of(b"") is None


@pytest.mark.parametrize(
    ("path", "content_type", "start"),
    [
        ("/api/chat", b"application/x-ndjson", b'{"error":'),
        ("/v1/chat/completions", b"text/event-stream", b'data: {"error":'),
        ("/v1/messages", b"text/event-stream", b"event: error\ndata: "),
        ("/v1/responses", b"text/event-stream", b"event: error\ndata: "),
    ],
)
def test_error_lines_in_each_dialects_shape(path: str, content_type: bytes, start: bytes) -> None:
    line = error_line(path, content_type, "gone")
    assert line.startswith(start)
    assert line.endswith(b"\n")


async def test_the_gateway_command_serves_until_sigterm(api_server, tmp_path) -> None:
    with trio.fail_after(60):
        async with api_server(behaviour=FAST) as host:
            env = {**os.environ, "OLLAMA_HOST": "127.0.0.1:0"}
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "ollamatrio", "fleet", "gateway", host.url],
                env=env, stdout=subprocess.PIPE,
            )  # fmt: skip
            assert proc.stdout is not None
            try:
                output = b""
                ready = rb"ready: (http://\S+) \(1 of 1 hosts up\)"
                while (match := re.search(ready, output)) is None:
                    chunk = await proc.stdout.receive_some()
                    assert chunk, output.decode()
                    output += chunk
                async with ollama.AsyncClient(host=match.group(1).decode()) as client:
                    assert (await client.generate("tiny", "hi")).done
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()
                    await proc.stdout.aclose()


def test_the_gateway_command_refuses_a_bad_host_address() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ollamatrio", "fleet", "gateway", "ftp://x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr == "Error: not a host address (http://HOST:PORT): 'ftp://x'\n"


async def test_an_unloaded_model_is_no_longer_warm_within_a_second(
    api_server, tiny_gguf, tmp_path
) -> None:
    with trio.fail_after(30):
        async with fleet(api_server, tiny_gguf, tmp_path, count=1) as (hosts, gw):
            host = gw.table.hosts[hosts[0].url]
            async with ollama.AsyncClient(host=gw.url) as client:
                await client.generate("tiny", "hi")
                while model_key("tiny") not in host.view().loaded:
                    await gw.table.wait_changed()
                await client.generate("tiny", "", keep_alive=0)
                with trio.fail_after(1):
                    while model_key("tiny") in host.view().loaded:
                        await gw.table.wait_changed()


async def test_fleetwide_ps_metrics_and_events(api_server, tiny_gguf, tmp_path) -> None:
    with trio.fail_after(30):
        async with fleet(api_server, tiny_gguf, tmp_path) as (hosts, gw):
            async with httpx.AsyncClient(timeout=10) as client:
                async with client.stream("GET", f"{gw.url}/api/events") as events:
                    lines = events.aiter_lines()
                    for model in ("tiny", "other"):
                        body = {"model": model, "prompt": "hi", "stream": False}
                        answer = await client.post(f"{gw.url}/api/generate", json=body)
                        assert answer.status_code == 200
                    # A second copy of tiny, loaded behind the gateway's back.
                    holder = holders(hosts, "tiny:latest")[0]
                    other = hosts[1 - holder]
                    body = {"model": "tiny", "prompt": "hi", "stream": False}
                    assert (await client.post(f"{other.url}/api/generate", json=body)).is_success
                    seen: list[dict[str, Any]] = []
                    while sum(e["event"] == "loaded" for e in seen) < 3:
                        line = await anext(lines)
                        if line.startswith("data: "):
                            seen.append(json.loads(line[6:]))
                assert {e["host"] for e in seen} == {h.url for h in hosts}
                assert all("replica" in e and "node" in e for e in seen)
                while gw.table.duplicate_loads < 1:
                    await gw.table.wait_changed()

                ps = (await client.get(f"{gw.url}/api/ps")).json()["models"]
                rows = sorted((r["name"], r["replica"]) for r in ps)
                assert rows == sorted(
                    [("tiny:latest", hosts[0].url), ("tiny:latest", hosts[1].url),
                     ("other:latest", hosts[holders(hosts, "other:latest")[0]].url)]
                )  # fmt: skip
                assert all(r["node"] == r["replica"] for r in ps)  # no Ray: the address

                metrics = (await client.get(f"{gw.url}/metrics")).text
                assert 'ollamatrio_fleet_routing_decisions_total{kind="cold"} 2.0' in metrics
                assert "ollamatrio_fleet_duplicate_loads_total 1.0" in metrics, metrics
                assert "ollamatrio_fleet_hosts_up 2.0" in metrics
                for host in hosts:
                    assert f'host="{host.url}"' in metrics


async def test_a_cold_model_goes_to_a_host_whose_free_memory_fits_it(
    api_server, tiny_gguf, tmp_path
) -> None:
    """One host says (``/api/ps``) it has less free memory than the model's predicted size
    (its GGUF header in the shared store): a cold model goes to the other one, even when the
    rendezvous hash prefers the small one."""
    models = {f"m{i}": tiny_gguf() for i in range(16)}  # one file, many names
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            small = await stack.enter_async_context(api_server(models=models, system={
                "total": 16 << 20, "cpu_count": 2,
            }))  # fmt: skip
            big = await stack.enter_async_context(api_server(models=models))
            size = await SizePredictor(settings).predict("m0")
            assert size is not None
            assert 16 << 20 < size < 64 << 30
            # A name whose hash puts the small host first.
            name = next(
                n for n in models
                if rendezvous_score(model_key(n), small.url)
                > rendezvous_score(model_key(n), big.url)
            )  # fmt: skip
            gw = await stack.enter_async_context(gateway([small.url, big.url], tmp_path))
            seen = gw.table.hosts[big.url]
            before = seen.free_memory
            assert before is not None
            assert sum(before) == 64 << 30
            async with ollama.AsyncClient(host=gw.url) as client:
                assert (await client.generate(name, "hi")).done
            assert (small.engines.loads, big.engines.loads) == (0, 1)
            assert gw.table.decisions == {"cold": 1}
            # The host's free memory is read again after the load's events.
            while seen.free_memory == before:
                await gw.table.wait_changed()
            assert seen.free_memory is not None
            assert sum(seen.free_memory) < sum(before)


async def test_a_host_that_has_not_said_its_free_memory_fits_any_model() -> None:
    table = HostTable(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    said, silent = table.hosts.values()
    said.resync({"models": [], "free_memory": [{"device": "host", "free": 1000}]})
    silent.resync({"models": [], "free_memory": "not a list"})
    said.up = silent.up = True
    assert said.free_memory == (1000,)
    assert silent.free_memory is None
    names = [f"m{i}" for i in range(16)]
    for name in names:  # too big for the host that said: the silent one first
        assert [c.host for c in table.choose(name, size=2000)] == [silent.name, said.name]
        assert table.choose(name, size=2000)[0].kind == "cold"
    # When both fit, the hash decides, so each host comes first for some model.
    firsts = {table.choose(name, size=500)[0].host for name in names}
    assert firsts == {said.name, silent.name}
    assert table.needs_size("m0")
    said.models["m0"] = "ready"
    assert not table.needs_size("m0")
