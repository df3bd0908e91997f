"""Seeded, bounded soaks of the real server with real llama.cpp runner processes.

The traffic is ``ollamatrio.testing.soak`` (the mix of ``scripts/soak.py``, smaller):
generate, chat, embed, the OpenAI routes, streaming or not, random keep_alive and num_ctx,
disconnects and ``/api/ps`` polls, over two tiny chat models with room for two runners.
``/api/ps`` must answer throughout; afterwards the scheduler's books must be empty and
short keep-alives must run out on their own, without another request to wake the
scheduler.
"""

from __future__ import annotations

import random

import httpx
import trio

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.scheduler import Scheduler
from ollamatrio.testing.soak import Soak, run_clients


async def books_settle(sched: Scheduler, seconds: float = 10.0) -> None:
    """Wait (bounded) until no request holds or waits for anything."""

    def busy() -> bool:
        return bool(sched.waiting) or any(info.refs or info.queued for info in sched.ps())

    # The books have no event of their own to wait on: poll, bounded.
    with trio.move_on_after(seconds):
        while busy():  # noqa: ASYNC110
            await trio.sleep(0.05)
    assert sched.waiting == 0
    assert sched.queue_depth() == {}
    assert [(i.name, i.refs, i.queued) for i in sched.ps() if i.refs or i.queued] == []


async def test_seeded_soak_with_real_runners(api_server, tiny_gguf) -> None:
    models = {"tiny2": tiny_gguf(seed=1, name="tiny2")}
    engines = ProcessEngineFactory(load_timeout=60)
    with trio.fail_after(240):
        async with api_server(
            engines=engines, models=models, max_loaded_models=2, num_parallel=2
        ) as srv:
            soak = Soak(
                srv.url, ["tiny", "tiny2"], ["tiny-embed"], requests=60, clients=6, seed=7,
                timeout=30, max_seconds=150,
            )  # fmt: skip
            ps_statuses: list[int] = []

            async def poll_ps(done: trio.Event) -> None:
                async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
                    while not done.is_set():
                        ps_statuses.append((await client.get("/api/ps")).status_code)
                        await trio.sleep(0.2)

            done = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll_ps, done)
                await run_clients(soak)
                done.set()
            assert set(ps_statuses) == {200}  # also while models load and unload
            assert len(soak.results) == 60
            assert [r for r in soak.results if r.outcome == "timeout"] == []
            assert soak.undesigned_5xx() == []
            failed = [r for r in soak.results if r.outcome in ("stream_error", "transport")]
            assert failed == []
            assert soak.count("ok") >= 40
            await books_settle(srv.scheduler)

            # Short keep-alives (0, 1 s, 2 s) run out by themselves: no request comes to
            # wake the scheduler.
            await trio.sleep(2.5)
            left = [(i.name, i.keep_alive) for i in srv.scheduler.ps()]
            assert all(keep_alive >= 60 for _, keep_alive in left), left


async def test_a_reload_is_not_starved_by_clients_the_old_runner_can_serve(api_server) -> None:
    """Four clients keep a runner loaded with num_ctx 256 busy (more than its two slots);
    an OpenAI request needs the default context, so the runner must be reloaded.
    The evicted runner takes no new requests, so the reload happens within seconds instead
    of whenever the four clients happen to pause together."""
    engines = ProcessEngineFactory(load_timeout=60)
    with trio.fail_after(120):
        async with (
            api_server(engines=engines, num_parallel=2) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as client,
        ):
            stop = trio.Event()

            async def busy(seed: int) -> None:
                rng = random.Random(seed)
                async with httpx.AsyncClient(base_url=srv.url, timeout=None) as own:
                    with trio.move_on_after(60):  # bounded, whatever happens
                        while not stop.is_set():
                            options = {"num_ctx": 256, "num_predict": rng.randint(16, 32)}
                            body = {"model": "tiny", "prompt": "hello", "options": options}
                            async with own.stream("POST", "/api/generate", json=body) as r:
                                assert r.status_code == 200
                                await r.aread()

            async with trio.open_nursery() as nursery:
                for seed in range(4):
                    nursery.start_soon(busy, seed)
                with trio.move_on_after(30):
                    while not [i for i in srv.scheduler.ps() if i.refs >= 2]:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                started = trio.current_time()
                r = None
                body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 8}  # fmt: skip
                with trio.move_on_after(40):
                    r = await client.post("/v1/chat/completions", json=body)
                waited = trio.current_time() - started
                stop.set()
            assert r is not None
            assert r.status_code == 200
            assert waited < 20, f"the reload waited {waited:.1f} s"
            await books_settle(srv.scheduler)
