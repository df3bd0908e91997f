"""Fair share and priority through the HTTP API: the principal is the client's address, the
priority an ``X-Priority`` header or a body field, checked with a 400 in each dialect."""

from __future__ import annotations

import httpx
import pytest
import trio

from ollamatrio.engines.simulated import SimulatedBehaviour

LONG_PROMPT = "word " * 2000  # 2,500 tokens by the estimate: a coding agent's prompt
SLOW = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=100, prompt_tokens_per_second=1e7)


def client(url: str, address: str) -> httpx.AsyncClient:
    """A client whose connections come from ``address`` (another loopback address is
    another principal while authentication is off)."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=url, transport=transport, timeout=60)


@pytest.mark.parametrize("fair", [True, False])
async def test_a_second_clients_short_request_is_not_behind_the_first_clients_queue(
    api_server, fair: bool
) -> None:
    body = {"model": "tiny", "stream": False, "options": {"num_predict": 30}}
    with trio.fail_after(60):
        async with (
            api_server(behaviour=SLOW, num_parallel=1, fair_share=fair) as srv,
            client(srv.url, "127.0.0.1") as agent,
            client(srv.url, "127.0.0.2") as user,
        ):
            await agent.post("/api/generate", json={"model": "tiny"})  # loaded
            done: list[str] = []

            async def long(i: int) -> None:
                r = await agent.post("/api/generate", json={**body, "prompt": LONG_PROMPT})
                assert r.status_code == 200, r.text
                done.append(f"long{i}")

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(long, i)
                while srv.scheduler.waiting < 5:  # noqa: ASYNC110 - one generating, five waiting
                    await trio.sleep(0.01)
                r = await user.post("/api/generate", json={**body, "prompt": "hi?"})
                assert r.status_code == 200, r.text
                done.append("short")
    # Each long answer takes 0.3 s: with fair share the short one is served after the one
    # generating; first come, first served, after all six.
    assert done.index("short") <= 1 if fair else done.index("short") == 6, done


async def test_priority_header_and_body_field_are_checked_in_each_dialect(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            chat = {
                "model": "tiny",
                "stream": False,
                "messages": [{"role": "user", "content": "x"}],
            }
            r = await c.post("/api/chat", json=chat, headers={"X-Priority": "urgent"})
            assert r.status_code == 400
            assert r.json() == {
                "error": "invalid priority 'urgent': expected one of interactive, batch"
            }
            r = await c.post("/v1/chat/completions", json={**chat, "priority": 3})
            assert r.status_code == 400
            assert r.json()["error"]["type"] == "invalid_request_error"
            assert "invalid priority 3" in r.json()["error"]["message"]
            r = await c.post("/api/embed", json={"model": "tiny-embed", "input": "x"},
                             headers={"X-Priority": "later"})  # fmt: skip
            assert r.status_code == 400
            # Valid values, in either place; the body's wins over the header's.
            for headers, extra in (
                ({"X-Priority": "batch"}, {}),
                ({}, {"priority": "interactive"}),
                ({"X-Priority": "soon"}, {"priority": "batch"}),
            ):
                r = await c.post("/api/chat", json={**chat, **extra}, headers=headers)
                assert r.status_code == 200, r.text
                r = await c.post("/v1/chat/completions", json={**chat, **extra}, headers=headers)
                assert r.status_code == 200, r.text
            r = await c.post("/api/embed", json={"model": "tiny-embed", "input": "x"},
                             headers={"X-Priority": "batch"})  # fmt: skip
            assert r.status_code == 200, r.text
