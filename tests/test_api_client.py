"""The official ``ollama`` Python client (0.6.3) against real hypercorn on port 0.

Every client method the server offers is exercised once, streaming and not, so any
field the client's pydantic models require (a missing ``message``, ``models`` or
``model_info``, a timestamp that does not parse: each breaks the client) is checked.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
import trio

from ollamatrio.engines.simulated import SimulatedBehaviour

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@asynccontextmanager
async def running(api_server: Any, **options: Any) -> AsyncIterator[tuple[Any, ollama.AsyncClient]]:
    """A server and an official client for it (closed afterwards: no leaked sockets)."""
    async with api_server(**options) as srv, ollama.AsyncClient(host=srv.url) as c:
        yield srv, c


async def test_generate_blocking_and_streaming(api_server) -> None:
    with trio.fail_after(20):
        async with running(api_server) as (_srv, c):
            resp = await c.generate("tiny", "why is the sky blue?")
            assert resp.done
            assert resp.done_reason == "stop"
            assert resp.model == "tiny"
            assert resp.response.strip()
            assert resp.eval_count == 16
            assert resp.prompt_eval_count > 0
            assert isinstance(resp.total_duration, int)
            assert resp.total_duration > 0
            assert isinstance(resp.created_at, str)
            datetime.fromisoformat(resp.created_at)

            parts = [p async for p in await c.generate("tiny", "hello", stream=True)]
            assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
            assert "".join(p.response for p in parts).strip()
            assert parts[-1].eval_count == 16


async def test_generate_options_length_and_keep_alive(api_server) -> None:
    with trio.fail_after(20):
        async with running(api_server) as (srv, c):
            resp = await c.generate(
                "tiny", "count", options={"num_predict": 3, "mirostat": 1}, keep_alive=0.5
            )
            assert resp.done_reason == "length"
            assert resp.eval_count == 3
            assert srv.scheduler.ps()[0].keep_alive == 0.5


async def test_chat_blocking_and_streaming(api_server) -> None:
    with trio.fail_after(20):
        async with running(api_server) as (_srv, c):
            messages = [{"role": "user", "content": "hi"}]
            resp = await c.chat("tiny", messages=messages)
            assert resp.message.role == "assistant"
            assert resp.message.content.strip()
            assert resp.done
            assert resp.done_reason == "stop"

            parts = [p async for p in await c.chat("tiny", messages=messages, stream=True)]
            assert all(p.message.role == "assistant" for p in parts)
            assert parts[-1].done
            assert parts[-1].eval_count == 16


async def test_chat_load_and_unload(api_server) -> None:
    with trio.fail_after(20):
        async with running(api_server) as (srv, c):
            loaded = await c.chat("tiny", messages=[])
            assert loaded.done_reason == "load"
            assert [m.name for m in (await c.ps()).models] == ["tiny:latest"]
            unloaded = await c.chat("tiny", messages=[], keep_alive=0)
            assert unloaded.done_reason == "unload"
            await srv.scheduler.wait_idle()
            assert (await c.ps()).models == []


async def test_embed_and_legacy_embeddings(api_server) -> None:
    with trio.fail_after(20):
        async with running(api_server) as (_srv, c):
            resp = await c.embed("tiny-embed", ["first", "second"])
            assert len(resp.embeddings) == 2
            for vector in resp.embeddings:
                assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-6)
            assert resp.prompt_eval_count == 2

            single = await c.embed("tiny-embed", "one", dimensions=8)
            assert len(single.embeddings) == 1
            assert len(single.embeddings[0]) == 8

            legacy = await c.embeddings("tiny-embed", "hello")
            assert len(legacy.embedding) == 64


async def test_list_show_ps(api_server) -> None:
    with trio.fail_after(20):
        async with running(api_server) as (_srv, c):
            listed = await c.list()
            assert sorted(m.model for m in listed.models) == ["tiny-embed:latest", "tiny:latest"]
            for m in listed.models:
                assert isinstance(m.modified_at, datetime)
                assert m.size > 0
                assert m.details.family == "llama"
                assert m.details.format == "gguf"

            shown = await c.show("tiny")
            assert shown.modelinfo["general.architecture"] == "llama"
            assert shown.capabilities == ["completion"]
            assert isinstance(shown.modified_at, datetime)
            assert "<|im_start|>" in shown.template
            embed_caps = (await c.show("tiny-embed")).capabilities
            assert embed_caps == ["embedding"]

            assert (await c.ps()).models == []
            await c.generate("tiny", "x")
            loaded = (await c.ps()).models
            assert [m.model for m in loaded] == ["tiny:latest"]
            assert loaded[0].expires_at is not None
            assert loaded[0].size > 0
            assert loaded[0].context_length == 2048


async def test_ps_extra_fields_for_state_and_queue(api_server) -> None:
    """/api/ps adds state, queued, active and slots to each model; the client ignores them."""
    behaviour = SimulatedBehaviour(load_seconds=1.0, tokens_per_second=2000)
    with trio.fail_after(20):
        async with (
            running(api_server, behaviour=behaviour, num_parallel=1) as (srv, c),
            httpx.AsyncClient(base_url=srv.url) as raw,
        ):
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(c.generate, "tiny", "x")
                # Both requests wait for the one-second load.
                while sum(i.queued for i in srv.scheduler.ps()) < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                (shown,) = (await raw.get("/api/ps")).json()["models"]
                assert shown["name"] == "tiny:latest"
                assert {k: shown[k] for k in ("state", "queued", "active", "slots")} == {
                    "state": "loading", "queued": 2, "active": 0, "slots": 1,
                }  # fmt: skip
                (model,) = (await c.ps()).models
                assert model.model == "tiny:latest"
                assert model.expires_at is not None
            (shown,) = (await raw.get("/api/ps")).json()["models"]
            assert {k: shown[k] for k in ("state", "queued", "active", "slots")} == {
                "state": "ready", "queued": 0, "active": 0, "slots": 1,
            }  # fmt: skip


async def test_ps_says_the_free_memory_a_new_load_could_use_per_device(api_server) -> None:
    """/api/ps's top-level ``free_memory`` (for a fleet's gateway): each GPU, then the
    host's RAM, as the scheduler counts them; a load takes its share."""
    gpu = {"id": "sim0", "library": "CUDA", "total": 2 << 30, "compute": "8.6"}
    system = {"total": 8 << 30, "cpu_count": 2}
    with trio.fail_after(20):
        async with (
            running(api_server, gpus=[gpu], system=system) as (srv, c),
            httpx.AsyncClient(base_url=srv.url) as raw,
        ):
            before = (await raw.get("/api/ps")).json()["free_memory"]
            assert before == [
                {"device": "sim0", "free": 2 << 30},
                {"device": "host", "free": 8 << 30},
            ]
            await c.generate("tiny", "x")
            after = {
                row["device"]: row["free"]
                for row in (await raw.get("/api/ps")).json()["free_memory"]
            }
            assert after["sim0"] < 2 << 30
            assert after["host"] <= 8 << 30


async def test_copy_delete(api_server) -> None:
    with trio.fail_after(20):
        async with running(api_server) as (_srv, c):
            assert (await c.copy("tiny", "tiny-copy")).status == "success"
            assert "tiny-copy:latest" in [m.model for m in (await c.list()).models]
            assert (await c.delete("tiny-copy")).status == "success"
            with pytest.raises(ollama.ResponseError) as err:
                await c.delete("tiny-copy")
            assert err.value.status_code == 404
            with pytest.raises(ollama.ResponseError) as err:
                await c.copy("nope", "other")
            assert err.value.status_code == 404


async def test_create_blob_and_create(api_server, tiny_gguf, tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with running(api_server) as (srv, c):
            source = tiny_gguf(name="uploaded", seed=7)
            digest = await c.create_blob(source)
            assert srv.store.has_blob(digest)

            progress = [
                p.status
                async for p in await c.create(
                    "made", files={"model.gguf": digest}, system="be brief",
                    parameters={"temperature": 0.2, "stop": ["<|im_end|>"]}, stream=True,
                )
            ]  # fmt: skip
            assert progress[0] == "parsing GGUF"
            assert progress[-1] == "success"
            shown = await c.show("made")
            assert "SYSTEM be brief" in (shown.modelfile or "")
            assert "temperature" in (shown.parameters or "")

            derived = await c.create("derived", from_="made", system="be verbose")
            assert derived.status == "success"
            assert "SYSTEM be verbose" in ((await c.show("derived")).modelfile or "")
            resp = await c.generate("derived", "hi")
            assert resp.done


async def test_errors_are_response_errors(api_server) -> None:
    with trio.fail_after(20):
        async with running(api_server, behaviour=SimulatedBehaviour(load_seconds=0.01)) as (
            _srv,
            c,
        ):
            with pytest.raises(ollama.ResponseError) as err:
                await c.generate("missing", "hi")
            assert err.value.status_code == 404
            assert err.value.error == "model 'missing' not found"
            with pytest.raises(ollama.ResponseError) as err:
                await c.show("missing")
            assert (err.value.status_code, err.value.error) == (404, "model 'missing' not found")
            with pytest.raises(ollama.ResponseError) as err:
                await c.chat("tiny-embed", messages=[{"role": "user", "content": "x"}])
            assert err.value.status_code == 400
            assert err.value.error == '"tiny-embed" does not support chat'
