"""Log-probabilities: what the runner is asked for, and llama.cpp's answer in Ollama's shape."""

from __future__ import annotations

from ollamatrio.engines.llamacpp_wire import (
    ChatStream,
    CompletionStream,
    chat_request,
    completion_request,
    ollama_logprobs,
)
from ollamatrio.types import CompletionRequest, Message

PROB = {
    "id": 5, "token": "Paris", "bytes": [80, 97, 114, 105, 115], "logprob": -0.1,
    "top_logprobs": [
        {"id": 5, "token": "Paris", "bytes": [80, 97, 114, 105, 115], "logprob": -0.1},
        {"id": 9, "token": "Lyon", "bytes": [76, 121, 111, 110], "logprob": -2.5},
        {"id": 7, "token": "Nice", "bytes": [78, 105, 99, 101], "logprob": -4.0},
    ],
}  # fmt: skip


def test_requests_ask_for_at_least_the_chosen_token() -> None:
    plain = CompletionRequest(prompt="x")
    asked = CompletionRequest(prompt="x", logprobs=True)
    top = CompletionRequest(prompt="x", logprobs=True, top_logprobs=3)
    assert "n_probs" not in completion_request(plain, 2048)[1]
    assert completion_request(asked, 2048)[1]["n_probs"] == 1
    assert completion_request(top, 2048)[1]["n_probs"] == 3
    messages = [Message("user", "hi")]
    chat = CompletionRequest(messages=messages, logprobs=True)
    body = chat_request(chat, 2048, "m")[1]
    assert (body["logprobs"], body["top_logprobs"]) == (True, 1)
    assert "logprobs" not in chat_request(CompletionRequest(messages=messages), 2048, "m")[1]


def test_ollama_shape_drops_ids_and_keeps_only_the_alternatives_asked_for() -> None:
    (none,) = ollama_logprobs([PROB], 0)
    assert none == {"token": "Paris", "logprob": -0.1, "bytes": [80, 97, 114, 105, 115]}
    (two,) = ollama_logprobs([PROB], 2)
    assert [t["token"] for t in two["top_logprobs"]] == ["Paris", "Lyon"]
    assert "id" not in two["top_logprobs"][0]
    assert ollama_logprobs(None, 2) == ()


def test_completion_events_carry_logprobs_even_without_text() -> None:
    stream = CompletionStream(top_logprobs=1)
    (chunk,) = stream.feed({"content": "Paris", "completion_probabilities": [PROB]})
    assert chunk.logprobs[0]["token"] == "Paris"
    # a token that ends inside a UTF-8 sequence: no text yet, its probability all the same
    (partial,) = stream.feed({"content": "", "completion_probabilities": [PROB]})
    assert (partial.content, len(partial.logprobs)) == ("", 1)
    assert stream.feed({"content": "", "tokens": [0]}) == []  # prompt progress


def test_chat_deltas_carry_logprobs() -> None:
    stream = ChatStream(top_logprobs=0)
    event = {"choices": [{"delta": {"content": "Paris"}, "logprobs": {"content": [PROB]}}]}
    (chunk,) = stream.feed(event)
    assert chunk.logprobs == ({"token": "Paris", "logprob": -0.1, "bytes": PROB["bytes"]},)
