"""``/v1/responses`` end to end with real llama.cpp runners (SmolLM2) and the official
``openai`` SDK: one-piece and streamed answers, a stored conversation continued after a
server restart, rendered as ``/api/chat`` renders the whole history (same prompt tokens)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import trio

from ollamatrio.engines.process import ProcessEngineFactory

pytestmark = [
    pytest.mark.filterwarnings(f"ignore:Async generator '{module}\\.:ResourceWarning")
    for module in ("openai", "httpx2", "httpcore2")
]


async def test_smollm2_responses_across_a_restart(api_server, smollm2_path: Path) -> None:
    engines = ProcessEngineFactory(load_timeout=120)
    settings = {"temperature": 0, "max_output_tokens": 12}
    with trio.fail_after(300):
        async with api_server(engines=engines, models={"smol": smollm2_path}) as srv:
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x") as c:
                first = await c.responses.create(
                    model="smol", input="The capital of France is", **settings
                )
                assert first.output_text.strip()
                assert first.usage is not None
                assert first.usage.output_tokens > 0
                # Uncapped, so that it completes: the SDK's helper wants response.completed
                # (a capped answer ends with response.incomplete, as OpenAI's does).
                async with c.responses.stream(
                    model="smol", input="Say hello in one word.", temperature=0
                ) as stream:
                    streamed = await stream.get_final_response()
                assert streamed.status == "completed"
                assert streamed.output_text.strip()
        async with api_server(engines=engines, models={"smol": smollm2_path}) as srv:
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x") as c:
                assert (await c.responses.retrieve(first.id)).output_text == first.output_text
                second = await c.responses.create(
                    model="smol", previous_response_id=first.id, input="And of Italy?",
                    # Unloaded after: /api/chat then starts from an empty prompt cache.
                    extra_body={"keep_alive": 0}, **settings,
                )  # fmt: skip
                assert second.output_text.strip()
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as raw:
                chat = await raw.post("/api/chat", json={
                    "model": "smol", "stream": False,
                    "options": {"temperature": 0, "num_predict": 12},
                    "messages": [
                        {"role": "user", "content": "The capital of France is"},
                        {"role": "assistant", "content": first.output_text},
                        {"role": "user", "content": "And of Italy?"},
                    ],
                })  # fmt: skip
    assert second.usage is not None
    assert second.usage.input_tokens == chat.json()["prompt_eval_count"]
    assert second.usage.input_tokens > first.usage.input_tokens
