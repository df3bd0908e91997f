"""End to end with real llama.cpp runner processes: the official client against real
hypercorn, the model a generated tiny GGUF or (slow) SmolLM2.  A client that disconnects
mid-stream must free the runner's llama.cpp slot, not only the lease."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
from pathlib import Path

import httpx
import ollama
import psutil
import pytest
import trio

from ollamatrio.engines.process import ProcessEngine, ProcessEngineFactory
from ollamatrio.store import import_gguf


def runner_of(srv, model: str):
    """The loaded engine (a runner client) of ``model``, from the scheduler's books."""
    (info,) = [i for i in srv.scheduler.ps() if i.name == model]
    return srv.scheduler.runner(info.model_path).engine


async def test_tiny_model_through_the_official_client(api_server) -> None:
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            options = {"num_predict": 8, "temperature": 0}
            resp = await c.generate("tiny", "hello", raw=True, options=options)
            assert resp.done
            assert 0 < resp.eval_count <= 8
            assert resp.done_reason in ("stop", "length")
            parts = [
                p
                async for p in await c.chat(
                    "tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
                    options={"num_predict": 6, "ignore_eos": True},
                )
            ]  # fmt: skip
            assert parts[-1].done
            assert parts[-1].eval_count == 6
            assert parts[-1].done_reason == "length"
            assert all(p.message.role == "assistant" for p in parts)
            ps = (await c.ps()).models
            assert [m.model for m in ps] == ["tiny:latest"]
            assert ps[0].size > 0


async def test_embeddings_from_a_runner(api_server) -> None:
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            resp = await c.embed("tiny-embed", ["one two", "three"])
            assert len(resp.embeddings) == 2
            for vector in resp.embeddings:
                assert len(vector) == 64
                assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-4)


async def test_one_runner_per_model_file_listed_under_the_name_asked_for(api_server) -> None:
    """Real runners: a chat model asked for embeddings is reloaded once in embedding mode
    and that runner serves chat and embeddings, listed once; a model made ``from`` it
    with another ``num_ctx`` reloads it and is listed under its own name with its own
    context; the unload answer comes when the model is off ``/api/ps``."""
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            await c.generate("tiny", "hello", raw=True, options={"num_predict": 2})
            resp = await c.embed("tiny", ["one two", "three"])
            assert len(resp.embeddings) == 2
            for vector in resp.embeddings:
                assert len(vector) == 64
                assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-4)
            chat = await c.chat("tiny", messages=[{"role": "user", "content": "hi"}],
                                options={"num_predict": 2})  # fmt: skip
            assert chat.done
            assert [m.model for m in (await c.ps()).models] == ["tiny:latest"]
            (info,) = srv.scheduler.ps()
            assert srv.scheduler.runner(info.model_path).spec.embedding
            assert info.context_length != 512
            assert (await c.show("tiny")).capabilities == ["completion"]

            async for _ in await c.create("tiny2", from_="tiny", parameters={"num_ctx": 512},
                                          stream=True):  # fmt: skip
                pass
            await c.generate("tiny2", "hello", raw=True, options={"num_predict": 2})
            assert [(m.model, m.context_length) for m in (await c.ps()).models] == [
                ("tiny2:latest", 512)
            ]
            await c.generate("tiny2", "", keep_alive=0)  # ollama stop
            assert (await c.ps()).models == []


@pytest.mark.slow
async def test_disconnect_frees_the_llama_cpp_slot(api_server, smollm2_path: Path) -> None:
    with trio.fail_after(240):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
            ) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as c,
        ):
            body = {
                "model": "smol",
                "prompt": "Write a very long story about a lighthouse keeper.",
                "options": {"num_predict": 4000, "ignore_eos": True, "temperature": 0},
            }
            async with c.stream("POST", "/api/generate", json=body) as r:
                seen = 0
                # Held until the block ends: an iterator left to the garbage collector is
                # closed by Trio's finalizer a moment later, which closes the connection
                # (llama.cpp then stops decoding, before the check below could see it run).
                lines = r.aiter_lines()
                async for line in lines:
                    obj = json.loads(line)
                    assert "error" not in obj
                    if "load_progress" in obj:  # the load, before any token
                        continue
                    seen += 1
                    if seen == 5:
                        break
                engine = runner_of(srv, "smol:latest")
                # The precondition: the runner is generating.  llama.cpp's own decode counter
                # says so (within a decode step: seconds when busy processes share the CPU).
                with trio.fail_after(30):
                    await decode_advances(engine)
            disconnected = trio.current_time()
            await lines.aclose()  # the connection is already closed: nothing left to do
            with trio.fail_after(0.5):
                runner = srv.scheduler.runner(engine.spec.model_path)
                await runner.wait_until(lambda: runner.refs == 0)
            # llama.cpp notices the closed connection at its next token and stops decoding.
            with trio.fail_after(2):
                await decode_stops(engine)
            assert trio.current_time() - disconnected < 0.2


async def decodes(engine: ProcessEngine) -> float:
    for line in (await engine.metrics()).splitlines():
        if line.startswith("llamacpp:n_decode_total "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("llamacpp:n_decode_total is not in the runner's metrics")


async def decode_advances(engine: ProcessEngine) -> None:
    """Return once the runner's decode count has grown (polls another process)."""
    first = await decodes(engine)
    while await decodes(engine) == first:  # noqa: ASYNC110
        await trio.sleep(0.02)


async def decode_stops(engine: ProcessEngine) -> None:
    """Return once two reads of the decode count 20 ms apart agree (a token of SmolLM2
    takes a few ms here, so a live generation moves it)."""
    last = await decodes(engine)
    while True:
        await trio.sleep(0.02)
        now = await decodes(engine)
        if now == last:
            return
        last = now


@pytest.mark.slow
async def test_smollm2_answers(api_server, smollm2_path: Path) -> None:
    with trio.fail_after(240):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
            ) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            resp = await c.generate(
                "smol", "The capital of France is", raw=True,
                options={"temperature": 0, "num_predict": 8},
            )  # fmt: skip
            assert "Paris" in resp.response
            chat = await c.chat(
                "smol", messages=[{"role": "user", "content": "Say hello."}],
                options={"temperature": 0, "num_predict": 16},
            )  # fmt: skip
            assert chat.message.content.strip()
            shown = await c.show("smol")
            assert "completion" in (shown.capabilities or [])
            assert shown.modelinfo["general.architecture"] == "llama"


def _demo_import():
    """``scripts/import_gguf.py`` as a module: the demo's own way to read its Modelfile."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "import_gguf.py"
    spec = importlib.util.spec_from_file_location("import_gguf", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
async def test_demo_model_answers_the_readme_question_briefly(
    api_server, smollm2_path: Path
) -> None:
    """SmolLM2 imported as ``scripts/demo`` does (``scripts/smollm2.Modelfile``) answers the
    README's curl question with Paris in a few tokens, whatever the seed; at Ollama's
    defaults it named Paris in only 3 of 8 tries and could run on for minutes."""
    module = _demo_import()
    _, create_args = module.modelfile_create_args(module.DEMO_MODELFILE)
    assert create_args["parameters"]["num_predict"] <= 128  # the worst case stays short
    with trio.fail_after(240):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=120)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            await trio.to_thread.run_sync(
                lambda: list(import_gguf(srv.store, "smollm2:135m", smollm2_path, **create_args))
            )
            question = [{"role": "user", "content": "What is the capital of France?"}]
            for seed in range(3):
                chat = await c.chat("smollm2:135m", messages=question, options={"seed": seed})
                assert "Paris" in chat.message.content, chat.message.content
                assert chat.done_reason == "stop"
                assert (chat.eval_count or 0) <= 24, chat.message.content


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("when", ["mid-stream", "before-the-first-byte"])
async def test_a_frozen_runner_fails_its_request_and_is_replaced(api_server, when: str) -> None:
    """SIGSTOP a runner: after the stall deadline (no bytes from it) the request fails with
    an error the client sees, the frozen process is killed (SIGTERM alone would wait for
    a SIGCONT) and the next request gets a new runner."""
    endless = {"num_predict": 100000, "ignore_eos": True, "temperature": 1.0}
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60, stall_timeout=1.0)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as c,
        ):
            body = {"model": "tiny", "prompt": "hello", "options": endless}
            r = await c.post("/api/generate", json={"model": "tiny"})  # load it
            assert r.status_code == 200, r.text
            frozen = runner_of(srv, "tiny:latest").pid
            started = trio.current_time()
            if when == "before-the-first-byte":
                os.kill(frozen, signal.SIGSTOP)
                r = await c.post("/api/generate", json={**body, "stream": False})
                assert r.status_code == 500
                error = r.json()["error"]
            else:
                lines = []
                async with c.stream("POST", "/api/generate", json=body) as r:
                    async for line in r.aiter_lines():
                        if not lines:
                            os.kill(frozen, signal.SIGSTOP)
                            started = trio.current_time()
                        lines.append(json.loads(line))
                assert r.status_code == 200
                assert len(lines) > 1
                assert all("error" not in obj for obj in lines[:-1])
                error = lines[-1]["error"]
            assert 1.0 <= trio.current_time() - started < 10
            assert "stopped responding: no output for 1s" in error
            assert not _alive(frozen)
            r = await c.post(
                "/api/generate",
                json={"model": "tiny", "prompt": "hi", "stream": False,
                      "options": {"num_predict": 4}},
            )  # fmt: skip
            assert r.status_code == 200, r.text
            assert runner_of(srv, "tiny:latest").pid not in (None, frozen)


async def test_logprobs_through_the_official_client_and_the_sdk(api_server) -> None:
    """Ollama's shapes (native) and OpenAI's (/v1), from llama.cpp's own probabilities.
    (A random-weights model often ends a token inside a UTF-8 sequence; llama.cpp then
    reports one probability for the text it completes, so there can be fewer entries than
    tokens.)"""
    import openai

    greedy = {"num_predict": 4, "temperature": 0, "ignore_eos": True}
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
            openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x") as sdk,
        ):
            resp = await c.generate(
                "tiny", "hello", raw=True, options=greedy, logprobs=True, top_logprobs=2
            )
            assert 1 <= len(resp.logprobs) <= resp.eval_count == 4
            for p in resp.logprobs:
                assert p.logprob <= 0
                assert len(p.top_logprobs) == 2
                # greedy: the chosen token is the most likely one
                assert p.logprob >= max(t.logprob for t in p.top_logprobs) - 1e-6

            parts = [
                p async for p in await c.chat(
                    "tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
                    options=greedy, logprobs=True,
                )
            ]  # fmt: skip
            streamed = [lp for p in parts for lp in (p.logprobs or ())]
            assert 1 <= len(streamed) <= 4
            assert all(not lp.top_logprobs for lp in streamed)  # none asked for

            chat = await sdk.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                temperature=0, logprobs=True, top_logprobs=1,
                extra_body={"options": {"ignore_eos": True}},
            )  # fmt: skip
            content = chat.choices[0].logprobs.content
            assert 1 <= len(content) <= 3
            assert all(len(t.top_logprobs) == 1 for t in content)

            text = await sdk.completions.create(
                model="tiny", prompt="hello", max_tokens=3, temperature=0, logprobs=2,
                extra_body={"options": {"ignore_eos": True}},
            )  # fmt: skip
            assert text.choices[0].logprobs is not None


def _long_chat(turns: int, words: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Tell me about topic {i}. " * words})
        messages.append({"role": "assistant", "content": "It is a fine topic. " * words})
    messages.append({"role": "user", "content": "What is the capital of France?"})
    return messages


async def test_a_chat_longer_than_the_context_drops_its_oldest_messages(api_server) -> None:
    """Ollama's chatPrompt: the oldest messages go, system messages and the latest stay;
    with truncate false, or a latest message that cannot fit, a 400 names num_ctx."""
    options = {"num_ctx": 256, "num_predict": 2, "temperature": 0}
    messages = _long_chat(turns=12, words=12)
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
        ):
            body = {"model": "tiny", "messages": messages, "stream": False, "options": options}
            r = await c.post("/api/chat", json=body)
            assert r.status_code == 200, r.text
            assert 0 < r.json()["prompt_eval_count"] <= 256

            r = await c.post("/api/chat", json={**body, "truncate": False})
            assert r.status_code == 400
            assert "num_ctx 256" in r.json()["error"]

            import openai

            async with openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x") as sdk:
                answer = await sdk.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=2,  # type: ignore[arg-type]
                    extra_body={"options": {"num_ctx": 256}},
                )  # fmt: skip
            assert 0 < answer.usage.prompt_tokens <= 256

            huge = [messages[0], {"role": "user", "content": "word " * 400}]
            r = await c.post("/api/chat", json={**body, "messages": huge})
            assert r.status_code == 400
            assert "latest message" in r.json()["error"]
            assert "num_ctx 256" in r.json()["error"]


@pytest.mark.slow
async def test_smollm2_answers_at_the_end_of_a_conversation_longer_than_its_context(
    api_server, smollm2_path: Path
) -> None:
    messages = _long_chat(turns=40, words=30)  # about 14,000 tokens
    options = {"num_ctx": 2048, "num_predict": 24, "temperature": 0}
    with trio.fail_after(300):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
            ) as srv,
            ollama.AsyncClient(host=srv.url, timeout=240) as c,
        ):
            resp = await c.chat("smol", messages=messages, options=options)
    assert "Paris" in resp.message.content
    assert resp.prompt_eval_count <= 2048


async def test_generate_returns_a_context_that_a_later_request_continues_from(
    api_server,
) -> None:
    """ollama-python's round trip: generate(..., context=r.context)."""
    greedy = {"num_predict": 3, "temperature": 0}
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            first = await c.generate("tiny", "hello there", options=greedy)
            assert first.context
            assert all(isinstance(t, int) for t in first.context)
            assert len(first.context) >= first.prompt_eval_count
            streamed = [p async for p in await c.generate(
                "tiny", "hello there", options=greedy, stream=True
            )]  # fmt: skip
            assert streamed[-1].context == first.context  # greedy: the same tokens
            assert all(not p.context for p in streamed[:-1])
            second = await c.generate("tiny", "and more", options=greedy, context=first.context)
            assert second.context[:2] == first.context[:2]  # one BOS, then the same start
            assert len(second.context) > len(first.context)
            assert second.prompt_eval_count > first.prompt_eval_count  # it read the past
            raw = await c.generate("tiny", "hi", raw=True, options=greedy)
            assert not raw.context  # as Ollama: none in raw mode


async def test_shift_lets_a_generation_run_past_the_context(api_server) -> None:
    """Ollama's default context shift: a generation that fills num_ctx goes on; with
    "shift": false it stops there (done_reason "length"), on a runner loaded that way."""
    # llama.cpp rounds the context up to 256 cells: 400 tokens overflow it.
    options = {
        "num_ctx": 64, "num_predict": 400, "ignore_eos": True, "temperature": 0, "num_thread": 1,
    }  # fmt: skip
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            ollama.AsyncClient(host=srv.url) as c,
        ):
            shifted = await c.generate("tiny", "hello", raw=True, options=options)
            assert shifted.eval_count == 400
            first = runner_of(srv, "tiny:latest")
            assert first.context_length <= 256
            assert first.spec.context_shift
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as raw:
                r = await raw.post("/api/generate", json={
                    "model": "tiny", "prompt": "hello", "raw": True, "stream": False,
                    "options": options, "shift": False,
                })  # fmt: skip
            stopped = r.json()
            assert stopped["done_reason"] == "length"
            assert stopped["eval_count"] < first.context_length
            second = runner_of(srv, "tiny:latest")
            assert second is not first  # a load-time choice: reloaded
            assert not second.spec.context_shift


async def test_a_generate_prompt_longer_than_the_context_is_cut_from_the_front(
    api_server,
) -> None:
    options = {"num_ctx": 64, "num_predict": 2, "temperature": 0, "num_thread": 1}
    body = {"model": "tiny", "prompt": "word " * 300, "raw": True, "stream": False,
            "options": options}  # fmt: skip
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
        ):
            r = await c.post("/api/generate", json=body)
            assert r.status_code == 200, r.text
            assert 0 < r.json()["prompt_eval_count"] <= 64
            r = await c.post("/api/generate", json={**body, "truncate": False})
            assert r.status_code == 400
            assert "num_ctx 64" in r.json()["error"]
