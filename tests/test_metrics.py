"""``GET /metrics``: the server's own series and every ready runner's, read back with
prometheus-client's real text parser."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import test_scheduler
import trio
from prometheus_client.parser import text_string_to_metric_families

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.errors import RunnerError, RunnerStartError
from ollamatrio.observability.metrics import ServerMetrics

models = test_scheduler.models  # the sparse GB-sized models, as a fixture here too
req, scheduler, use = test_scheduler.req, test_scheduler.scheduler, test_scheduler.use
generate = test_scheduler.generate

GiB = 1 << 30

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample, keyed by (sample name, labels).  A name may appear in one family only,
    as the exposition format requires."""
    out: Samples = {}
    families: set[str] = set()
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"family {family.name} exposed twice"
        families.add(family.name)
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate sample {key}"
            out[key] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def matching(samples: Samples, name: str, **labels: str) -> dict[frozenset, float]:
    want = set(labels.items())
    return {k[1]: v for k, v in samples.items() if k[0] == name and want <= k[1]}


async def scrape(client: httpx.AsyncClient) -> Samples:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(r.text)


@asynccontextmanager
async def serving(api_server: Any, *load: str) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """A simulated-engine server and a client, with the ``load`` models loaded."""
    with trio.fail_after(30):
        async with (
            api_server() as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=10) as client,
        ):
            for model in load:  # an empty request only loads
                path = "/api/embed" if model.endswith("-embed") else "/api/generate"
                assert (await client.post(path, json={"model": model})).is_success
            yield srv, client


def metrics_of(srv: Any) -> ServerMetrics:
    metrics = srv.app.extensions["ollamatrio"].metrics
    assert isinstance(metrics, ServerMetrics)
    return metrics


async def test_requests_tokens_and_runner_series_move(api_server) -> None:
    async with serving(api_server) as (_, c):
        before = await scrape(c)
        assert value(before, "ollamatrio_runners", state="ready") == 0
        assert value(before, "ollamatrio_runners", state="loading") == 0

        options = {"num_predict": 5}
        r = await c.post("/api/generate", json={"model": "tiny", "prompt": "a b c",
                                                    "options": options})  # fmt: skip
        streamed = [json.loads(line) for line in r.text.splitlines()]
        chat = (await c.post("/api/chat", json={
                "model": "tiny", "stream": False, "options": {"num_predict": 3},
                "messages": [{"role": "user", "content": "hi there"}],
            })).json()  # fmt: skip
        v1 = (await c.post("/v1/chat/completions", json={
                "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
            })).json()  # fmt: skip
        emb = await c.post("/api/embed", json={"model": "tiny-embed", "input": "one two"})
        assert (await c.get("/api/tags")).status_code == 200
        assert (await c.get("/no/such/path-123")).status_code == 404
        assert (await c.get("/api/chat")).status_code == 405  # as Ollama: POST only
        assert (await c.post("/api/show", json={"model": "absent"})).status_code == 404
        blob = b"a blob"
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        assert (await c.post(f"/api/blobs/{digest}", content=blob)).status_code == 201
        after = await scrape(c)

    requests = "ollamatrio_requests_total"
    for endpoint in ("/api/generate", "/api/chat", "/v1/chat/completions", "/api/embed"):
        assert value(after, requests, endpoint=endpoint, status="200") == 1, endpoint
    assert value(after, requests, endpoint="/api/tags", status="200") == 1
    assert value(after, requests, endpoint="/metrics", status="200") == 1  # the first scrape
    assert value(after, requests, endpoint="other", status="404") == 1
    assert value(after, requests, endpoint="other", status="405") == 1
    assert value(after, requests, endpoint="/api/show", status="404") == 1
    # Served ahead of Quart, counted under the route's template as Quart counts it.
    assert value(after, requests, endpoint="/api/blobs/<digest>", status="201") == 1
    assert not any("path-123" in dict(k[1]).get("endpoint", "") for k in after)

    generated = streamed[-1]["eval_count"] + chat["eval_count"]
    generated += v1["usage"]["completion_tokens"]
    assert generated == 5 + 3 + 4
    assert value(after, "ollamatrio_tokens_generated_total", model="tiny:latest") == generated
    prompt = streamed[-1]["prompt_eval_count"] + chat["prompt_eval_count"]
    prompt += v1["usage"]["prompt_tokens"]
    assert value(after, "ollamatrio_prompt_tokens_total", model="tiny:latest") == prompt
    embed_prompt = emb.json()["prompt_eval_count"]
    assert value(after, "ollamatrio_prompt_tokens_total", model="tiny-embed:latest") == embed_prompt

    assert value(after, "ollamatrio_time_to_first_token_seconds_count", model="tiny:latest") == 3
    assert value(after, "ollamatrio_queue_wait_seconds_count") == 4  # 3 generations + embed
    assert value(after, "ollamatrio_loads_total", model="tiny:latest", result="ok") == 1
    assert value(after, "ollamatrio_loads_total", model="tiny-embed:latest", result="ok") == 1
    assert value(after, "ollamatrio_load_seconds_count") == 2
    assert value(after, "ollamatrio_runners", state="ready") == 2

    memory = "ollamatrio_memory_bytes"
    for kind in ("predicted", "measured"):
        assert value(after, memory, model="tiny:latest", device="cpu", kind=kind) > 0

    # The simulated runners' llama.cpp-shaped series, re-exported per model and mode.
    predicted = "llamacpp:tokens_predicted_total"
    assert value(after, predicted, model="tiny:latest", mode="generate") == generated
    assert value(after, predicted, model="tiny-embed:latest", mode="embedding") == 0
    assert value(after, "llamacpp:prompt_tokens_total", model="tiny:latest", mode="generate") > 0
    assert not matching(after, "ollamatrio_runner_scrape_errors_total")


async def test_a_failing_or_slow_runner_is_skipped_and_counted(api_server) -> None:
    async with serving(api_server, "tiny", "tiny-embed") as (srv, c):
        series = metrics_of(srv).runners
        series.timeout = 0.05
        series.ttl = 0.0
        fine = await scrape(c)
        assert matching(fine, "llamacpp:tokens_predicted_total", model="tiny:latest")

        engines = srv.engines.engines

        async def broken() -> str:
            raise RunnerError("lost the connection to the model runner")

        async def stuck() -> str:
            await trio.sleep_forever()
            raise AssertionError

        engines["tiny:latest"].metrics = broken
        cut = await scrape(c)
        engines["tiny-embed:latest"].metrics = stuck
        both = await scrape(c)

    errors = "ollamatrio_runner_scrape_errors_total"
    assert value(cut, errors, model="tiny:latest") == 1
    assert not matching(cut, "llamacpp:tokens_predicted_total", model="tiny:latest")
    assert matching(cut, "llamacpp:tokens_predicted_total", model="tiny-embed:latest")
    assert value(cut, "ollamatrio_runners", state="ready") == 2  # the rest is all there
    assert value(both, errors, model="tiny:latest") == 2
    assert value(both, errors, model="tiny-embed:latest") == 1
    assert not matching(both, "llamacpp:tokens_predicted_total")


async def test_a_burst_of_scrapes_costs_one_runner_round_trip(api_server) -> None:
    async with serving(api_server, "tiny") as (srv, c):
        engine = srv.engines.engines["tiny:latest"]
        calls = 0
        fetch = engine.metrics

        async def counted() -> str:
            nonlocal calls
            calls += 1
            await trio.sleep(0.05)  # long enough for the burst to overlap
            return await fetch()

        engine.metrics = counted
        metrics_of(srv).runners.ttl = 60.0
        metrics_of(srv).runners._fresh_until = -1.0  # as if the last fetch were stale
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(scrape, c)
        await scrape(c)
        assert calls == 1
        metrics_of(srv).runners.ttl = 0.0
        metrics_of(srv).runners._fresh_until = -1.0
        samples = await scrape(c)
        assert calls == 2
        assert matching(samples, "llamacpp:tokens_predicted_total", model="tiny:latest")


async def test_loads_and_evictions_by_reason(autojump_clock, models) -> None:
    behaviours = {
        "b": SimulatedBehaviour(load_seconds=2.0, fail_load="oom"),
        "c": SimulatedBehaviour(load_seconds=2.0, fail_load="error"),
        "e": SimulatedBehaviour(load_seconds=1.0, crash_after_tokens=1),
    }
    async with scheduler(behaviours=behaviours, max_loaded_models=1) as (sched, _, _):
        metrics = ServerMetrics(sched)
        for failing in ("b", "c"):
            with pytest.raises(RunnerStartError):
                await use(sched, req(models, failing))
        await use(sched, req(models, "a", keep_alive=60.0))
        await use(sched, req(models, "d", keep_alive=60.0))  # evicts a: count
        await trio.sleep(61)  # d expires
        await use(sched, req(models, "a", keep_alive=60.0))
        assert sched.unload(str(models["a"]))  # request
        await trio.sleep(1)
        with pytest.raises(RunnerError):
            await generate(sched, req(models, "e"))
        await trio.sleep(0.001)
        samples = parse((await metrics.render()).decode())

    loads = "ollamatrio_loads_total"
    assert value(samples, loads, model="a", result="ok") == 2
    assert value(samples, loads, model="d", result="ok") == 1
    assert value(samples, loads, model="e", result="ok") == 1
    assert value(samples, loads, model="b", result="oom") == 1
    assert value(samples, loads, model="c", result="error") == 1
    assert value(samples, "ollamatrio_load_seconds_count") == 4
    assert value(samples, "ollamatrio_load_seconds_sum") == pytest.approx(4.0, abs=0.05)
    evictions = "ollamatrio_evictions_total"
    assert value(samples, evictions, reason="count") == 1
    assert value(samples, evictions, reason="expired") == 1
    assert value(samples, evictions, reason="request") == 1
    assert value(samples, evictions, reason="crash") == 1
    assert value(samples, "ollamatrio_runners", state="ready") == 0


async def test_queue_depth_runner_states_and_memory_by_device(autojump_clock, models) -> None:
    gpu = {"id": "sim0", "total": 80 * GiB}
    slow = SimulatedBehaviour(load_seconds=10.0, vram_factor=1.2)
    async with scheduler(gpus=[gpu], default=slow, max_loaded_models=5) as (sched, _, _):
        metrics = ServerMetrics(sched)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(use, sched, req(models, "a"))
            await trio.sleep(1)
            loading = parse((await metrics.render()).decode())
        await use(sched, req(models, "b"))
        async with sched.lease(req(models, "a")) as lease:
            waited = lease.waited
            metrics.lease_taken(lease)
            ready = parse((await metrics.render()).decode())

    assert value(loading, "ollamatrio_queue_depth", model="a") == 3
    assert value(loading, "ollamatrio_runners", state="loading") == 1
    memory = "ollamatrio_memory_bytes"
    assert value(loading, memory, model="a", device="sim0", kind="predicted") > 0
    assert not matching(loading, memory, kind="measured")

    assert not matching(ready, "ollamatrio_queue_depth")
    assert value(ready, "ollamatrio_runners", state="ready") == 2
    predicted = value(ready, memory, model="a", device="sim0", kind="predicted")
    measured = value(ready, memory, model="a", device="sim0", kind="measured")
    assert measured > 1.1 * predicted  # the simulated runner takes 20 % more than booked
    assert waited == 0.0  # loaded: the fast path
    assert value(ready, "ollamatrio_queue_wait_seconds_count") == 1


async def test_a_real_runner_reexports_its_llamacpp_series(api_server) -> None:
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
        ):
            body = {"model": "tiny", "prompt": "hello", "raw": True, "stream": False,
                    "options": {"num_predict": 6, "ignore_eos": True}}  # fmt: skip
            r = await c.post("/api/generate", json=body)
            assert r.json()["eval_count"] == 6
            samples = await scrape(c)

    labels = {"model": "tiny:latest", "mode": "generate"}
    assert value(samples, "llamacpp:tokens_predicted_total", **labels) == 6
    assert value(samples, "llamacpp:prompt_tokens_total", **labels) > 0
    assert "llamacpp:requests_processing" in {k[0] for k in samples}
    assert value(samples, "ollamatrio_tokens_generated_total", model="tiny:latest") == 6
    assert value(samples, "ollamatrio_memory_bytes", model="tiny:latest", device="cpu",
                 kind="measured") > 0  # fmt: skip
    assert not matching(samples, "ollamatrio_runner_scrape_errors_total")
